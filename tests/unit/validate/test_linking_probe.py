"""linking_probe.py's choice of how to resolve a file: the loader's trace only for an x86-64 ELF with a PT_DYNAMIC
segment (a static executable handed to the loader is run by it: tini-static crashed so in a trial), ldd for another
class. Real host files and hand-made headers; the probe's whole run is validated in the image
(tests/integration/validate/test_broken_images.py's linking broken images)."""

from __future__ import annotations

import importlib.util
import shutil
import struct
import sys

import pytest

from gpuforge import paths

spec = importlib.util.spec_from_file_location("linking_probe", paths.validators() / "linking_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def _elf64(path, e_type: int, segments: list[int], machine: int = 62) -> str:
    """A little-endian ELF64 header with one program header per segment type."""
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HH", head, 16, e_type, machine)
    struct.pack_into("<Q", head, 32, 64)  # e_phoff
    struct.pack_into("<HH", head, 54, 56, len(segments))  # e_phentsize, e_phnum
    table = b"".join(struct.pack("<I", t) + bytes(52) for t in segments)
    path.write_bytes(bytes(head) + table)
    return str(path)


def test_a_dynamic_host_binary_is_traced_by_the_loader():
    assert probe.linkage(shutil.which("ls") or sys.executable) == "dynamic"


@pytest.mark.parametrize(("e_type", "segments", "want"), [
    (2, [1, 2, 3], "dynamic"),  # ET_EXEC with PT_LOAD, PT_DYNAMIC, PT_INTERP
    (3, [1, 2], "dynamic"),     # ET_DYN: a shared library
    (2, [1, 4], "static"),      # ET_EXEC without PT_DYNAMIC: a static executable, never given to the loader
    (1, [], "static"),          # ET_REL: an object file
])
def test_linkage_reads_the_program_headers(tmp_path, e_type, segments, want):
    assert probe.linkage(_elf64(tmp_path / "f", e_type, segments)) == want


def test_other_classes_and_non_elf_go_to_ldd(tmp_path):
    assert probe.linkage(_elf64(tmp_path / "arm", 3, [2], machine=183)) == "other"  # aarch64
    elf32 = tmp_path / "elf32"
    elf32.write_bytes(b"\x7fELF\x01\x01" + bytes(58))
    assert probe.linkage(str(elf32)) == "other"
    (tmp_path / "short").write_bytes(b"\x7fELF")
    assert probe.linkage(str(tmp_path / "short")) == "other"
