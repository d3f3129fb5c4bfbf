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


def test_directives_read_conditions_in_every_scope():
    text = ("#ifdef KERNELKIT_BINDING\n#include <kernelkit/torch_glue.h>\n#else\n#include \"math.cuh\"\n#endif\n"
            "#if defined(A) && !defined B\n#include \"ab.h\"\n#elif X > 2\n#include <x.h>\n#endif\n"
            "namespace kk {\nstruct S {\n#ifndef KERNELKIT_WITH_CUDA\n#include \"in_class.h\"\n#endif\n};\n}\n"
            "#define MINE 1\n#undef THEIRS\n")
    d = syntax.directives(text)
    assert [(i.name, i.requires) for i in d.includes] == [
        ("kernelkit/torch_glue.h", (("KERNELKIT_BINDING", True),)),
        ("math.cuh", (("KERNELKIT_BINDING", False),)),
        ("ab.h", (("A", True), ("B", False))),
        ("x.h", ()),  # the alternative of two conditions, and an unreadable one: may be compiled
        ("in_class.h", (("KERNELKIT_WITH_CUDA", False),)),
    ]
    assert d.macros == {"MINE", "THEIRS"} and d.whole


def test_directives_in_text_the_grammar_fails_on_are_not_trusted():
    """Where a directive sits inside what did not parse, an include may be hidden or its branch misread: the
    caller then counts every include the lines show."""
    assert not syntax.directives('#ifdef A\nint f() {\n#else\nint g() {\n#endif\n#include "b.h"\n}\n').whole
    assert syntax.directives("template <typename A> struct Op {\n  KK_HD A operator()(A x) const { return x; }\n};\n"
                             "#include <x.h>\n").whole  # an unknown macro before a declaration hides nothing
