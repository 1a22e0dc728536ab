"""The gpuforge validator plugin (registered by validators/conftest.py): options, expected values,
hosts, containers per entrypoint mode, and the JSON report.

The same modules run against
  - an image (`--gpuforge-image IMAGE`): containers are started per mode through gpuforge.engine.containers,
  - `--gpuforge-host local://` (a GPU runner, or inside an image), or `ssh://user@host`.
Expected versions come from the target (`--gpuforge-target target.json`) plus `--gpuforge-expect k=v`
overrides, never from constants here. Each check's outcome, timing and facts go to a JSON report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from gpuforge.plan.schema import GPU_REQUESTS

HERE = Path(__file__).resolve().parent
REPO = HERE.parent  # the checkout: images/programs and gpuforge/image for local:// and ssh:// hosts


def pytest_addoption(parser):
    g = parser.getgroup("gpuforge")
    g.addoption("--gpuforge-image", help="image to validate (starts containers from it)")
    g.addoption("--gpuforge-host", help="validate an existing host: local://, ssh://user@host, docker://NAME")
    g.addoption("--gpuforge-target", help="expected versions as JSON (a target.json)")
    g.addoption("--gpuforge-expect", action="append", default=[], help="KEY=VALUE expected value (overrides)")
    g.addoption("--gpuforge-report", help="write the JSON report here")
    g.addoption("--gpuforge-gpu", action="store_true", help="run the GPU checks (containers get every GPU)")
    g.addoption("--gpuforge-gpu-request", choices=GPU_REQUESTS, default="nvidia",
                help="how containers ask for GPUs: nvidia (--gpus all, NVIDIA runtime) or cdi (--device nvidia.com/gpu=all)")
    g.addoption("--gpuforge-gpus", help="GPUs the runner was asked to give (a count, or 'all'); default: NVIDIA_VISIBLE_DEVICES, "
                "else every GPU of the runner")
    g.addoption("--gpuforge-ca", help="the build's CA bundle: its certificates must appear nowhere in the image")
    g.addoption("--gpuforge-timeout", type=int, default=180, help="seconds any one command may run")
    g.addoption("--gpuforge-min-busbw", type=float, default=None,
                help="minimum NCCL all-reduce bus bandwidth in GB/s (default: the GPU model's floor in the compat data)")
    g.addoption("--gpuforge-setuid-allow", default="", help="comma-separated setuid/setgid files that are expected")


# --- expected values -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class Expected:
    """What the image (or host) must contain: the target's target.json plus --gpuforge-expect overrides.

    Reading a value the target does not give fails the check that needs it, naming the option to pass.
    """

    id: str | None = None
    torch: str | None = None
    torchvision: str | None = None
    torchaudio: str | None = None
    triton: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    python: str | None = None
    os: str | None = None
    flavor: str | None = None
    source: str | None = None
    arch_list: tuple[str, ...] | None = None
    ptx: tuple[str, ...] = ()
    uid: int | None = None
    user: str | None = None
    size_budget_gb: float | None = None

    def __getattribute__(self, name: str):
        value = object.__getattribute__(self, name)
        if value is None and name in _FIELDS:
            pytest.fail(f"the target gives no expected {name!r}; pass --gpuforge-expect {name}=VALUE")
        return value

    def get(self, name: str, default=None):
        value = object.__getattribute__(self, name)
        return default if value is None else value

    def as_dict(self) -> dict:
        """The given values as the dict gpuforge.image.preflight takes (lists for the arch fields)."""
        out = {f: object.__getattribute__(self, f) for f in _FIELDS}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items() if v is not None}

    @classmethod
    def parse(cls, raw: dict[str, object], source: str) -> Expected:
        unknown = sorted(set(raw) - set(_FIELDS))
        if unknown:
            msg = f"{source}: unknown expected key(s) {', '.join(unknown)}; known: {', '.join(_FIELDS)}"
            raise pytest.UsageError(msg)
        out: dict[str, object] = {}
        for k, v in raw.items():
            try:
                if k in ("arch_list", "ptx"):
                    out[k] = tuple(v.split(",") if isinstance(v, str) else v)
                elif k == "uid":
                    out[k] = int(v)
                elif k == "size_budget_gb":  # keep 14 as 14 (the label reads "14"), accept 14.5
                    num = float(v)
                    out[k] = int(num) if num.is_integer() and "." not in str(v) else num
                else:
                    out[k] = str(v)
            except (TypeError, ValueError):
                msg = f"{source}: {k}={v!r} is not a valid {k}"
                raise pytest.UsageError(msg) from None
        return cls(**out)


_FIELDS = tuple(f.name for f in dataclasses.fields(Expected))


@pytest.fixture(scope="session")
def target(pytestconfig) -> Expected:
    """What the image (or host) must contain; from the matrix target, never retyped in a test."""
    raw: dict = {}
    path = pytestconfig.getoption("gpuforge_target")
    if path:
        raw.update(json.loads(Path(path).read_text()))
    for kv in pytestconfig.getoption("gpuforge_expect"):
        k, sep, v = kv.partition("=")
        if not sep:
            msg = f"--gpuforge-expect {kv!r}: use KEY=VALUE"
            raise pytest.UsageError(msg)
        raw[k] = v
    if not raw:
        pytest.exit("no expected values: pass --gpuforge-target or --gpuforge-expect", returncode=4)
    return Expected.parse(raw, path or "--gpuforge-expect")


# --- hosts -----------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def image(pytestconfig) -> str:
    img = pytestconfig.getoption("gpuforge_image")
    if not img:
        pytest.skip("needs an image (--gpuforge-image): this run validates an existing host")
    return img


@pytest.fixture(scope="session")
def gpu(pytestconfig) -> bool:
    return bool(pytestconfig.getoption("gpuforge_gpu"))


@pytest.fixture(scope="session")
def shared_container(pytestconfig, gpu):
    """One long-lived container for the read-only checks (started through the image's entrypoint)."""
    img = pytestconfig.getoption("gpuforge_image")
    if not img:
        yield None
        return
    from gpuforge.engine import containers as run

    with run.container(img, ["sleep", "infinity"], gpus=gpu, shm_size="2g" if gpu else None,
                       gpu_request=pytestconfig.getoption("gpuforge_gpu_request")) as c:
        yield c


@pytest.fixture(scope="session")
def host(pytestconfig, shared_container):
    """The testinfra host every checklist module talks to."""
    import testinfra

    spec = pytestconfig.getoption("gpuforge_host")
    if shared_container is not None:
        return testinfra.get_host(f"docker://{shared_container.id}")
    return testinfra.get_host(spec or "local://")


@pytest.fixture(scope="session")
def root_host(pytestconfig, shared_container):
    import testinfra

    if shared_container is not None:
        return testinfra.get_host(f"docker://root@{shared_container.id}")
    return testinfra.get_host(pytestconfig.getoption("gpuforge_host") or "local://")


@pytest.fixture(scope="session")
def is_image(pytestconfig) -> bool:
    return bool(pytestconfig.getoption("gpuforge_image"))


@pytest.fixture(scope="session")
def timeout(pytestconfig) -> int:
    return pytestconfig.getoption("gpuforge_timeout")


@pytest.fixture(scope="session")
def in_image(host) -> bool:
    return host.file("/opt/gpuforge/programs").is_directory


@pytest.fixture(scope="session")
def gpuforge_lib(host, in_image) -> str:
    """Where the host can import gpuforge.image from: the image's copy, or this checkout."""
    return "/opt/gpuforge/lib" if in_image else str(REPO)


RUNTIME_PROBE = """
import json, sys
out = {"python": "%d.%d" % sys.version_info[:2]}
try:
    import torch
    out.update(torch=torch.__version__, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
               nccl=".".join(map(str, torch.cuda.nccl.version())))
except Exception as e:
    out["torch"] = "import failed: %r" % e
for name in ("torchvision", "torchaudio", "triton"):
    try:
        out[name] = __import__(name).__version__
    except Exception as e:
        out[name] = "import failed: %r" % e
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def runtime_versions(host, facts, timeout) -> dict:
    """Versions as the running image reports them (imports, not labels or metadata): the truth that
    labels and the target are compared against."""
    from vutil import py

    v = py(host, RUNTIME_PROBE, timeout=timeout)
    facts["versions"] = v
    return v


@pytest.fixture(scope="session")
def constraints(target) -> dict[str, str]:
    """The target's pins as the host-side toolkit generated them (images/dist/<id>/constraints.txt)."""
    from packaging.requirements import Requirement

    from gpuforge import paths

    p = paths.dist() / str(target.id) / "constraints.txt"
    if not p.exists():
        pytest.fail(f"no host-side constraints for {target.id} at {p} (run `gpuforge generate`)")
    pins = {}
    for line in p.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            pins[req.name.lower().replace("_", "-")] = str(req.specifier).removeprefix("==")
    return pins


def listening(host, timeout: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket listening inside the host, from /proc/net/tcp{,6}."""
    from vutil import sh

    out = sh(host, "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null", timeout=timeout, check=False).stdout
    found = []
    for line in out.splitlines()[1:]:
        f = line.split()
        if len(f) > 3 and f[3] == "0A" and ":" in f[1]:  # 0A: LISTEN
            addr, port = f[1].rsplit(":", 1)
            loop = addr in ("0100007F", "00000000000000000000000001000000")
            anyaddr = set(addr) == {"0"}
            found.append(("loopback" if loop else "any" if anyaddr else addr, int(port, 16)))
    return sorted(set(found))


@pytest.fixture(scope="session")
def programs(host, in_image) -> str:
    """The in-image programs (smoke, inductor CPU, multi-GPU): the image's copy, or this checkout's."""
    return "/opt/gpuforge/programs" if in_image else str(REPO / "images" / "programs")


# --- the JSON report -------------------------------------------------------------------------------

_facts: dict = {}
_checks: list[dict] = []
_started = time.time()


@pytest.fixture(scope="session")
def facts() -> dict:
    """Measured values (versions, verdicts, smoke figures) that go into the report."""
    return _facts


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        msg = ""
        if rep.outcome == "failed":
            crash = getattr(rep.longrepr, "reprcrash", None)
            msg = str(crash.message if crash else rep.longrepr)[-2000:]
        elif rep.outcome == "skipped":
            msg = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        _checks.append({"id": item.nodeid, "module": item.module.__name__, "name": item.name,
                        "outcome": rep.outcome, "seconds": round(rep.duration, 3), "message": msg})


_deselected: list[str] = []


def pytest_deselected(items):
    _deselected.extend(i.nodeid for i in items)


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("gpuforge_report")
    if not path:
        return
    cfg = session.config
    report = {
        "target": _facts.get("target_id"),
        "image": cfg.getoption("gpuforge_image"),
        "host": cfg.getoption("gpuforge_host") or ("docker" if cfg.getoption("gpuforge_image") else "local://"),
        "gpu": bool(cfg.getoption("gpuforge_gpu")),
        "exit_status": int(exitstatus),
        "started": _started,
        "seconds": round(time.time() - _started, 2),
        "facts": _facts,
        "checks": _checks,
        # a narrowed run (-k, -m, --deselect) is marked; gpuforge.validate.evidence also checks every required id ran
        "selection": {"keyword": cfg.option.keyword or "", "markexpr": cfg.option.markexpr or "",
                      "deselected": sorted(_deselected),
                      "narrowed": bool(cfg.option.keyword or cfg.option.markexpr or _deselected)},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")


@pytest.fixture(scope="session", autouse=True)
def _record_target(target, facts, pytestconfig):
    facts["target_id"] = target.get("id")
    facts["expected"] = target.as_dict()
    img = pytestconfig.getoption("gpuforge_image")
    if img:
        from gpuforge.engine import client as engine

        attrs = engine.client().images.get(img).attrs
        facts["image_id"] = attrs["Id"]
        facts["repo_digests"] = sorted(attrs.get("RepoDigests") or [])
    yield


def pytest_configure(config):
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")


# --- entrypoint modes ------------------------------------------------------------------------------

class SshServer:
    """A container started in `ssh` mode with a key given at run time."""

    def __init__(self, running, key, user):
        import testinfra

        self.running, self.key, self.user = running, key, user
        self.port = running.port(22)
        self.root = testinfra.get_host(f"docker://root@{running.id}")


def _ssh_server(image: str, target: dict):
    import contextlib

    import paramiko

    from gpuforge.engine import containers as run

    @contextlib.contextmanager
    def start():
        key = paramiko.RSAKey.generate(2048)
        pub = f"{key.get_name()} {key.get_base64()} gpuforge-validator"
        with run.container(image, ["ssh"], user="root", env={"SSH_AUTHORIZED_KEYS": pub}, ports={22: None}) as c:
            c.wait_for_log(r"Server listening on", timeout=60)
            s = SshServer(c, key, target.user)
            # root gets the same valid key, so a root login attempt fails only if sshd itself refuses root
            r = s.root.run("install -d -m 0700 /root/.ssh && printf '%%s\\n' %s > /root/.ssh/authorized_keys "
                           "&& chmod 0600 /root/.ssh/authorized_keys", pub)
            assert r.rc == 0, f"cannot give root the test key: {r.stderr}"
            yield s

    return start()


@pytest.fixture(scope="session")
def ssh_server(image, target):
    with _ssh_server(image, target) as s:
        yield s


@pytest.fixture(scope="session")
def second_ssh_server(image, target):
    with _ssh_server(image, target) as s:
        yield s
