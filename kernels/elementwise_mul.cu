// elementwise_mul device code: the generic binary elementwise launcher for MulOp (see elementwise_mul.h).
#include <kernelkit/elementwise.cuh>
#include "elementwise_mul.h"

KK_BINARY_LAUNCHER(kk::MulOp)
