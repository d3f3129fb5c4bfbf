"""Diffusion Policy inference on kernelkit: the 1D conditional U-Net (``unet``), its DDPM denoise loop and
CUDA-graph runner (``denoise``), and the surgery that swaps in kernelkit's fused ops (``surgery``).

An application built on kernelkit's public API; kernelkit does not import it. Put ``examples/`` on
``sys.path`` (``PYTHONPATH=examples``) to import it as ``diffusion_policy``.
"""
