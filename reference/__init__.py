"""Pure-PyTorch reference implementations of kernelkit's cards (forward and backward), one module per op.

Nothing here imports kernelkit: these are the ground truth that checks and benchmarks compare against.
"""
