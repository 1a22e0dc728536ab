"""The longest-first order of `nox -s tests` names modules that exist: a moved module would silently lose its place
(and the workers' loads their balance)."""

from __future__ import annotations

from conftest import LONGEST_FIRST, ROOT


def test_every_longest_first_module_exists():
    missing = [m for m in LONGEST_FIRST if not (ROOT / m).is_file()]
    assert missing == [], f"tests/conftest.py LONGEST_FIRST names modules that are gone: {missing}"


def test_the_order_is_applied_to_collected_items():
    import conftest

    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    items = [Item("tests/unit/a.py::t"), Item(f"{LONGEST_FIRST[1]}::t1"), Item(f"{LONGEST_FIRST[0]}::t"),
             Item(f"{LONGEST_FIRST[1]}::t2")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [f"{LONGEST_FIRST[0]}::t", f"{LONGEST_FIRST[1]}::t1", f"{LONGEST_FIRST[1]}::t2",
                                         "tests/unit/a.py::t"]


def _workers() -> int:
    """noxfile.WORKERS, read without importing nox (the tests' venv has no nox)."""
    import ast

    tree = ast.parse((ROOT / "noxfile.py").read_text())
    [n] = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
           and any(getattr(t, "id", "") == "WORKERS" for t in node.targets)]
    return n


def test_the_engine_matrix_leaves_test_buildx_to_its_own_worker():
    """xdist gives each of the N workers one module, then hands a worker its next module while it has 2 or fewer tests
    pending: the engine matrix (first) must have at most 2 tests, so its worker takes module N+1, test_buildx, and runs
    it after, never beside it (tests/conftest.py)."""
    import ast

    workers = _workers()
    assert 2 <= workers < len(LONGEST_FIRST)
    assert LONGEST_FIRST[0].endswith("test_engine_matrix.py") and LONGEST_FIRST[workers].endswith("test_buildx.py")
    tree = ast.parse((ROOT / LONGEST_FIRST[0]).read_text())
    n = 0
    for f in (x for x in tree.body if isinstance(x, ast.FunctionDef) and x.name.startswith("test_")):
        params = [d for d in f.decorator_list if isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "parametrize"]
        n += len(params[0].args[1].elts) if params else 1
    assert n <= 2, f"the engine matrix has {n} tests: its worker would not take test_buildx next"
