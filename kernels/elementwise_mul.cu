// elementwise_mul: the math, for CUDA and the CPU (KK_BINARY_LAUNCHER compiles MulOp's launcher and CPU loop).
#include <kernelkit/elementwise.cuh>
#include "elementwise_mul.h"

namespace kk {
template <typename A> struct MulOp {
  KK_HD A operator()(A a, A b) const { return a * b; }
};
}  // namespace kk

KK_BINARY_LAUNCHER(kk::MulOp);
