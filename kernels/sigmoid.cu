// sigmoid device code: the generic elementwise launchers for its two functors (see sigmoid.h).
#include <kernelkit/elementwise.cuh>
#include "sigmoid.h"

KK_UNARY_LAUNCHER(kk::SigmoidOp)
KK_BINARY_LAUNCHER(kk::SigmoidBackwardOp)
