"""Multi-GPU smoke: one process per visible GPU (torch.multiprocessing).

- NCCL all-reduce of several sizes up to 1 GiB, checked for the exact sum, with algorithm and bus
  bandwidth computed the way nccl-tests does (busbw = algbw * 2 (n-1) / n); each size is timed TRIALS
  times and reported as best-of-N with the coefficient of variation (as DCGM's and nvbandwidth's tests do).
- A DDP step of a model compiled first and then wrapped in DDP, compared with a one-process reference.
Needs world size >= 2 (gpu_smoke.py skips it on one GPU). Prints one JSON object.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends) in every process.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(SAFE_ENV)
SIZES = [1 << 20, 16 << 20, 256 << 20, 1 << 30]  # bytes
TRIALS = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10))


def _batch(rank: int, world: int):
    import torch

    g = torch.Generator().manual_seed(1234)
    x, y = torch.randn(32 * world, 256, generator=g), torch.randint(0, 10, (32 * world,), generator=g)
    return x[rank * 32:(rank + 1) * 32], y[rank * 32:(rank + 1) * 32], x, y


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(SAFE_ENV)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    res: dict = {"allreduce": []}
    expected = world * (world + 1) / 2  # every rank contributes rank + 1: exact in fp32
    for size in SIZES:
        t = torch.full((size // 4,), float(rank + 1), device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        exact = bool((t == expected).all())
        dist.barrier()
        iters = 5 if size >= 256 << 20 else 20
        busbw = []
        for _ in range(TRIALS):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            sec = (time.perf_counter() - t0) / iters
            busbw.append(size / sec / 1e9 * 2 * (world - 1) / world)
        mean = statistics.fmean(busbw)
        res["allreduce"].append({"bytes": size, "exact": exact, "trials": TRIALS, "busbw_gbs": round(max(busbw), 2),
                                 "busbw_mean_gbs": round(mean, 2),
                                 "busbw_cv": round(statistics.pstdev(busbw) / mean, 4) if mean else None,
                                 "busbw_all_gbs": [round(b, 2) for b in busbw]})
    # DDP of a compiled model vs one process over the whole batch
    model = _model().cuda()
    ddp = DDP(torch.compile(model), device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y, _, _ = _batch(rank, world)
    torch.nn.functional.cross_entropy(ddp(x.cuda()), y.cuda()).backward()
    opt.step()
    if rank == 0:
        ref = _model().cuda()
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        _, _, xa, ya = _batch(0, world)
        torch.nn.functional.cross_entropy(ref(xa.cuda()), ya.cuda()).backward()
        ropt.step()
        diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), ref.parameters(), strict=True))
        res["ddp"] = {"max_abs_diff": diff, "ok": diff < 1e-4}
        res["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        with open(os.path.join(out_dir, "rank0.json"), "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def topology() -> dict:
    import torch

    n = torch.cuda.device_count()
    peer = [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)]
    topo = ""
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        pass
    return {"devices": [torch.cuda.get_device_name(i) for i in range(n)], "peer_access": peer, "nvidia_smi_topo": topo}


def main() -> int:
    import torch
    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    if world < 2:
        print(json.dumps({"ok": False, "error": f"world size {world}: multi-GPU checks need at least 2 GPUs"}))
        return 1
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        mp.spawn(worker, args=(world, _free_port(), out), nprocs=world, join=True)
        with open(os.path.join(out, "rank0.json")) as f:
            res = json.load(f)
    res.update(world_size=world, topology=topology(), seconds=round(time.perf_counter() - t0, 2),
               env={k: os.environ.get(k) for k in SAFE_ENV})
    res["ok"] = all(a["exact"] for a in res["allreduce"]) and res["ddp"]["ok"]
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
