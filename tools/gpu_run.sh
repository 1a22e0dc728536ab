#!/usr/bin/env bash
# LOOK-ALIKE ONLY: the images here are made from the GPU machine's own userland (torch 2.11), not the shipped image.
# A development aid; GPU claims come from the shipped image carried by tools/gpu_carry.py (docs/contributing.md).
# The driver, CDI and warm-start measurements on the GPU machine (an H200 with no Docker and no network),
# one call each (docs/measurements/gpu-14.md):
#   tools/gpu_run.sh local   driver + smoke validators against local://, the device-count check made to fail with
#                            NVIDIA_VISIBLE_DEVICES, the perf table with the warm-start rows      (carry .whl)
#   tools/gpu_run.sh cdi     a carried Docker 26.1.5 with CDI on, an image made from the host's userland plus
#                            gpuforge's image files, the entrypoint's preflight (exit 70 cases), the --gpus error,
#                            and `gpuforge smoke --image … --gpu-request cdi`                     (carry .whl .device)
#   tools/gpu_run.sh warm    the same engine: warm starts across two fresh containers (artifacts file, cache dir on a
#                            volume), the C++ AOTInductor loader, the bare host's AOTInductor crash (carry .whl .device)
# The engine and warm-start measurements (docs/measurements/gpu-21.md):
#   tools/gpu_run.sh bare21  smoke local:// (concurrent schedule), the AOTInductor loader without PYTHONPATH, the perf
#                            table (best of N + CV, claims) with both warm-start ways as fresh processes  (carry .whl)
#   tools/gpu_run.sh ctr21   the CDI engine: smoke --image … --gpu-request cdi, then warm starts across two fresh
#                            containers sharing a volume: AOTInductor package, then artifacts file  (carry .whl .device)
#                            (GPUFORGE_SKIP_WARM=1: the smoke only; WARM_WAYS="aot": one way only)
#   tools/gpu_run.sh perf21  the perf table alone (no warm starts), 5 trials;  ctr21+perf21: both in one call
#   tools/gpu_run.sh aoti21  the CDI engine: a start's floor (docker run, import torch, CUDA, torchvision) and
#                            tools/aoti_probe.py (where AOTInductor's build and load spend their time)
# The engine travels as .device/engine26.tar.xz (48 MB) or .device/debs/*.deb; carry .device and .whl.
# Results go to $OUT (at most 8 files come back). Wheels: .whl/ (docker, pytest-testinfra, pydantic…);
# engine debs: .device/debs/ (docker.io + docker-cli 26.1.5 from trixie, containerd + runc + tini from bookworm).
set -u
OUT=${OUT:-/tmp/gpuforge-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# torch 2.11+cu130 is what this machine has; the versions it must show are given here, not read from it.
# shellcheck disable=SC2054  # the arch list is one comma-separated value
EXPECT=(--expect torch=2.11.0+cu130 --expect cuda=13.0 --expect arch_list=sm_75,sm_80,sm_86,sm_90,sm_100,sm_120)
G="python3 -m gpuforge"
t() { echo "== $(date +%T) $*"; }

local_run() {
    t host; nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv | tee "$OUT/host.txt"
    python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.nccl.version(), triton.__version__)' | tee -a "$OUT/host.txt"
    python3 -c 'import torch.utils.cpp_extension as c; print("CUDA_HOME", c.CUDA_HOME)' >> "$OUT/host.txt" 2>&1
    du -sh /usr/local/cuda* /opt/torch 2>/dev/null >> "$OUT/host.txt"
    t "smoke local://"
    $G smoke local:// "${EXPECT[@]}" --reports /tmp/r 2>&1 | tee "$OUT/smoke-local.log"
    echo "rc=${PIPESTATUS[0]}" >> "$OUT/smoke-local.log"
    cp /tmp/r/smoke/*.json "$OUT/smoke.json"
    t "device count: the runner is told 2 GPUs were given (NVIDIA_VISIBLE_DEVICES=0,1); this host has 1"
    NVIDIA_VISIBLE_DEVICES=0,1 $G smoke local:// "${EXPECT[@]}" --reports /tmp/r2 \
        --pytest-args "-k 'sees_exactly or driver_runs'" 2>&1 | tail -25 | tee "$OUT/count-negative.log"
    echo "rc=${PIPESTATUS[0]}" >> "$OUT/count-negative.log"
    [ "${GPUFORGE_SKIP_PERF:-}" = 1 ] && { t finished; return; }
    t "perf table + warm start"
    python3 images/programs/perf_table.py --json "$OUT/perf.json" --md "$OUT/perf.md" 2>&1 | grep -v -i warn | tail -30
    t finished
}

cdi_setup() {
    # the engine's files: .device/engine26.tar.xz (the binaries of the debs below, xz: 48 MB against 57 MB of
    # debs, so the carry fits the device's 64 MiB) or .device/debs/*.deb
    D=/tmp/dk; mkdir -p $D
    if [ -f .device/engine26.tar.xz ]; then tar -C $D -xJf .device/engine26.tar.xz; else for f in .device/debs/*.deb; do dpkg -x "$f" $D; done; fi
    export PATH=$D/usr/sbin:$D/usr/bin:$PATH
    echo $D/lib/x86_64-linux-gnu > /etc/ld.so.conf.d/zz-dk.conf; ldconfig
    mkdir -p /etc/docker /etc/cdi
    echo '{"features": {"cdi": true}}' > /etc/docker/daemon.json
    # What `nvidia-ctk cdi generate` describes for this host: the device nodes, the driver's folder, its libraries.
    python3 tools/gpu_carry.py cdi-spec > /etc/cdi/nvidia.yaml  # one home for the spec: tools/gpu_carry.py
    # a machine kept warm between calls still has the engine and the imported userland: reuse them
    docker info >/dev/null 2>&1 || (setsid dockerd --iptables=false --bridge=none > /tmp/dockerd.log 2>&1 &)
    for _ in $(seq 40); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker version --format 'engine {{.Server.Version}} api {{.Server.APIVersion}}' | tee "$OUT/engine.txt"
    docker info 2>&1 | grep -iE 'cdi|Storage Driver|Cgroup Version' | tee -a "$OUT/engine.txt"
    t "image from the host userland"
    docker image inspect hostbase:raw >/dev/null 2>&1 || tar -C / -c --exclude='./usr/local/nvidia' --exclude='./opt/nvidia' --exclude='./usr/local/cuda-*/nsight*' ./usr ./lib64 ./bin ./sbin ./etc ./opt/torch ./opt/gcc 2>/dev/null \
        | docker import - hostbase:raw >/dev/null
    # gpuforge's image files, as the Dockerfile lays them out; the host's venv stands in for /opt/venv
    python3 -c 'import json; json.dump({"id": "h200-host-torch211", "torch": "2.11.0+cu130", "cuda": "13.0",
        "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], "ptx": []}, open("/tmp/target.json", "w"))'
    docker create --name fix --network none hostbase:raw /usr/bin/true >/dev/null
    docker cp gpuforge/image fix:/opt/gpuforge-image && docker cp images/programs fix:/opt/gpuforge-programs \
        && docker cp images/context/entrypoint.sh fix:/usr/local/bin/gpuforge-entrypoint && docker cp $D/usr/bin/tini fix:/usr/bin/tini \
        && docker cp /tmp/target.json fix:/opt/gpuforge-target.json
    docker commit fix hostbase:files >/dev/null && docker rm fix >/dev/null
    docker run --name fix2 --network none --entrypoint /usr/bin/sh hostbase:files -c 'ln -s usr/lib /lib 2>/dev/null || true; mkdir -p /tmp && chmod 1777 /tmp;
        mkdir -p /opt/gpuforge/lib/gpuforge && mv /opt/gpuforge-image /opt/gpuforge/lib/gpuforge/image &&
        mv /opt/gpuforge-programs /opt/gpuforge/programs && mv /opt/gpuforge-target.json /opt/gpuforge/target.json &&
        { id gpuforge >/dev/null 2>&1 || useradd --create-home --shell /bin/bash gpuforge; } &&
        ln -s /opt/torch/.venv /opt/venv && chmod 755 /usr/local/bin/gpuforge-entrypoint'
    docker commit --change 'ENTRYPOINT ["/usr/bin/tini", "-g", "--", "/usr/local/bin/gpuforge-entrypoint"]' \
        --change 'ENV PATH=/opt/torch/.venv/bin:/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change "ENV TORCHINDUCTOR_VEC_ISA_OK=1" \
        fix2 gpuforge-h200:cdi >/dev/null && docker rm fix2 >/dev/null
}

