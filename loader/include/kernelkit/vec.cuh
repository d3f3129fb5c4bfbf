// 16-byte vector loads/stores: the widest single memory instruction per thread.
#pragma once

#include <cstdint>

namespace kk {

constexpr int kVecBytes = 16;

// Elements of T in one `Bytes`-wide access, at least 1 (16 bytes: float 4, double 2, half/bfloat16 8).
template <typename T, int Bytes = kVecBytes> constexpr int vec_width() {
  return Bytes > static_cast<int>(sizeof(T)) ? Bytes / static_cast<int>(sizeof(T)) : 1;
}

template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

inline bool is_aligned(const void* p, int bytes = kVecBytes) {
  return (reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(bytes)) == 0;
}

}  // namespace kk
