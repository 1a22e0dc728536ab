"""The longest-first order of `nox -s tests` names modules that exist: a moved module would silently lose its place
(and the two workers' loads their balance)."""

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