IMG=gpuforge-h200:cdi

cdi_run() {
    cdi_setup
    t "entrypoint preflight in containers" | tee "$OUT/entrypoint.txt"
    {
        echo "-- CDI GPU, verbose:"; docker run --rm --device nvidia.com/gpu=all -e GPUFORGE_PREFLIGHT_VERBOSE=1 $IMG true; echo "rc=$?"
        echo "-- no GPU request:"; docker run --rm $IMG true; echo "rc=$?"
        echo "-- no GPU request, GPUFORGE_REQUIRE_GPU=1:"; docker run --rm -e GPUFORGE_REQUIRE_GPU=1 $IMG true; echo "rc=$?"
        echo "-- NVIDIA_VISIBLE_DEVICES=void, CDI GPU (what nvidia-ctk's spec sets): "
        docker run --rm --device nvidia.com/gpu=all -e NVIDIA_VISIBLE_DEVICES=void $IMG sh -c 'nvidia-smi -L'; echo "rc=$?"
        echo "-- --gpus all (the NVIDIA runtime, absent here), through gpuforge:"
        python3 -c 'import sys
from gpuforge.engine import containers as run
from gpuforge.errors import EngineError
try:
    with run.container(sys.argv[1], ["true"], gpus=True, gpu_request="nvidia"):
        print("started?!")
except EngineError as e:
    print("EngineError:", e)' $IMG
        echo "-- plain docker: "; docker run --rm --gpus all $IMG true; echo "rc=$?"
    } 2>&1 | tee -a "$OUT/entrypoint.txt"
    t "gpuforge smoke --image $IMG --gpu-request cdi"
    $G smoke --image $IMG --gpu-request cdi "${EXPECT[@]}" --reports /tmp/rc 2>&1 | tee "$OUT/smoke-cdi.log"
    echo "rc=${PIPESTATUS[0]}" >> "$OUT/smoke-cdi.log"
    cp /tmp/rc/smoke/*.json "$OUT/smoke-cdi.json"
    docker ps -a --format '{{.Names}} {{.Status}}' | tee -a "$OUT/smoke-cdi.log"
    tail -5 /tmp/dockerd.log
    t finished
}

# Warm starts as users get them: two fresh containers through the entrypoint, the cache on a volume; then the
# AOTInductor paths (the bare host's Python loader crashed in the first runs; the C++ loader of devel images).
warm_run() {
    cdi_setup
    R=(docker run --rm --network none --device nvidia.com/gpu=all --shm-size 2g)
    {
        for how in artifacts dir; do
            rm -rf /tmp/wvol; mkdir -p /tmp/wvol; chmod 777 /tmp/wvol
            if [ $how = artifacts ]; then E=(-e GPUFORGE_CACHE_ARTIFACTS=/cache/artifacts.bin); else E=(-e GPUFORGE_COMPILE_CACHE=/cache); fi
            for n in 1 2; do
                s=$(date +%s%N)
                "${R[@]}" -v /tmp/wvol:/cache -e GPUFORGE_WARMUP=warm_start:resnet50_bs1 "${E[@]}" $IMG true 2>&1 | grep '^{'
                echo "container $how #$n: docker run wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
            done
            du -sh /tmp/wvol
        done
        echo "-- bad GPUFORGE_WARMUP:"; "${R[@]}" -e 'GPUFORGE_WARMUP=os.system(1)' $IMG true; echo "rc=$?"
    } 2>&1 | tee "$OUT/warm-containers.txt"
    t "AOTI: C++ loader in the container"
    "${R[@]}" $IMG python3 /opt/gpuforge/programs/gpu_smoke.py --only device,aoti_cpp 2>&1 | tail -1 | cut -c1-3000 | tee "$OUT/aoti.txt"
    t "AOTI on the bare host: environment, then with only the driver's folder on LD_LIBRARY_PATH"
    { echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; env | grep -iE '^(CUDA|NVIDIA|TORCH)' ; } | tee -a "$OUT/aoti.txt"
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64 python3 images/programs/gpu_smoke.py --only device,aoti 2>&1 | tail -1 | cut -c1-1500 | tee -a "$OUT/aoti.txt"
    t finished
}

bare21_run() {
    t host; nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv | tee "$OUT/host.txt"
    nproc >> "$OUT/host.txt"
    t "smoke local:// (concurrent)"
    s=$(date +%s%N)
    $G smoke local:// "${EXPECT[@]}" --reports /tmp/r 2>&1 | tee "$OUT/smoke-local.log"
    echo "rc=${PIPESTATUS[0]} wall_ms=$(( ($(date +%s%N) - s) / 1000000 ))" | tee -a "$OUT/smoke-local.log"
    cp /tmp/r/smoke/*.json "$OUT/smoke-local.json"
    t "AOTInductor alone, serial, PYTHONPATH unset (is the bare host's loader crash the carried wheels?)"
    env -u PYTHONPATH python3 images/programs/gpu_smoke.py --serial --only aoti 2>&1 | grep -v -i warn | tail -3 | cut -c1-2500 \
        | tee "$OUT/aoti-nopythonpath.txt"
    t "perf table + warm starts (fresh processes)"
    # shellcheck disable=SC2086  # PERF_ARGS is a list of flags
    python3 images/programs/perf_table.py ${PERF_ARGS:-} --json "$OUT/perf-21.json" --md "$OUT/perf-21.md" 2>&1 | grep -v -i warn | tail -60
    t finished
}

ctr21_run() {
    cdi_setup
    t "gpuforge smoke --image $IMG --gpu-request cdi"
    s=$(date +%s%N)
    $G smoke --image $IMG --gpu-request cdi "${EXPECT[@]}" --reports /tmp/rc 2>&1 | tee "$OUT/smoke-cdi.log"
    echo "rc=${PIPESTATUS[0]} wall_ms=$(( ($(date +%s%N) - s) / 1000000 ))" | tee -a "$OUT/smoke-cdi.log"
    cp /tmp/rc/smoke/*.json "$OUT/smoke-cdi.json"
    R=(docker run --rm --network none --device nvidia.com/gpu=all --shm-size 2g)
    t "metrics (NVML through CDI) in a container: one exposition, then 30 timed scrapes"
    "${R[@]}" --entrypoint python3 $IMG /opt/gpuforge/programs/metrics.py --once --repeat 30 2>&1 \
        | grep -E '^DCGM_FI_DEV_(GPU_UTIL|GPU_TEMP|POWER_USAGE|FB_USED)|scrape|^\{' | cut -c1-400 | tee "$OUT/metrics-cdi.txt"
    [ "${GPUFORGE_SKIP_WARM:-}" = 1 ] && { t finished; return; }
    {
        for how in ${WARM_WAYS:-aot artifacts}; do
            rm -rf /tmp/wvol; mkdir -p /tmp/wvol; chmod 777 /tmp/wvol
            if [ "$how" = aot ]; then
                E=(-e GPUFORGE_AOT_PACKAGE=/cache/resnet50.pt2 -e GPUFORGE_AOT_MODEL=warm_start:resnet50_bs1_model)
            else
                E=(-e GPUFORGE_CACHE_ARTIFACTS=/cache/artifacts.bin -e GPUFORGE_WARMUP=warm_start:resnet50_bs1)
            fi
            # the first start is cold (an empty volume); the next ones are warm: best of N, with the spread
            runs="1 2 3"; [ "$how" = aot ] && runs="1 2 3 4"
            for n in $runs; do
                s=$(date +%s%N)
                "${R[@]}" -v /tmp/wvol:/cache "${E[@]}" $IMG true 2>&1 | grep -E '^\{|AOTInductor|error'
                echo "container $how #$n: docker run wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
            done
            ls -la /tmp/wvol
        done
    } 2>&1 | tee "$OUT/warm-containers-21.txt"
    t finished
}

# Where AOTInductor's build and load spend their time, in a CDI container (ptrace allowed for cuda-gdb), and the
# floor of a warm start: a fresh container's start, import torch, the first CUDA use, import torchvision.
aoti21_run() {
    cdi_setup
    R=(docker run --rm --network none --device nvidia.com/gpu=all --shm-size 2g)
    t "start floor" | tee "$OUT/floor.txt"
    {
        for n in 1 2; do
            s=$(date +%s%N); "${R[@]}" --entrypoint /usr/bin/true $IMG; echo "run true (no entrypoint): $(( ($(date +%s%N) - s) / 1000000 )) ms"
            s=$(date +%s%N); "${R[@]}" $IMG true; echo "run true (entrypoint): $(( ($(date +%s%N) - s) / 1000000 )) ms"
        done
        "${R[@]}" --entrypoint python3 $IMG -c 'import time; t=time.perf_counter(); import torch; a=time.perf_counter(); torch.empty(1, device="cuda"); torch.cuda.synchronize(); b=time.perf_counter(); import torchvision; c=time.perf_counter(); import torch._inductor.codecache; d=time.perf_counter(); print(f"import torch {a-t:.2f} s, CUDA start {b-a:.2f} s, import torchvision {c-b:.2f} s, import codecache {d-c:.2f} s")'
        "${R[@]}" --entrypoint python3 $IMG -c 'import time; t=time.perf_counter(); import torch; a=time.perf_counter(); torch.empty(1, device="cuda"); torch.cuda.synchronize(); b=time.perf_counter(); print(f"again: import torch {a-t:.2f} s, CUDA start {b-a:.2f} s")'
    } 2>&1 | tee -a "$OUT/floor.txt"
    t "AOTInductor probe in a container"
    "${R[@]}" --cap-add SYS_PTRACE --security-opt seccomp=unconfined -v "$PWD":/src:ro --entrypoint python3 $IMG \
        /src/tools/aoti_probe.py --gdb > "$OUT/aoti-probe.json" 2> "$OUT/aoti-probe.err"
    echo "rc=$?"; tail -c 3000 "$OUT/aoti-probe.err"; head -c 2500 "$OUT/aoti-probe.json"
    t finished
}

case "${1:-}" in
    local) local_run ;;
    cdi) cdi_run ;;
    warm) warm_run ;;
    bare21) bare21_run ;;
    perf21) t "perf table"; python3 images/programs/perf_table.py --no-warm-start --trials 5 --json "$OUT/perf-21.json" \
                --md "$OUT/perf-21.md" 2>&1 | grep -v -i warn | tail -40 ;;
    ctr21+perf21) ctr21_run; "$0" perf21 ;;
    ctr21) ctr21_run ;;
    aoti21) aoti21_run ;;
    *) echo "usage: tools/gpu_run.sh local|cdi|warm|bare21|ctr21|perf21|ctr21+perf21|aoti21" >&2; exit 64 ;;
esac
