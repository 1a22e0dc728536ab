"""The system layer's key (gpuforge/builder/aptstate.py): read from the package indexes an InRelease lists, the same
for the same upstream state, another when a suite publishes other packages, the UTC date (one warning line) when an
index cannot be read; a bootstrapped base's apt sources name the same three suites.

Fixtures: tests/unit/fixtures/aptstate/*.InRelease are real InRelease files of deb.debian.org (bookworm and
bookworm-security, fetched 2026-12-06), cut to their header, the index lines of main and contrib for amd64 and arm64
(and a few others) and their signature."""

from __future__ import annotations

import datetime as dt
import urllib.error
from pathlib import Path

import pytest

from gpuforge.builder import aptstate, bases
from gpuforge.plan.matrix import load_matrix

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "aptstate"
SECURITY = (FIXTURES / "bookworm-security.InRelease").read_text()
RELEASE = (FIXTURES / "bookworm.InRelease").read_text()
DEFAULT = load_matrix().select(None)[0]  # the bootstrapped Debian 12 target
DAY = dt.date(2026, 12, 7)


def _mirror(texts: dict[str, str]):
    """A fetch that serves InRelease texts by suite name, and counts what it was asked."""
    asked: list[str] = []

    def fetch(url: str) -> str:
        asked.append(url)
        return texts[url.split("/dists/")[1].split("/")[0]]
    return fetch, asked


def _upstream(**changed: str) -> dict[str, str]:
    texts = {"bookworm": RELEASE, "bookworm-updates": RELEASE.replace("Codename: bookworm", "Codename: bookworm-updates"),
             "bookworm-security": SECURITY}
    return texts | changed


def test_the_uncompressed_index_of_each_component_is_read_from_the_sha256_list():
    assert aptstate.index_digests(SECURITY, ("main", "contrib"), "amd64") == {
        "main/binary-amd64/Packages": "b85a70a2faeb81845da9ed4a22a2f413d3c69371625f1fbbda7615428a4c977b",
        "contrib/binary-amd64/Packages": "c8688a4761aec8f6dfbab8f3941f383fc5ee72aaf0bdaaa3c43aac81d8c42c84"}
    # bookworm's InRelease lists MD5 sums first: only the SHA256 list counts
    assert aptstate.index_digests(RELEASE, ("main",), "arm64") == {
        "main/binary-arm64/Packages": "c7c883a61f348283050d3a754e7c8119117c4019bf65da804c78fdae315866f1"}


def test_a_compressed_index_stands_in_when_the_uncompressed_one_is_not_listed():
    text = "\n".join(ln for ln in SECURITY.splitlines() if not ln.endswith("main/binary-amd64/Packages"))
    assert aptstate.index_digests(text, ("main",), "amd64") == {
        "main/binary-amd64/Packages.xz": "37ce44ed35c564ad121583cb41ed7da6341e5caf210365502da07a294487c836"}


@pytest.mark.parametrize(("text", "words"), [
    (SECURITY, "lists no main/binary-riscv64/Packages index"),
    ("<html><body>Welcome to the hotel network</body></html>", "no SHA256 list"),
    ("", "no SHA256 list")])
def test_an_index_that_is_not_listed_is_an_error(text, words):
    with pytest.raises(ValueError, match=words):
        aptstate.index_digests(text, ("main",), "riscv64")


def test_the_default_target_reads_the_three_suites_of_its_bootstrapped_base():
    src = aptstate.sources(DEFAULT, "amd64")
    assert [s.inrelease for s in src.suites] == [
        "http://deb.debian.org/debian/dists/bookworm/InRelease",
        "http://deb.debian.org/debian/dists/bookworm-updates/InRelease",
        "http://deb.debian.org/debian-security/dists/bookworm-security/InRelease"]
    assert bases.apt_sources(DEFAULT.bootstrap) == (
        "deb http://deb.debian.org/debian bookworm main\n"
        "deb http://deb.debian.org/debian bookworm-updates main\n"
        "deb http://deb.debian.org/debian-security bookworm-security main\n")


