"""Tiled matrix transpose as an instant (NVRTC) kernel: tile size, rows of threads per tile, shared-memory padding."""
import torch

import kernelkit

SRC = r"""
// y (cols x rows) = transpose of x (rows x cols), through a TILE x TILE tile in shared memory. A block is
// TILE x BLOCK_ROWS threads, each moving TILE / BLOCK_ROWS elements; PAD 1 adds a column to the tile so the
// column-wise reads of the second half hit distinct banks.
extern "C" __global__ void transpose(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
  __shared__ float tile[TILE][TILE + PAD];
  const int c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;
  for (int j = threadIdx.y; j < TILE; j += BLOCK_ROWS) {
    const int r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[j][threadIdx.x] = x[(long long)r * cols + c];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < TILE; j += BLOCK_ROWS) {
    const int c = c0 + j, r = r0 + threadIdx.x;
    if (c < cols && r < rows) y[(long long)c * rows + r] = tile[threadIdx.x][j];
  }
}
"""

SPACE = {"TILE": [16, 32, 64], "BLOCK_ROWS": [2, 4, 8, 16, 32], "PAD": [0, 1]}


def constraint(config) -> bool:
    """A block has at most 1024 threads and no more rows of threads than the tile has rows."""
    return config["BLOCK_ROWS"] <= config["TILE"] and config["TILE"] * config["BLOCK_ROWS"] <= 1024


def make(config, arch=None):
    tag = "_".join(str(v) for v in config.values())
    mod = kernelkit.load_kernels(SRC, name=f"transpose_{tag}", arch=arch,
                                 options=[f"-D{k}={v}" for k, v in config.items()])
    tile, block_rows = config["TILE"], config["BLOCK_ROWS"]

    def transpose(x):
        if x.dim() != 2 or x.dtype != torch.float32 or not x.is_cuda:
            raise ValueError(f"transpose: x: expected a 2-D float32 CUDA tensor, got {tuple(x.shape)} {x.dtype} "
                             f"on {x.device}")
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty(cols, rows, dtype=x.dtype, device=x.device)
        mod.transpose[((cols + tile - 1) // tile, (rows + tile - 1) // tile), (tile, block_rows)](x, y, rows, cols)
        return y
    return transpose


def reference(x):
    return x.t().contiguous()


def inputs(shape, dtype=None, device=None, generator=None):
    return (torch.randn(shape, dtype=dtype or torch.float32, device=device, generator=generator),)

