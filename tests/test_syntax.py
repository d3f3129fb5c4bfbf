"""The syntax-level questions the loader asks of C++/CUDA source, answered by tree-sitter: code counts,
comments and strings do not."""
import pytest

from kernelkit.jit import syntax


@pytest.mark.parametrize("text, expected", [
    ("torch::Tensor f(torch::Tensor x);", True),
    ("__global__ void k() { auto s = at::cuda::getCurrentCUDAStream(); }", True),
    ("template <typename T> void f(c10::ArrayRef<T> x);", True),
    ("using namespace c10;", True),
    ("// torch::Tensor lives in a comment\nint x;", False),
    ('const char* s = "at::Tensor";', False),
    ("std::vector<int> v; namespace at { int y; }", False),  # defining a namespace is not using torch's
    ("float* p = nullptr;", False),
])
def test_mentions_torch(text, expected):
    assert syntax.mentions_torch(text) is expected


@pytest.mark.parametrize("text, expected", [
    ("#include <ATen/ATen.h>\n", True),
    ('#include "torch/extension.h"\n', True),
    ("#include <c10/cuda/CUDAGuard.h>\n", True),
    ("// #include <torch/extension.h>\n#include <cuda.h>\n", False),
    ("#include <torchvision/ops.h>\n", False),
])
def test_includes_torch(text, expected):
    assert syntax.includes_torch(text) is expected


@pytest.mark.parametrize("text, expected", [
    ("__global__ void k(float* x) { x[0] = 1; }", "__global__"),
    ("void f() { k<<<1, 1>>>(); }", "<<<"),
    ("// a __global__ kernel lives in the .cu\nint f();", None),
    ('const char* s = "__global__ <<<";', None),
    ("std::vector<std::vector<std::vector<int>>> v;", None),  # >>> closing templates is not a launch
])
def test_first_cuda_token(text, expected):
    assert syntax.first_cuda_token(text, ("__global__", "<<<")) == expected
