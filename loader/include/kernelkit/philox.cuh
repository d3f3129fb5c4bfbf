// Counter-based random numbers for kernels, graph-safe like PyTorch's own (see "CUDA Graph-safe RNG
// states" in ATen/cuda/CUDAGeneratorImpl.h).
//
// Torch-free: the binding takes `gen->philox_cuda_state(increment)` under the generator's mutex and
// copies the at::PhiloxCudaState fields into kk::PhiloxArgs (same meaning, plain POD); the kernel calls
// kk::unpack() exactly like at::cuda::philox::unpack: while a CUDA graph is captured, seed and base
// offset are read from device memory at kernel run time, so every replay draws fresh numbers.
//
// The generator is Philox4x32-10 with cuRAND's counter layout: for (seed, subsequence, offset) the
// k-th 128-bit block equals what curand_init(seed, subsequence, offset) + k+1 calls of curand4() give
// (offset a multiple of 4, as torch's generator offsets always are). reference/philox.py is the same
// generator in pure PyTorch (checked against Random123's known answers), used to test the kernels bit
// for bit.
//
// Normals (Box-Muller, two per pair of 32-bit draws):
//   double: exactly cuRAND's curand_normal4_double (53-bit uniforms, log, sqrt, sincospi).
//   float:  u = (x + 1/2) 2^-32 as cuRAND, angle from the top 23 bits of y, and the hardware's
//           approximate log2, sqrt, sin, cos (MUFU; PTX lg2/sqrt/sin/cos.approx), which moves the
//           sampler toward memory-bound (docs/performance.md, "Transform and in-flight chunks").
//           Against the exact transform of the same bits: |dz| <= ~1e-6 (1 + |z|), plus up to
//           ~5e-7 / r where the radius r = sqrt(-2 ln u) is tiny (|z| near 0, u within ~1e-6 of 1).
//           The tail reaches |z| = 6.76 (u >= 2^-33), as with cuRAND.
#pragma once

#include <cstdint>

#include "dtype.cuh"

namespace kk {

// Mirrors at::PhiloxCudaState.
struct PhiloxArgs {
  uint64_t seed = 0;                    // used when !captured
  uint64_t offset = 0;                  // used when !captured
  const int64_t* seed_ptr = nullptr;    // captured: device pointer to the seed
  const int64_t* offset_ptr = nullptr;  // captured: device pointer to the graph's base offset
  uint64_t offset_intragraph = 0;       // captured: offset of this kernel within the graph
  bool captured = false;
};

// Philox counter increments (32-bit draws per subsequence) that one normal4<A>() call consumes; the
// binding passes this to philox_cuda_state().
template <typename A> constexpr uint64_t normal4_draws() { return sizeof(A) == 8 ? 8 : 4; }

#if defined(__CUDACC__)

KK_DEVICE void unpack(const PhiloxArgs& a, uint64_t& seed, uint64_t& offset) {
  if (a.captured) {
    seed = static_cast<uint64_t>(*a.seed_ptr);
    offset = static_cast<uint64_t>(*a.offset_ptr) + a.offset_intragraph;
  } else {
    seed = a.seed;
    offset = a.offset;
  }
}

KK_DEVICE uint4 philox4x32_10(uint4 c, uint2 k) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k.x += W0;
      k.y += W1;
    }
    const uint32_t hi0 = __umulhi(M0, c.x), lo0 = M0 * c.x;
    const uint32_t hi1 = __umulhi(M1, c.z), lo1 = M1 * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }
  return c;
}

// A stream of 128-bit random blocks for one (seed, subsequence, offset).
struct Philox {
  uint4 ctr;
  uint2 key;
  KK_DEVICE Philox(uint64_t seed, uint64_t subsequence, uint64_t offset) {
    const uint64_t c = offset / 4;
    ctr = make_uint4(static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32),
                     static_cast<uint32_t>(subsequence), static_cast<uint32_t>(subsequence >> 32));
    key = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  }
  KK_DEVICE uint4 next() {
    const uint4 r = philox4x32_10(ctr, key);
    if (++ctr.x == 0) ++ctr.y;  // offsets never reach 2^64 / 4: no carry into the subsequence words
    return r;
  }
};

KK_DEVICE float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
KK_DEVICE float sqrt_approx(float x) {
  float y;
  asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Box-Muller radius (times `scale`) and angle of the pair (x, y) for float (see the top of this file).
KK_DEVICE void box_muller_polar(uint32_t x, uint32_t y, float scale, float& radius, float& angle) {
  constexpr float k2Pow32Inv = 2.3283064e-10f, kTwoPi = 6.2831855f;
  const float u = __uint2float_rn(x) * k2Pow32Inv + (k2Pow32Inv / 2.0f);  // (0, 1]
  // 1 + (y >> 9) 2^-23 in [1, 2), moved to the centre of its bin and onto [0, 2 pi) in one FMA
  angle = fmaf(__uint_as_float(0x3f800000u | (y >> 9)), kTwoPi, -kTwoPi * (1.0f - 0x1p-24f));
  // -2 ln u = -2 ln2 log2 u; the clamp keeps an approximate log2 of u ~ 1 from going (tiny) positive
  radius = scale * sqrt_approx(fmaxf(-1.3862944f * lg2_approx(u), 0.0f));
}

// Box-Muller exactly as cuRAND's _curand_box_muller_double.
KK_DEVICE void box_muller(uint32_t x0, uint32_t x1, uint32_t y0, uint32_t y1, double& r0, double& r1) {
  constexpr double k2Pow53Inv = 1.0 / 9007199254740992.0;
  const unsigned long long zx = static_cast<unsigned long long>(x0) ^ (static_cast<unsigned long long>(x1) << 21);
  const unsigned long long zy = static_cast<unsigned long long>(y0) ^ (static_cast<unsigned long long>(y1) << 21);
  const double u = zx * k2Pow53Inv + (k2Pow53Inv / 2.0);
  const double v = zy * (k2Pow53Inv * 2.0) + k2Pow53Inv;
  const double s = sqrt(-2.0 * log(u));
  sincospi(v, &r0, &r1);
  r0 *= s;
  r1 *= s;
}

// out[k] = m + s * z[k] for four independent N(0, 1) draws z; in float s is folded into the radius (one
// FMA per output).
KK_DEVICE void normal4_affine(Philox& g, float m, float s, float (&out)[4]) {
  const uint4 q = g.next();
  float r0, a0, r1, a1;
  box_muller_polar(q.x, q.y, s, r0, a0);
  box_muller_polar(q.z, q.w, s, r1, a1);
  out[0] = fmaf(r0, __sinf(a0), m);
  out[1] = fmaf(r0, __cosf(a0), m);
  out[2] = fmaf(r1, __sinf(a1), m);
  out[3] = fmaf(r1, __cosf(a1), m);
}
KK_DEVICE void normal4_affine(Philox& g, double m, double s, double (&out)[4]) {
  const uint4 a = g.next();
  const uint4 b = g.next();
  double z[4];
  box_muller(a.x, a.y, a.z, a.w, z[0], z[1]);
  box_muller(b.x, b.y, b.z, b.w, z[2], z[3]);
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = m + s * z[k];
}

// The four N(0, 1) draws themselves, in the accumulation type (float or double).
template <typename A> KK_DEVICE void normal4(Philox& g, A (&z)[4]) { normal4_affine(g, A(0), A(1), z); }

#endif  // __CUDACC__

}  // namespace kk
