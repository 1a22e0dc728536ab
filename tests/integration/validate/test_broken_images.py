"""Each validator fails, naming the problem, on a deliberately broken image: a thin image built on the default image
(a few Dockerfile lines), the one validator it breaks run on it. The table covers every validator module; a control
(a good fake host) shows the driver rows fail for the driver, not the fake. Apart from test_validators.py so that
`nox -s tests` can give the two modules to two workers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid

import pytest

from conftest import ROOT
from gpuforge.validate import plugins, report

pytestmark = pytest.mark.docker


SITE = "/opt/venv/lib/python3*/site-packages"
SSHD = "/etc/ssh/sshd_config.d/gpuforge.conf"
# (name, Dockerfile lines on top of the default image, validator selection, words the failure must name)
BROKEN = [
    ("root-user", ["USER root"], "test_metadata.py::test_default_user_is_not_root", "default user is root"),
    ("wrong-torch-label", ["LABEL io.gpuforge.torch=2.7.0+cu126"], "test_metadata.py::test_labels_match_the_matrix",
     "io.gpuforge.torch"),
    ("created-not-a-time", ["LABEL org.opencontainers.image.created=yesterday"], "test_metadata.py::test_oci_labels_present",
     "not an RFC 3339 date-time"),
    ("permit-root-login", ["USER root", "RUN sed -i 's/^PermitRootLogin no/PermitRootLogin yes/' /etc/ssh/sshd_config.d/gpuforge.conf",
                           "USER 1000"], "test_security.py::test_sshd_effective_settings", "permitrootlogin"),
    ("password-auth", ["USER root", "RUN sed -i 's/^PasswordAuthentication no/PasswordAuthentication yes/' /etc/ssh/sshd_config.d/gpuforge.conf",
                       "USER 1000"], "test_ssh.py::test_password_login_refused", "sshd offers"),
    ("host-key-baked", ["USER root", "RUN ssh-keygen -A", "USER 1000"], "test_security.py::test_no_ssh_host_keys_in_image",
     "SSH host keys baked"),
    ("no-compiler", ["USER root", "RUN rm -f /usr/bin/gcc* /usr/bin/g++* /usr/bin/x86_64-linux-gnu-gcc* /usr/bin/x86_64-linux-gnu-g++* /usr/bin/cc /usr/bin/c++",
                     "USER 1000"], "test_inductor_cpu.py::test_compile_succeeds", "compiler"),
    ("world-writable-path", ["USER root", "RUN mkdir -p /opt/drop && chmod 0777 /opt/drop", "ENV PATH=/opt/drop:$PATH", "USER 1000"],
     "test_security.py::test_path_has_no_world_writable_dir", "/opt/drop"),
    ("setuid", ["USER root", "RUN chmod u+s /usr/bin/find", "USER 1000"], "test_security.py::test_no_unexpected_setuid_files",
     "/usr/bin/find"),
    ("private-key", ["USER root", "RUN ssh-keygen -q -t ed25519 -N '' -f /etc/leaked_key", "USER 1000"],
     "test_security.py::test_no_private_keys_or_tokens", "/etc/leaked_key"),
    # the label says 2.7.0 but the image runs 2.7.1: caught against the running image, not the matrix
    ("label-lies-about-torch", ["LABEL io.gpuforge.torch=2.7.0+cu126"], "test_metadata.py::test_labels_match_the_running_image",
     "'io.gpuforge.torch': ('2.7.0+cu126', '2.7.1+cu126')"),
    ("nvidia-wheel-off-pin", ["USER root", f"RUN sed -i 's/^Version: .*/Version: 12.6.0/' {SITE}/nvidia_nvtx_cu12-*.dist-info/METADATA",
                              "USER 1000"], "test_versions.py::test_nvidia_wheels_match_the_constraints",
     "'nvidia-nvtx-cu12': ('12.6.0', '12.6.77')"),
    ("no-torchaudio", ["USER root", "RUN /opt/venv/bin/python -m pip uninstall -q -y torchaudio", "USER 1000"],
     "test_versions.py::test_torchaudio", "torchaudio: import failed"),
    ("inventory-without-torchvision", ["USER root", f"RUN rm -rf {SITE}/torchvision-*.dist-info", "USER 1000"],
     "test_inventory.py::test_inventory_lists_the_torch_stack", "torchvision missing from pip list"),
    # root holds a valid key (the validator installs it) and sshd allows root: the login must be tried and succeed
    ("root-login-with-key", ["USER root", f"RUN sed -i 's/^PermitRootLogin no/PermitRootLogin yes/' {SSHD}", "USER 1000"],
     "test_ssh.py::test_root_login_refused", "root logged in over ssh with a valid authorized key"),
    ("tcp-forwarding", ["USER root", f"RUN sed -i 's/^AllowTcpForwarding local/AllowTcpForwarding yes/' {SSHD}", "USER 1000"],
     "test_security.py::test_sshd_effective_settings", "'allowtcpforwarding': 'yes'"),
    ("nist-curves-and-sha1", ["USER root", f"RUN sed -i '/^HostKey/d;/^KexAlgorithms/d;/^MACs/d' {SSHD}", "USER 1000"],
     "test_ssh.py::test_ssh_audit_finds_no_failures", "ssh-audit fail items"),
    ("jupyter-empty-token", ["USER root", "RUN echo 'c.IdentityProvider.token = \"\"' >> /etc/jupyter/jupyter_server_config.py",
                             "USER 1000"], "test_jupyter.py::test_api_refused_without_or_with_a_wrong_token", "answered 200"),
    ("jupyter-token-on-command-line", ["USER root", "RUN sed -i 's|\"$app\" --config|\"$app\" --IdentityProvider.token=\"$JUPYTER_TOKEN\" --config|' "
                                       "/usr/local/bin/gpuforge-entrypoint", "USER 1000"],
     "test_jupyter.py::test_token_not_in_process_list_or_logs", "token is on a command line"),
    ("jupyter-extra-listener", ["USER root", "RUN sed -i 's|^start_jupyter() {|start_jupyter() {\\n    /opt/venv/bin/python -m http.server 9999 >/dev/null 2>\\&1 \\&|' "
                                "/usr/local/bin/gpuforge-entrypoint", "USER 1000"],
     "test_jupyter.py::test_only_the_server_port_listens", "listening beyond loopback"),
]


ENTRYPOINT = "/usr/local/bin/gpuforge-entrypoint"
JCONF = "/etc/jupyter/jupyter_server_config.py"
PIP_USER = "test_journeys.py::test_pip_install_as_the_user_offline[default-user]"
BROKEN += [  # the image's users: each journey's validator fails for its own reason
    ("login-path-unset", ["USER root", "RUN rm /etc/profile.d/gpuforge.sh", "USER 1000"],
     "test_journeys.py::test_login_shell_has_the_venv", "not the venv's"),
    ("ssh-login-path-unset", ["USER root", "RUN rm /etc/profile.d/gpuforge.sh", "USER 1000"],
     "test_journeys.py::test_ssh_pty_login_gets_the_image_environment", "not the venv's"),
    ("ssh-no-local-forwarding", ["USER root", f"RUN sed -i 's/^AllowTcpForwarding local/AllowTcpForwarding no/' {SSHD}", "USER 1000"],
     "test_journeys.py::test_ssh_local_forward_reaches_the_container_loopback", "administratively prohibited"),
    ("ssh-forward-anywhere", ["USER root", f"RUN sed -i '/^PermitOpen/d' {SSHD}", "USER 1000"],
     "test_journeys.py::test_ssh_forwarding_beyond_loopback_and_remote_refused", "(not loopback) was forwarded"),
    ("jupyter-lab-as-an-argument", ["USER root", f"RUN sed -i 's/^        lab | server) app=/        server) app=/' {ENTRYPOINT}", "USER 1000"],
     "test_journeys.py::test_jupyter_lab_as_the_command", "exited before"),
    ("jupyter-announcements-on", ["USER root", "RUN rm /etc/jupyter/labconfig/page_config.json", "USER 1000"],
     "test_journeys.py::test_jupyter_makes_no_outbound_calls", "announcements plugin enabled"),
    ("pip-blocked", ["USER root", "RUN sed -i 's/^include-system-site-packages = true/include-system-site-packages = false/' /opt/venv/pyvenv.cfg",
                     "USER 1000"], PIP_USER, "pip install as the user failed"),
    # as the user pip itself refuses to shadow the venv's torch; as root (a derived image) only the constraints stop it
    ("pip-unconstrained", ["ENV PIP_CONSTRAINT="], PIP_USER, "not by the image's constraints"),
    ("pip-unconstrained-root", ["ENV PIP_CONSTRAINT="], "test_journeys.py::test_pip_install_as_the_user_offline[root]",
     "pip swapped torch"),
    ("nb-prefix-ignored", ["USER root", f"RUN sed -i '/NB_PREFIX/d' {JCONF}", "USER 1000"],
     "test_journeys.py::test_kubeflow_notebook_contract", "not served under NB_PREFIX"),
    ("home-not-group-writable", ["USER root", "RUN chmod 0755 /home/gpuforge", "USER 1000"],
     "test_journeys.py::test_arbitrary_uid_with_gid_0", "not in the image's home"),
    ("no-privsep-dir", ["USER root", "RUN rmdir /run/sshd", "USER 1000"], "test_journeys.py::test_read_only_root_ssh",
     "exited waiting for /Server listening on/"),
    ("shm-unsaid", ["USER root", "RUN sed -i 's/\\*shm_lines()//' /opt/gpuforge/lib/gpuforge/image/preflight.py", "USER 1000"],
     "test_journeys.py::test_small_dev_shm_is_said_at_start", "warning was not said once"),
    ("jupyter-ipv4-only", ["USER root", f"RUN sed -i 's/^c.ServerApp.ip = .*/c.ServerApp.ip = \"0.0.0.0\"/' {JCONF}", "USER 1000"],
     "test_journeys.py::test_ssh_and_jupyter_answer_over_ipv6", "listens on IPv4 only"),
    # a server that calls out at start (as update checks and extension managers do): refused on a closed network, logged
    ("start-calls-out", ["USER root", "RUN printf '%s\\n' 'import urllib.request' 'try:' "
                         "'    urllib.request.urlopen(\"https://pypi.org/simple/\", timeout=2)' 'except Exception as e:' "
                         f"'    print(\"could not reach pypi.org:\", e, flush=True)' >> {JCONF}", "USER 1000"],
     "test_journeys.py::test_every_mode_starts_with_no_route_out_and_a_clean_log", "could not reach pypi.org"),
    ("metrics-down", ["USER root", "RUN printf 'raise SystemExit(3)\\n' > /opt/gpuforge/programs/metrics.py", "USER 1000"],
     "test_metrics.py::test_metrics_up_with_the_gpu_count", "exited before"),
]


def fake_smi(line: str) -> list[str]:
    """Dockerfile lines giving the image an nvidia-smi that reports `line` (the host the driver checks see),
    and a user who forced the start past the entrypoint's preflight: the validator must still refuse it."""
    return ["USER root", f"RUN echo '#!/bin/sh' > /usr/local/bin/nvidia-smi && echo 'echo \"{line}\"' >> /usr/local/bin/nvidia-smi "
            "&& chmod 755 /usr/local/bin/nvidia-smi", "ENV GPUFORGE_SKIP_DRIVER_CHECK=1", "USER 1000"]


