// 16-byte vector loads/stores: the widest single memory instruction per thread.
#pragma once

#include <cstdint>

namespace kk {

constexpr int kVecBytes = 16;

// Elements of T in one 16-byte access (float: 4, double: 2, half/bfloat16: 8).
template <typename T> constexpr int vec_width() { return kVecBytes / static_cast<int>(sizeof(T)); }

template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

inline bool is_aligned(const void* p, int bytes = kVecBytes) {
  return (reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(bytes)) == 0;
}

}  // namespace kk
