"""gpuforge: build and validate PyTorch + CUDA container images from one matrix.yaml."""

__version__ = "0.1.0"