BROKEN += [
    # a host driver too old for the image's CUDA 12.6 (R470 stops at CUDA 11.4)
    ("driver-too-old", fake_smi("0, Tesla T4, 7.5, 15109, 470.82.01"), "test_driver.py::test_driver_runs_the_image_cuda",
     "driver 470.82.01 cannot run CUDA 12.6"),
    # a Blackwell GeForce (sm_120) that the cu126 wheel has no kernels for
    ("gpu-not-in-arch-list", fake_smi("0, NVIDIA GeForce RTX 5090, 12.0, 32607, 575.57.08"),
     "test_driver.py::test_gpus_in_arch_list", "sm_120"),
]
KERNELS = "/opt/gpuforge/programs/smoke_kernels.py"
BROKEN += [  # the GPU smoke's compile steps, caught on the CPU box: the two failures the shipped image had
    # the kernel as it was: postponed annotations and no module-level `tl` (Triton 3.3.1 resolves `tl.constexpr` there)
    ("triton-kernel-postponed-annotations", ["USER root", f"RUN sed -i -e '1i from __future__ import annotations' "
                                             f"-e 's/^import triton.language as tl$/import triton.language/' {KERNELS}", "USER 1000"],
     "test_gpu_compile_cpu.py::test_smoke_triton_kernel_compiles_under_the_image_triton", "tl is not defined"),
    ("aoti-without-cuda-home", ["ENV CUDA_HOME="], "test_gpu_compile_cpu.py::test_aotinductor_cuda_wrapper_builds_and_links",
     "CUDA_HOME environment variable is not set"),
    ("aoti-without-crt-headers", ["USER root", "RUN rm -r /opt/gpuforge/cuda/include/crt", "USER 1000"],
     "test_gpu_compile_cpu.py::test_aotinductor_cuda_wrapper_builds_and_links", "crt/host_defines.h"),
    # the warm start's loader as it was: only torch 2.8's 5-argument binding, so torch 2.7.1 fell back to
    # aoti_load_package and every warm start paid 0.9 s importing its module
    ("warm-start-loader-as-it-was", ["USER root", "RUN sed -i '/\"direct (3 arguments)\"/d' /opt/gpuforge/programs/warm_start.py",
                                     "USER 1000"],
     "test_inductor_cpu.py::test_warm_start_opens_packages_with_the_direct_loader", "fell back to 'aoti_load_package'"),
    ("aoti-without-libcuda-to-link", ["USER root", "RUN rm /opt/gpuforge/cuda/lib64/libcuda.so", "USER 1000"],
     "test_gpu_compile_cpu.py::test_aotinductor_cuda_wrapper_builds_and_links", "cannot find -lcuda"),
]
NCCL_LIB = "/opt/venv/lib/python3*/site-packages/nvidia/nccl/lib"
BROKEN += [  # linked-library integrity
    ("lib-missing", ["USER root", f"RUN rm {SITE}/nvidia/nvjitlink/lib/libnvJitLink.so.12", "USER 1000"],
     "test_linking.py::test_every_elf_file_resolves_its_libraries", "libnvJitLink.so.12 not found"),
    # a NCCL network plugin (NCCL opens libnccl-net.so by name) with a symbol nothing defines: it loads lazily only
    ("lib-loads-lazily-only", ["USER root", "RUN printf 'void gf_gone(void);\\nint gf_use(void) { gf_gone(); return 0; }\\n' "
                               f"> /tmp/p.c && cd {NCCL_LIB} && gcc -shared -fPIC -o libnccl-net.so /tmp/p.c && rm /tmp/p.c",
                               "USER 1000"],
     "test_linking.py::test_gpu_libraries_load_lazily_and_eagerly", "load lazily, not eagerly"),
    # an "older cuDNN" (a stub reporting 8.9.7) put first on LD_LIBRARY_PATH, as a platform's environment can
    ("cudnn-shadowed", ["USER root", "RUN mkdir /opt/old-cudnn && printf 'int cudnnGetVersion(void) { return 8907; }\\n' > /tmp/c.c "
                        "&& gcc -shared -fPIC -Wl,-soname,libcudnn.so.9 -o /opt/old-cudnn/libcudnn.so.9 /tmp/c.c && rm /tmp/c.c",
                        "ENV LD_LIBRARY_PATH=/opt/old-cudnn:/usr/local/nvidia/lib:/usr/local/nvidia/lib64", "USER 1000"],
     "test_linking.py::test_nothing_shadows_the_venv_gpu_libraries", "/opt/old-cudnn/libcudnn.so.9 shadows"),
    ("broken-symlink", ["USER root", "RUN ln -s /opt/gone/python3 /usr/local/bin/python-gone", "USER 1000"],
     "test_linking.py::test_no_broken_symlinks", "/usr/local/bin/python-gone -> /opt/gone/python3"),
    # devel: a runtime image holds no CUDA compiler (the devel image's checks fail in test_devel_target.py)
    ("runtime-with-ptxas", ["USER root", f"RUN ln -s {SITE}/triton/backends/nvidia/bin/ptxas /usr/local/bin/ptxas", "USER 1000"],
     "test_devel.py::test_runtime_has_no_cuda_compiler", "a runtime image holds CUDA compiler parts"),
]
HEALTH = "/opt/gpuforge/programs/health.py"
HEALTH_CMD = '["/opt/venv/bin/python3", "-I", "-S", "/opt/gpuforge/programs/health.py"]'
UNHEALTHY = "test_health.py::test_unhealthy_once_its_server_stops_answering"
BROKEN += [  # the HEALTHCHECK: each one a check that would call a stopped server healthy, or none at all
    ("no-healthcheck", ["HEALTHCHECK NONE"], "test_health.py::test_the_image_declares_a_healthcheck", "declares no HEALTHCHECK"),
    # a probe every 30 s: a Jupyter ready at 20 s would be seen healthy at 50 s at best
    ("healthcheck-too-slow", [f"HEALTHCHECK --interval=30s CMD {HEALTH_CMD}"], "test_health.py::test_the_image_declares_a_healthcheck",
     "is not seen healthy by 30 s"),
    ("health-always-ok", ["USER root", f"RUN printf 'raise SystemExit(0)\\n' > {HEALTH}", "USER 1000"], f"{UNHEALTHY}[metrics]",
     "said healthy"),
    # the jpserver file and a live process taken for an answer: a stopped server has both
    ("health-jupyter-trusts-its-file", ["USER root", f"RUN sed -i 's/status, _ = _asked(f\"jupyter: GET/status, _ = 200, (f\"jupyter: GET/' {HEALTH}",
                                        "USER 1000"], f"{UNHEALTHY}[jupyter]", "said healthy"),
    # a TCP connect taken for an answer: the kernel completes the handshake for a stopped sshd
    ("health-ssh-connect-only", ["USER root", f"RUN sed -i 's/chunk = s.recv(256)/chunk = b\"SSH-2.0-\"/' {HEALTH}", "USER 1000"],
     f"{UNHEALTHY}[ssh]", "said healthy"),
    ("health-beside-unchecked", ["USER root", f"RUN sed -i 's/if mode != \"metrics\" and \"metrics_port\" in state:/if False:/' {HEALTH}",
                                 "USER 1000"], f"{UNHEALTHY}[metrics-beside]", "said healthy"),
    # a shell has nothing to ask: a check that asks anyway can only flap
    ("health-shell-asks", ["USER root", f"RUN sed -i 's/^SERVER_MODES = (\"jupyter\", /SERVER_MODES = (\"shell\", \"jupyter\", /' {HEALTH}",
                           "USER 1000"], "test_health.py::test_healthy_within_30_s_of_docker_run[shell]", "a probe failed where there is no server"),
]
# The smoke suite needs a GPU: its bars are proven by mutated reports (tests/unit), its device count on the H200.
# Readiness (test_readiness.py): each rule fails on the H200's recorded NVML facts and figures in
# tests/unit/image/test_readiness.py, its limits and NVIDIA_REQUIRE_CUDA on broken containers in test_readiness_cpu.py,
# and the five readiness faults on the H200 with the shipped image (docs/measurements/gpu-29.md).
GPU_HOST_ONLY = {"test_gpu_smoke", "test_readiness"}


