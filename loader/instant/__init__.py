"""Instant kernels: kernel-only CUDA C++ compiled in-process with NVRTC, launched on torch tensors."""
