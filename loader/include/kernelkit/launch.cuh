// Launch math: per-device properties (cached), tile grids, 64-bit thread indices.
#pragma once

#include <atomic>
#include <cstdint>
#include <cuda_runtime.h>

namespace kk {

constexpr int kBlockSize = 256;
constexpr int kMaxDevices = 64;

// A per-device property of the current device, computed once by `query(dev)` (a positive value, or 0
// when the CUDA query fails: the fallback is returned and nothing is cached) and kept in `cache`, one slot
// per device (device attribute queries are not free on a hot path).
template <typename V, typename Query>
V per_device(std::atomic<V> (&cache)[kMaxDevices], V fallback, Query query) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return fallback;
  V v = cache[dev].load(std::memory_order_relaxed);
  if (v > V(0)) return v;
  v = query(dev);
  if (!(v > V(0))) return fallback;
  cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

// Streaming multiprocessors of the current device; a conservative 132 if the query fails.
inline int sm_count() {
  static std::atomic<int> cache[kMaxDevices] = {};
  return per_device(cache, 132, [](int dev) {
    int n = 0;
    return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess ? n : 0;
  });
}

// Peak DRAM bytes the current device moves per SM clock cycle (memory clock x 2 for DDR x bus width,
// over SMs x SM clock): how far memory outruns arithmetic, for kernels whose best launch shape depends
// on which of the two binds (H100 SXM ~12.8, H200 ~18.4). 0 if a query fails.
inline double dram_bytes_per_sm_cycle() {
  static std::atomic<double> cache[kMaxDevices] = {};
  return per_device(cache, 0.0, [](int dev) {
    int mem_khz = 0, bus_bits = 0, sm_khz = 0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, dev) != cudaSuccess || sm_khz <= 0)
      return 0.0;
    return 2.0 * mem_khz * (bus_bits / 8.0) / (static_cast<double>(sm_count()) * sm_khz);
  });
}

// Where DRAM outruns the SMs (an H200: ~18.4 bytes per SM cycle) streaming kernels want the fewest
// instructions per byte; where it does not (an H100: ~12.8) other launch shapes win (docs/performance.md,
// "Access shape" and "sample_normal"). 16 lies between the two measured devices.
constexpr double kDramOutrunsSmsAbove = 16.0;
inline bool dram_outruns_sms() { return dram_bytes_per_sm_cycle() > kDramOutrunsSmsAbove; }

constexpr int64_t kMaxGrid = 0x7fffffff;  // gridDim.x limit

// One block per tile of `tile` items, for `work` items: at least 1, capped at the grid limit (a kernel
// that strides its tile loop by gridDim.x then covers any int64 size).
inline unsigned tile_grid(int64_t work, int64_t tile) {
  const int64_t tiles = (work + tile - 1) / tile;
  return static_cast<unsigned>(tiles < 1 ? 1 : (tiles < kMaxGrid ? tiles : kMaxGrid));
}

#if defined(__CUDACC__)
// Global thread index and grid stride in 64 bits (blockIdx.x * blockDim.x overflows 32 bits past 2^31).
__device__ __forceinline__ int64_t global_thread_id() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }
#endif

}  // namespace kk