def test_broken_image_table_covers_every_validator_module():
    modules = {p.stem for p in (ROOT / "validators").glob("test_*.py")}
    covered = {b[2].split(".py::")[0] for b in BROKEN}
    assert modules - GPU_HOST_ONLY <= covered, f"validator modules with no broken image: {sorted(modules - GPU_HOST_ONLY - covered)}"


def _validate_derived(engine, t, rec, tmp_path, lines: list[str], select: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Build `lines` on top of the default image, run the `select`ed validators on it: (pytest run, report)."""
    dockerfile = "\n".join([f"FROM {rec['image_id']}", *lines]) + "\n"
    # named: images.yml's clean-up (`docker image prune --filter label=io.gpuforge.target`, run by the act tests
    # beside this module) removes untagged images that carry the base's labels
    img, _ = engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, forcerm=True,
                                 labels={"io.gpuforge.test": "broken"}, tag=f"gpuforge-test/broken:{uuid.uuid4().hex[:12]}")
    try:
        target = tmp_path / "target.json"
        target.write_text(t.expected_json())
        out = tmp_path / "report.json"
        r = subprocess.run([sys.executable, "-m", "pytest", f"validators/{select}", *plugins.PLUGIN_ARGS, "-q",
                            "--rootdir", "validators", "--gpuforge-image", img.id, "--gpuforge-target", str(target),
                            "--gpuforge-report", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={**os.environ, **plugins.PLUGIN_ENV})
        return r, json.loads(out.read_text())
    finally:
        engine.images.remove(img.id, force=True)


@pytest.mark.parametrize(("lines", "select", "words"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_each_validator_fails_on_a_broken_image(default_build, docker_engine, tmp_path, lines, select, words):
    r, rep = _validate_derived(docker_engine, *default_build, tmp_path, lines, select)
    failed = [c for c in rep["checks"] if c["outcome"] == "failed"]
    assert r.returncode != 0 and failed, f"the validator passed a broken image:\n{r.stdout[-2000:]}"
    assert not report.is_green(rep)
    assert any(words.lower() in c["message"].lower() for c in failed), [c["message"] for c in failed]


def test_driver_checks_pass_on_a_good_fake_host(default_build, docker_engine, tmp_path):
    """The control for the driver rows above: the same fake nvidia-smi reporting a host that can run the image
    (an H200 on driver 580) passes both checks, so what fails them is the driver or the GPU, not the fake."""
    r, rep = _validate_derived(docker_engine, *default_build, tmp_path, fake_smi("0, NVIDIA H200, 9.0, 143771, 580.159.04"),
                               "test_driver.py")
    assert r.returncode == 0, r.stdout[-2000:]
    assert {c["id"].split("::")[-1]: c["outcome"] for c in rep["checks"]} == {
        "test_driver_runs_the_image_cuda": "passed", "test_gpus_in_arch_list": "passed"}