def test_a_bootstrap_security_mirror_is_the_one_read_and_written(write_matrix):
    m = load_matrix(write_matrix("""\
        bases:
          debian12:
            bootstrap: {suite: bookworm, mirror: "http://mirror.example/debian",
                        security_mirror: "http://mirror.example/debian-security"}
        matrix:
          include:
            - {torch: "2.7.1", cuda: "12.6", python: "3.11", os: debian12, flavor: runtime, source: wheels}
        default: ["os=debian12"]
        """))
    [t] = m.targets
    assert [s.mirror for s in aptstate.sources(t, "amd64").suites] == [
        "http://mirror.example/debian", "http://mirror.example/debian", "http://mirror.example/debian-security"]
    assert "deb http://mirror.example/debian-security bookworm-security main\n" in bases.apt_sources(t.bootstrap)
    assert t.base_image != DEFAULT.base_image  # another recipe, another base


def test_ubuntu_targets_read_the_archive_and_the_security_host_or_the_ports_mirror():
    t = next(t for t in load_matrix().targets if t.os == "ubuntu24.04")
    amd = aptstate.sources(t, "amd64").suites
    assert [(s.mirror, s.name) for s in amd] == [
        ("http://archive.ubuntu.com/ubuntu", "noble"), ("http://archive.ubuntu.com/ubuntu", "noble-updates"),
        ("http://security.ubuntu.com/ubuntu", "noble-security")]
    assert all(s.components == ("main", "restricted", "universe", "multiverse") for s in amd)
    assert {s.mirror for s in aptstate.sources(t, "arm64").suites} == {"http://ports.ubuntu.com/ubuntu-ports"}
    assert aptstate.debian_arch("x86_64") == "amd64" and aptstate.debian_arch("aarch64") == "arm64"


def test_the_same_upstream_state_gives_the_same_value_on_every_resolve():
    src = aptstate.sources(DEFAULT, "amd64")
    fetch, asked = _mirror(_upstream())
    first = aptstate.resolve(src, fetch=fetch)
    assert first.value.startswith("index:") and len(first.value) == len("index:") + 24 and not first.fallback
    assert asked == [s.inrelease for s in src.suites]
    assert all(s.inrelease in first.source for s in src.suites)
    assert aptstate.resolve(src, fetch=_mirror(_upstream())[0]) == first
    # signed again (a new Date and Valid-Until, another signature) with the same packages: the same value
    again = SECURITY.replace("Sat, 05 Dec 2026", "Sun, 06 Dec 2026").replace("iQIzBAEBCAAd", "iQIzBAEBCAAe")
    assert aptstate.resolve(src, fetch=_mirror(_upstream(**{"bookworm-security": again}))[0]).value == first.value
    # an index the image reads changes (a security update published): another value
    moved = SECURITY.replace("b85a70a2faeb81845da9ed4a22a2f413d3c69371625f1fbbda7615428a4c977b", "0" * 64)
    assert aptstate.resolve(src, fetch=_mirror(_upstream(**{"bookworm-security": moved}))[0]).value != first.value
    # an index it does not read (contrib, another arch) changes: the same value
    other = SECURITY.replace("454c31039bf1a9255422999b2f74b0fe7ae83e89c7834432273745882b1d0849", "1" * 64)
    assert aptstate.resolve(src, fetch=_mirror(_upstream(**{"bookworm-security": other}))[0]).value == first.value


@pytest.mark.parametrize("failure", [urllib.error.URLError(OSError(-2, "Name or service not known")),
                                     urllib.error.HTTPError("http://x", 404, "Not Found", None, None),
                                     TimeoutError("timed out"), ValueError("lists no main/binary-amd64/Packages index")])
