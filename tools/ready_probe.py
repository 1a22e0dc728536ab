"""The startup probe: what a user waits for inside a container of the image, one JSON line per milestone, flushed as
it happens (the host stamps each on arrival): the process, the first `import torch`, the first CUDA op (on a GPU), the
first compiled inference (checked against eager), a Jupyter kernel answering.

A constant of its own, with no imports: tools/bench_ready.py times it after a pull on the CPU machine, and
tools/gpu_carry.py `measure startup` on the GPU machine, whose Python reaches only the carried wheels.
"""

PROBE = r"""
import json, time
def mark(name):
    print(json.dumps({"mark": name, "t": time.time()}), flush=True)
mark("process")
import torch
mark("import_torch")
dev = "cuda" if torch.cuda.is_available() else "cpu"
if dev == "cuda":
    torch.ones(1, device=dev); torch.cuda.synchronize()
    mark("first_cuda_op")
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10)).to(dev)
x = torch.randn(8, 256, device=dev)
with torch.no_grad():
    y = torch.compile(m)(x)
    if dev == "cuda":
        torch.cuda.synchronize()
    assert torch.allclose(y, m(x), atol=1e-3 if dev == "cuda" else 1e-4), "the compiled MLP disagrees with eager"
mark("compiled_inference")
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3", startup_timeout=300)
mark("jupyter_kernel")
kc.stop_channels(); km.shutdown_kernel(now=True)
"""

