"""Readiness level r1 (gpuforge/image/readiness.py): every rule, both ways, on NVML facts.

HEALTHY is what r1 collected on the lent H200, in a container of the shipped image that `gpuforge smoke --level r2`
started (tests/unit/image/data/h200-ready.json; docs/measurements/gpu-29.md says where and when). Each broken case
changes one fact the way a sick node or a broken image shows it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuforge.image import readiness

HEALTHY = {k: v for k, v in json.loads((Path(__file__).parent / "data" / "h200-ready.json").read_text()).items()
           if k not in ("speed", "seconds", "r1_seconds")}
BARS = readiness.bars()


def judge(facts: dict, request: int | None = 1, image_cuda: str = "12.6") -> dict[str, readiness.Finding]:
    found = readiness.judge(facts, request=request, image_cuda=image_cuda, bars=BARS)
    assert [f.check for f in found] == list(readiness.CHECKS)
    return {f.check: f for f in found}


def broken(**changes) -> dict:
    facts = copy.deepcopy(HEALTHY)
    gpu = facts["nvml"]["gpus"][0]
    for key, value in changes.items():
        if key in gpu:
            gpu[key] = value
        else:
            facts[key] = value
    return facts


def test_a_healthy_h200_is_ready():
    found = judge(HEALTHY)
    assert all(f.ok and not f.blame and not f.reason for f in found.values()), [f for f in found.values() if not f.ok]
    assert readiness.verdict(list(found.values())) == (f"READY r1: {len(readiness.CHECKS)} checks passed", 0)
    assert found["retired_pages"].figure == "GPU 0: not used (row remapping instead)"
    assert found["mig"].figure == "GPU 0: current 0, pending 0"


# (check, facts changed, words the reason must hold): every rule failing for its stated reason, blamed on the host
FAULTS = [
    ("gpus_seen", {"cuda": {"count": 0, "init_error": 100}, "visible": {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "all"}},
     ["asked for 1 GPU(s), CUDA sees 0, cuInit error 100", "CUDA_VISIBLE_DEVICES=''"]),
    ("gpus_seen", {"cuda": {"error": "OSError: libcuda.so.1: cannot open shared object file"}},
     ["the CUDA driver could not be asked", "libcuda.so.1"]),
    ("driver", {"nvml": {**HEALTHY["nvml"], "driver": "470.256.02"}}, ["cannot run CUDA 12.6", "needs >= 525.60.13"]),
    ("persistence", {"persistence": 0}, ["persistence mode is off"]),
    ("ecc_mode", {"ecc_mode": [0, 0]}, ["ECC is off"]),
    ("ecc_mode", {"ecc_mode": [1, 0]}, ["waits for a GPU reset"]),
    ("ecc_uncorrected", {"ecc_uncorrected": {"volatile": 2, "aggregate": 7}}, ["2 uncorrected ECC error(s)", "reset the GPU"]),
    ("row_remap", {"row_remap": {"correctable": 0, "uncorrectable": 1, "pending": 1, "failure": 0}},
     ["a row remapping waits for a GPU reset"]),
    ("row_remap", {"row_remap": {"correctable": 0, "uncorrectable": 9, "pending": 0, "failure": 1}},
     ["a row remapping failed: the GPU needs service"]),
    ("retired_pages", {"retired_pending": 1}, ["retired pages wait for a reboot"]),
    ("clocks", {"clock_events": 0x1 | 0x40}, ["clocks held down: hardware thermal slowdown"]),
    ("clocks", {"clock_events": 0x8 | 0x80}, ["hardware slowdown, hardware power brake"]),
    ("power_cap", {"power_w": {"limit": 500.0, "default": 700.0}}, ["power capped at 500 W", "default 700 W"]),
    ("mig", {"mig_mode": [1, 1]}, ["MIG is on"]),
    ("mig", {"mig_mode": [0, 1]}, ["a MIG change waits for a GPU reset"]),
    ("xid", {"xid": {"source": "/dev/kmsg", "events": [{"pci": "PCI:0000:00:06", "xid": 79}]}},
     ["XID errors since boot: 79 on PCI:0000:00:06"]),
    ("memlock", {"memlock": 65536}, ["locked memory limited to 64 KiB", "--ulimit memlock=-1"]),
    ("shm", {"shm": 64 << 20}, ["/dev/shm is 64 MiB", "bus error", "--shm-size"]),
    ("shm", {"shm": {"error": "FileNotFoundError: /dev/shm"}}, ["could not read /dev/shm's size"]),
]


@pytest.mark.parametrize(("check", "changes", "words"), FAULTS, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(FAULTS)])
def test_each_fault_fails_its_check_blamed_on_the_host(check, changes, words):
    found = judge(broken(**changes))
    f = found[check]
    assert not f.ok and f.blame == readiness.HOST
    for w in words:
        assert w in f.reason, f.reason
    assert [c for c, x in found.items() if not x.ok] == [check]  # one fault, one failed check
    line, code = readiness.verdict(list(found.values()))
    assert code == 10 and line.startswith("NODE NOT FIT (host): ") and f.reason in line


KMSG_CLOSED = {  # the error reading /dev/kmsg raised -> what the finding must say is missing
    "FileNotFoundError: [Errno 2] No such file or directory: '/dev/kmsg'": "/dev/kmsg is not in this container",
    "PermissionError: [Errno 1] Operation not permitted: '/dev/kmsg'": "takes CAP_SYSLOG (as root) or the host's "
                                                                       "kernel.dmesg_restrict=0",
}


@pytest.mark.parametrize("error", list(KMSG_CLOSED))
def test_an_unreadable_kernel_log_is_not_known_not_the_hosts_fault(error):
    """A container run without --device /dev/kmsg --cap-add SYSLOG cannot look: the node is not known unfit."""
    found = judge(broken(xid={"error": error}))
    f = found["xid"]
    assert f.ok and f.unknown and not f.blame and f.figure == "kernel log unreadable: XID errors not known"
    for words in (KMSG_CLOSED[error], "--device /dev/kmsg --cap-add SYSLOG --user 0", "dmesg_restrict=0", error):
        assert words in f.reason, f.reason
    line, code = readiness.verdict(list(found.values()))
    assert code == 0 and line.startswith(f"READY r1: {len(readiness.CHECKS) - 1} checks passed, 1 not known: xid: ")
    assert "NOT FIT" not in line and "(host)" not in line


def test_strict_makes_an_unknown_block_with_its_own_exit_code():
    found = {f.check: f for f in readiness.judge(broken(xid={"error": "FileNotFoundError: /dev/kmsg"}), request=1,
                                                 image_cuda="12.6", bars={**BARS, "unknown_blocks": True})}
    f = found["xid"]
    assert not f.ok and f.unknown and f.blame == readiness.UNKNOWN
    line, code = readiness.verdict(list(found.values()))
    assert code == readiness.UNKNOWN_EXIT == 12 and line.startswith("NOT SHOWN FIT (unknown; unknowns block here): xid: ")


def test_a_host_fault_beside_an_unknown_is_the_hosts_and_names_the_unknown_too():
    found = judge(broken(xid={"error": "FileNotFoundError: /dev/kmsg"}, memlock=65536))
    line, code = readiness.verdict(list(found.values()))
    assert code == 10 and line.startswith("NODE NOT FIT (host): memlock: ") and "; not known: xid: " in line
    found = judge(broken(xid={"error": "FileNotFoundError: /dev/kmsg"}, require_cuda="cuda>=13.0"))
    line, code = readiness.verdict(list(found.values()))
    assert code == 5 and line.startswith("IMAGE AT FAULT: require_cuda: ") and "; not known: xid: " in line


def test_the_compat_data_lets_an_unknown_pass_by_default():
    assert BARS["unknown_blocks"] is False


def test_benign_xids_pass_and_are_counted():
    found = judge(broken(xid={"source": "/dev/kmsg", "events": [{"pci": "PCI:0000:00:06", "xid": 13},
                                                               {"pci": "PCI:0000:00:06", "xid": 43}]}))
    assert found["xid"].ok and found["xid"].figure == "2 XID event(s) since boot (/dev/kmsg)"


def test_a_require_cuda_above_the_images_cuda_is_the_images_fault():
    found = judge(broken(require_cuda="cuda>=13.0"))
    f = found["require_cuda"]
    assert not f.ok and f.blame == readiness.IMAGE and "asks for cuda>=13.0, above the CUDA 12.6 it carries" in f.reason
    assert readiness.verdict(list(found.values()))[1] == 5
    # the host is judged first: an unfit node says nothing about the image
    found = judge(broken(require_cuda="cuda>=13.0", memlock=65536))
    assert readiness.verdict(list(found.values()))[1] == 10


def test_unlimited_memlock_and_a_large_finite_one_pass():
    assert judge(broken(memlock=-1))["memlock"].figure == "unlimited"
    assert judge(broken(memlock=8 << 30))["memlock"].ok


def test_without_nvml_every_gpu_check_fails_saying_so_once():
    found = judge(broken(nvml={"error": "NVMLError_LibraryNotFound: NVML Shared Library Not Found"}))
    gpu_checks = [c for c in readiness.CHECKS if c not in ("require_cuda", "xid", "memlock", "shm")]
    assert all(not found[c].ok and found[c].blame == readiness.HOST and "NVML could not be read" in found[c].reason
               for c in gpu_checks)
    line, code = readiness.verdict(list(found.values()))
    assert code == 10 and line.count("NVML could not be read") == 1 and line.startswith("NODE NOT FIT (host): gpus_seen, driver")


def test_a_gpu_fact_that_could_not_be_read_fails():
    found = judge(broken(persistence={"error": "NVMLError_NoPermission: Insufficient Permissions"}))
    assert not found["persistence"].ok and "could not read it (NVMLError_NoPermission" in found["persistence"].reason


def test_request_all_means_every_gpu_nvml_sees_and_more_than_seen_fails():
    assert judge(HEALTHY, request=None)["gpus_seen"].ok
    f = judge(HEALTHY, request=2)["gpus_seen"]
    assert not f.ok and "asked for 2 GPU(s), CUDA sees 1" in f.reason


def test_xid_lines_of_the_kernel_log_are_parsed():
    log = ("6,1234,5678,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1234, GPU has fallen off the bus.\n"
           "6,1235,5679,-;something else\n4,1236,5680,-;NVRM: Xid (PCI:0000:00:07): 13, Graphics Exception\n")
    assert readiness.xid_events(log) == [{"pci": "PCI:0000:00:06", "xid": 79}, {"pci": "PCI:0000:00:07", "xid": 13}]


def test_collect_never_raises_and_reports_what_it_could_not_read():
    facts = readiness.collect(env={"CUDA_VISIBLE_DEVICES": ""})
    assert facts["visible"] == {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": None}
    for key in ("nvml", "cuda", "xid", "memlock", "shm"):
        assert key in facts
    found = readiness.judge(facts, request=1, image_cuda="12.6", bars=BARS)
    assert [f.check for f in found] == list(readiness.CHECKS)


def test_a_node_with_no_gpu_is_never_ready():
    facts = broken(cuda={"count": 0, "init_error": 100})
    facts["nvml"]["gpus"] = []
    f = judge(facts, request=None)["gpus_seen"]
    assert not f.ok and f.blame == readiness.HOST and "no GPU is seen, CUDA sees 0" in f.reason


def test_an_unknown_image_cuda_fails_the_driver_check_instead_of_raising():
    f = judge(HEALTHY, image_cuda="")["driver"]
    assert not f.ok and f.blame == readiness.IMAGE and "the image's CUDA cannot be judged" in f.reason