def test_an_unreadable_index_falls_back_to_the_utc_date_with_one_warning(failure, capsys):
    src = aptstate.sources(DEFAULT, "amd64")

    def fetch(url: str) -> str:
        if "security" in url:
            raise failure
        return RELEASE
    state = aptstate.resolve(src, fetch=fetch, today=DAY)
    assert state.value == "date:2026-12-07" and state.fallback
    assert "debian-security/dists/bookworm-security/InRelease" in state.source
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("gpuforge: warning: cannot read the apt indexes of debian12 (http://")
    assert "GPUFORGE_APT_STATE=date:2026-12-07" in err[0]
    # never a constant: the next day keys the layer again
    assert aptstate.resolve(src, fetch=fetch, today=DAY + dt.timedelta(days=1)).value == "date:2026-12-08"


def test_a_build_resolves_once_per_set_of_suites_and_a_pinned_value_resolves_nothing(capsys):
    targets = [t for t in load_matrix().targets if t.os == "debian12"]
    assert len(targets) == 2  # the default and its devel sibling: one base, one set of suites
    calls = []

    def resolve(src):
        calls.append(src)
        return aptstate.AptState(value="index:abc", source="a test")
    got = aptstate.for_targets(targets, "amd64", resolve=resolve)
    assert len(calls) == 1 and set(got) == {t.id for t in targets} and {s.value for s in got.values()} == {"index:abc"}
    assert capsys.readouterr().out == "gpuforge: apt state of debian12: GPUFORGE_APT_STATE=index:abc (a test)\n"
    pin = aptstate.pinned("date:2026-01-01", "GPUFORGE_APT_STATE")
    calls.clear()
    assert set(aptstate.for_targets(targets, "amd64", pinned=pin, resolve=resolve).values()) == {pin} and not calls
    assert "(pinned by GPUFORGE_APT_STATE)" in capsys.readouterr().out


def test_the_state_reaches_the_build_as_a_build_arg(tmp_path):
    from gpuforge.builder import runner
    from gpuforge.engine import client as engine
    from gpuforge.state.records import Records

    drv = engine.DRIVERS["buildx"](client="docker", client_version="28")
    opts = runner.BuildOptions(records=Records(tmp_path), log_dir=tmp_path)
    state = aptstate.AptState(value="index:0123456789abcdef01234567", source="a test")
    argv = runner.build_argv(drv, DEFAULT, tmp_path, tmp_path / "iid", opts, {}, apt=state)
    assert argv[argv.index("GPUFORGE_APT_STATE=index:0123456789abcdef01234567") - 1] == "--build-arg"
    assert argv[-1] == str(tmp_path)  # the context stays last


def test_a_state_pinned_by_hand_is_checked(monkeypatch):
    from gpuforge import options
    from gpuforge.errors import ConfigError

    monkeypatch.setenv("GPUFORGE_APT_STATE", "date:2026-12-07")
    assert options.resolve(command="build").stage(options.BuildSettings).apt_state == "date:2026-12-07"
    monkeypatch.setenv("GPUFORGE_APT_STATE", "x; rm -rf /")
    with pytest.raises(ConfigError, match="GPUFORGE_APT_STATE: 'x; rm -rf /' is not an apt state"):
        options.resolve(command="build")


def test_the_recipe_of_a_bootstrapped_base_names_its_security_mirror_and_sources():
    """The base's recipe (its tag and label) holds the security mirror and the rootfs shape that writes these
    sources (matrix.BOOTSTRAP_ROOTFS 3): a base bootstrapped before, with the suite alone, is not reused."""
    from gpuforge.plan import matrix

    assert DEFAULT.bootstrap["security_mirror"] == aptstate.DEBIAN_SECURITY and DEFAULT.bootstrap["rootfs"] == 3
    assert DEFAULT.base_image == matrix.bootstrap_tag("debian12", DEFAULT.bootstrap)
    before = {k: v for k, v in DEFAULT.bootstrap.items() if k != "security_mirror"} | {"rootfs": 2}
    assert matrix.bootstrap_tag("debian12", before) != DEFAULT.base_image
    assert bases.recipe_hash(before) != bases.recipe_hash(DEFAULT.bootstrap)
