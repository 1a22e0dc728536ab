"""The smoke suite's hand-written Triton kernel, and its compile without a GPU (the CPU validators).

No `from __future__ import annotations` here, and `tl` is imported at module level: Triton 3.3 (the image's, for
torch 2.7) reads a parameter's annotation (`BLOCK: tl.constexpr`) and, when it is a string — what postponed
annotations make of every annotation — evaluates it in the kernel's module globals. A kernel whose module postpones
annotations and imports `tl` inside a function fails there with `NameError: tl is not defined` (Triton 3.6 accepts
it, which is how the look-alike image hid it). Imported by gpu_smoke.py and by gpu_compile_cpu.py.
"""

import triton
import triton.language as tl

BLOCK = 1024
# Triton's signature types for axpy's arguments (what a launch with fp32 tensors and a Python float/int binds)
AXPY_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "a": "fp32", "n": "i32", "BLOCK": "constexpr"}


@triton.jit
def axpy(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, a * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def compile_axpy(capability: int) -> dict:
    """Compile axpy ahead of time for sm_<capability> (no GPU or driver needed: Triton's frontend, LLVM and its own
    ptxas), as a launch would; raises what a launch would raise."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=axpy, signature=AXPY_SIGNATURE, constexprs={"BLOCK": BLOCK})
    k = triton.compile(src, target=GPUTarget("cuda", capability, 32))
    return {"capability": capability, "cubin_bytes": len(k.asm["cubin"]), "stages": sorted(k.asm)}
