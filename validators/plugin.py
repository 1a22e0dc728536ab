"""The gpuforge validator plugin (registered by validators/conftest.py): options, expected values, the host,
containers per entrypoint mode, and the JSON report. Its state lives in one GpuforgePlugin per pytest run.

The same modules run against
  - an image (`--gpuforge-image IMAGE`): one long-lived container is started from it (and more per mode through
    gpuforge.engine.containers),
  - testinfra's own `--hosts` (one host: local://, ssh://user@host, docker://NAME, ...) with testinfra's connection
    options (--ssh-config, --ssh-identity-file, --sudo...). The `host` fixture is a testinfra host built by
    testinfra.get_host from those options, session-scoped: testinfra's module-scoped fixture parametrizes every
    test with its host, which would put the host into each check's id (the evidence compares ids across runs).
Expected versions come from the target (`--gpuforge-target target.json`, read with gpuforge.image.expected's
schema) plus `--gpuforge-expect k=v` overrides, never from constants here. Each check's outcome, timing and facts
go to a JSON report.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from gpuforge.grammar import GPU_REQUESTS
from gpuforge.image.expected import FIELDS, Expected, ExpectedError
from gpuforge.validate import selection

HERE = Path(__file__).resolve().parent
REPO = HERE.parent  # the checkout: images/programs and gpuforge/image for local:// and ssh:// hosts


def pytest_addoption(parser):
    g = parser.getgroup("gpuforge")
    g.addoption("--gpuforge-image", help="image to validate (starts containers from it; sets testinfra's --hosts)")
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
    g.addoption("--gpuforge-level", choices=("r1", "r2"), default=None,
                help="test_readiness.py's level: r1 the node's health and limits, r2 (default) those and each GPU's speed")
    g.addoption("--gpuforge-setuid-allow", default="", help="comma-separated setuid/setgid files that are expected")
    g.addoption("--gpuforge-list-checks", help="write every validator's node id and selection markers to this JSON file "
                "(what gpuforge computes a kind's required checks from); deselects nothing")


def pytest_configure(config):
    from gpuforge import options, paths
    from gpuforge.engine import containers

    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    # This pytest child is an entry point: it names its checkout (the one these validators live in) and takes the
    # run id gpuforge gave it (GPUFORGE_RUN_ID), once, for the modules below that label containers or read files.
    paths.use_root(Path(__file__).resolve().parent.parent)
    for line in selection.MARKER_HELP.values():
        config.addinivalue_line("markers", line)
    containers.use_run_id(options.resolve_one(options.SETTINGS["run_id"]).value)
    config.pluginmanager.register(GpuforgePlugin(config), "gpuforge-validators")


# --- expected values -------------------------------------------------------------------------------

class Target:
    """The expected values as the checks read them: `target.cuda` is the value, and a value the target does not
    give fails the check that needs it, naming the option to pass. `target.expected` is the typed record."""

    def __init__(self, expected: Expected):
        self.expected = expected

    def __getattr__(self, name: str):
        if name not in FIELDS:
            raise AttributeError(name)
        value = getattr(self.expected, name)
        if value is None:
            pytest.fail(f"the target gives no expected {name!r}; pass --gpuforge-expect {name}=VALUE")
        return value

    def get(self, name: str, default=None):
        value = getattr(self.expected, name)
        return default if value is None else value


def expected_from(path: str | None, expects: list[str]) -> Expected | None:
    """target.json (schema-checked) with --gpuforge-expect overrides; None when neither is given."""
    try:
        exp = Expected.load(path) if path else Expected()
        pairs = {}
        for kv in expects:
            k, sep, v = kv.partition("=")
            if not sep:
                msg = f"--gpuforge-expect {kv!r}: use KEY=VALUE"
                raise ExpectedError(msg)
            pairs[k] = v
        return exp.merged(pairs, "--gpuforge-expect") if pairs else (exp if path else None)
    except ExpectedError as e:
        raise pytest.UsageError(str(e)) from None


# --- the plugin ------------------------------------------------------------------------------------

class GpuforgePlugin:
    """One validator run: which host (testinfra's --hosts, or the container of --gpuforge-image), what is
    expected, and the report (facts measured, each check's outcome)."""

    def __init__(self, config):
        self.config = config
        self._image = config.getoption("gpuforge_image")
        self.user_hosts = config.option.hosts  # testinfra's --hosts; None in image mode
        if self._image and self.user_hosts:
            msg = "give either --gpuforge-image (gpuforge starts the container) or testinfra's --hosts, not both"
            raise pytest.UsageError(msg)
        if self.user_hosts and "," in self.user_hosts:
            msg = f"--hosts {self.user_hosts}: one host per validator run (its report is about one host)"
            raise pytest.UsageError(msg)
        self.expected = expected_from(config.getoption("gpuforge_target"), config.getoption("gpuforge_expect"))
        self._facts: dict = {}
        self.checks: list[dict] = []
        self.deselected: list[str] = []
        # which validators apply: decided from the target (flavor, source) and the run's GPUs, before anything runs
        self.kind = selection.Kind.of(self.expected, bool(config.getoption("gpuforge_gpu")))
        self.not_applicable: dict[str, str] = {}  # node id -> why it does not apply to this kind
        self.started = time.time()

    def _host(self, spec: str):
        """A testinfra host built the way testinfra's own fixture builds it (its connection options)."""
        import testinfra

        o = self.config.option
        return testinfra.get_host(spec, connection=o.connection, ssh_config=o.ssh_config,
                                  ssh_identity_file=o.ssh_identity_file, sudo=o.sudo, sudo_user=o.sudo_user)

    # --- fixtures --------------------------------------------------------------------------------

    @pytest.fixture(scope="session")
    def target(self) -> Target:
        """What the image (or host) must contain; from the matrix target, never retyped in a test."""
        if self.expected is None:
            pytest.exit("no expected values: pass --gpuforge-target or --gpuforge-expect", returncode=4)
        return Target(self.expected)

    @pytest.fixture(scope="session")
    def facts(self) -> dict:
        """Measured values (versions, verdicts, smoke figures) that go into the report."""
        return self._facts

    @pytest.fixture(scope="session")
    def image(self) -> str:
        if not self._image:
            pytest.skip("needs an image (--gpuforge-image): this run validates an existing host")
        return self._image

    @pytest.fixture(scope="session")
    def is_image(self) -> bool:
        return bool(self._image)

    @pytest.fixture(scope="session")
    def host_spec(self) -> str | None:
        """The host the user named (--hosts); None when gpuforge started the container."""
        return self.user_hosts

    @pytest.fixture(scope="session")
    def gpu(self) -> bool:
        return bool(self.config.getoption("gpuforge_gpu"))

    @pytest.fixture(scope="session")
    def timeout(self) -> int:
        return self.config.getoption("gpuforge_timeout")

    @pytest.fixture(scope="session")
    def shared_container(self, gpu):
        """One long-lived container for the read-only checks in image mode (started through the image's entrypoint)."""
        if not self._image:
            yield None
            return
        from gpuforge.engine import containers as run
        from gpuforge.errors import EngineError

        def start(memlock: int | None):
            return run.container(self._image, ["sleep", "infinity"], gpus=gpu, shm_size="2g" if gpu else None,
                                 memlock=memlock, gpu_request=self.config.getoption("gpuforge_gpu_request"))

        with contextlib.ExitStack() as stack:
            try:  # a GPU run asks for unlimited locked memory (pinned memory, NCCL), as NVIDIA's container docs do
                c = stack.enter_context(start(-1 if gpu else None))
            except EngineError as e:
                if "rlimit" not in str(e):
                    raise
                # an engine that may not raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE): its own limit, which r1 judges
                c = stack.enter_context(start(None))
            yield c

    @pytest.fixture(scope="session")
    def host(self, shared_container):
        """The testinfra host every checklist module talks to: the image's container, or --hosts (default local://)."""
        if shared_container is not None:
            return self._host(f"docker://{shared_container.id}")
        return self._host(self.user_hosts or "local://")

    @pytest.fixture(scope="session")
    def root_host(self, shared_container):
        if shared_container is not None:
            return self._host(f"docker://root@{shared_container.id}")
        return self._host(self.user_hosts or "local://")

    @pytest.fixture(scope="session", autouse=True)
    def _record_target(self, target):
        self._facts["target_id"] = target.get("id")
        self._facts["expected"] = target.expected.as_dict()
        if self._image:
            from gpuforge.engine import client as engine

            attrs = engine.client().images.get(self._image).attrs
            self._facts["image_id"] = attrs["Id"]
            self._facts["repo_digests"] = sorted(attrs.get("RepoDigests") or [])

    # --- the JSON report -------------------------------------------------------------------------

    # --- which validators apply ----------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session, config, items):
        """Deselect what does not apply to the target's kind (its markers against the kind, gpuforge.validate.selection):
        not a skip and not a narrowing of the run; the report lists them as not applicable. A listing run
        (--gpuforge-list-checks) writes every item's markers instead and deselects nothing."""
        marked = {i.nodeid: selection.marks_of(i.iter_markers()) for i in items}
        listing = config.getoption("gpuforge_list_checks")
        if listing:
            Path(listing).write_text(json.dumps(marked, indent=1, sort_keys=True) + "\n")
            return
        keep, drop = [], []
        for i in items:
            why = selection.not_applicable(marked[i.nodeid], self.kind)
            if why is None:
                keep.append(i)
            else:
                self.not_applicable[i.nodeid] = why
                drop.append(i)
        if drop:
            items[:] = keep
            config.hook.pytest_deselected(items=drop)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        rep = outcome.get_result()
        if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
            msg = ""
            if rep.outcome == "failed":
                crash = getattr(rep.longrepr, "reprcrash", None)
                msg = str(crash.message if crash else rep.longrepr)[-2000:]
            elif rep.outcome == "skipped":
                msg = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            check = {"id": item.nodeid, "module": item.module.__name__, "name": item.name,
                     "outcome": rep.outcome, "seconds": round(rep.duration, 3), "message": msg}
            typed = getattr(call.excinfo.value, "env_skip", None) if call.excinfo and rep.outcome == "skipped" else None
            if isinstance(typed, selection.EnvSkip):  # vutil.EnvSkipped: the reason the evidence reads, not the words
                check["skip"] = typed.value
            self.checks.append(check)

    def pytest_deselected(self, items):
        self.deselected.extend(i.nodeid for i in items if i.nodeid not in self.not_applicable)

    def pytest_sessionfinish(self, session, exitstatus):
        path = self.config.getoption("gpuforge_report")
        if not path:
            return
        o = self.config.option
        report = {
            "target": self._facts.get("target_id"),
            "image": self._image,
            "host": self.user_hosts or ("docker" if self._image else "local://"),
            "gpu": bool(self.config.getoption("gpuforge_gpu")),
            "exit_status": int(exitstatus),
            "started": self.started,
            "seconds": round(time.time() - self.started, 2),
            "facts": self._facts,
            "checks": self.checks,
            # a narrowed run (-k, -m, --deselect) is marked; gpuforge.validate.evidence also checks every required id ran.
            # What does not apply to the image's kind is listed apart: it narrows nothing.
            "selection": {"keyword": o.keyword or "", "markexpr": o.markexpr or "",
                          "deselected": sorted(self.deselected),
                          "narrowed": bool(o.keyword or o.markexpr or self.deselected),
                          "kind": self.kind.as_dict(),
                          "not_applicable": [{"id": i, "why": w} for i, w in sorted(self.not_applicable.items())]},
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")


# --- session-wide probes ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def in_image(host) -> bool:
    return host.file("/opt/gpuforge/programs").is_directory


@pytest.fixture(scope="session")
def gpuforge_lib(in_image) -> str:
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
    """The target's pins as the host-side toolkit generated them (images/dist/<id>/constraints.txt, and target.json's
    toolkit wheels)."""
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
    for pin in target.get("toolkit") or ():  # a devel image from wheels: the toolkit wheels it adds above torch's
        name, _, version = pin.partition("==")
        pins[name] = version
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
def programs(in_image) -> str:
    """The in-image programs (smoke, inductor CPU, multi-GPU): the image's copy, or this checkout's."""
    return "/opt/gpuforge/programs" if in_image else str(REPO / "images" / "programs")


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
