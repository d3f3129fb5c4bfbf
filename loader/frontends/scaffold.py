"""``kernelkit new``: write a complete card (device code, binding, spec with its reference, and a test) that
builds, passes ``kernelkit check`` and runs ``kernelkit bench`` as written. Comments marked EDIT are the few
lines the user changes. Torch-free: the command answers without importing torch.
"""
from __future__ import annotations

import keyword
import re
from pathlib import Path
from string import Template
from typing import Dict, List

from ..errors import KernelkitError

KINDS = ("unary", "binary", "custom")

_CPP_KEYWORDS = frozenset("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield
decltype default delete do double dynamic_cast else enum explicit export extern false float for friend goto if
inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
register reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq""".split())

# ---- templates: $name is the card, $Name its CamelCase, $ns its namespace of helpers (kk) ----------------

_UNARY_MATH = """\
// $name: the math (EDIT), compiled for CUDA by $name.cu and for the CPU by ${name}_cpu.cpp. An edit rebuilds
// the kernels' device code and the CPU loop only: never the host side of $name.cu, nor $name.h's binding.
#pragma once
#include <cmath>  // std::exp, std::tanh, ...: on the device too
#include <kernelkit/dtype.cuh>

namespace kk {
template <typename A> struct ${Name}Op {  // A: float (also for float16/bfloat16) or double
  KK_MATH_FN A operator()(A x) const { return x * x; }  // EDIT: f(x)
};
$backward_functor}  // namespace kk
"""

_UNARY_CU = """\
// $name: the CUDA launchers of its math (${name}_math.h), for float, double, float16 and bfloat16.
#include <kernelkit/elementwise.cuh>
#include "${name}_math.h"

KK_UNARY_CUDA_LAUNCHER(kk::${Name}Op);
$backward_launcher"""

_UNARY_CPU = """\
// $name: the CPU loops of its math (${name}_math.h), compiled by the host compiler.
#include <kernelkit/elementwise_cpu.h>
#include "${name}_math.h"

KK_UNARY_CPU_LOOP(kk::${Name}Op);
$backward_loop"""

_UNARY_H = """\
// $name: out = f(x) elementwise, the torch-facing op (its math is in ${name}_math.h).
#pragma once

#ifdef KERNELKIT_BINDING
#include <kernelkit/torch_glue.h>
namespace kk {
template <typename A> struct ${Name}Op;  // defined in ${name}_math.h: the binding needs its name only
${backward_declaration}inline at::Tensor $name(const at::Tensor& x) { return unary_elementwise<${Name}Op>("$name", x, "x"); }
$backward_fn}  // namespace kk
KERNELKIT_LIBRARY(m) {
  m.def("$name(Tensor x) -> Tensor");
  KK_IMPL_CPU_CUDA(m, "$name", kk::$name);
$backward_reg}
#endif  // KERNELKIT_BINDING
"""

_UNARY_NO_BACKWARD = {"backward_reg": "  kk::impl_autograd<kk::NoGrad>(m, \"$name\");  // no backward: refuse requires_grad\n"}

_UNARY_BACKWARD = {
    "backward_launcher": "KK_BINARY_CUDA_LAUNCHER(kk::${Name}BackwardOp);\n",
    "backward_loop": "KK_BINARY_CPU_LOOP(kk::${Name}BackwardOp);\n",
    "backward_functor": """\
template <typename A> struct ${Name}BackwardOp {
  KK_MATH_FN A operator()(A g, A x) const { return g * A(2) * x; }  // EDIT: grad * f'(x), for ${name}_backward
};
""",
    "backward_declaration": "template <typename A> struct ${Name}BackwardOp;\n",
    "backward_fn": """\
inline at::Tensor ${name}_backward(const at::Tensor& grad, const at::Tensor& x) {
  return binary_elementwise<${Name}BackwardOp>("${name}_backward", grad, "grad", x, "x");
}
""",
    "backward_reg": """\
  m.def("${name}_backward(Tensor grad, Tensor x) -> Tensor");
  KK_IMPL_CPU_CUDA(m, "${name}_backward", kk::${name}_backward);
  kk::impl_autograd<kk::UnaryAutograd<kk::Saved::Input>>(m, "$name");  // backward from x (or Saved::Output)
""",
}

_BINARY_MATH = """\
// $name: the math (EDIT), compiled for CUDA by $name.cu and for the CPU by ${name}_cpu.cpp. An edit rebuilds
// the kernels' device code and the CPU loop only: never the host side of $name.cu, nor $name.h's binding.
#pragma once
#include <cmath>  // std::exp, std::tanh, ...: on the device too
#include <kernelkit/dtype.cuh>

namespace kk {
template <typename A> struct ${Name}Op {  // A: float (also for float16/bfloat16) or double
  KK_MATH_FN A operator()(A a, A b) const { return a + A(2) * b; }  // EDIT: f(a, b)
};
}  // namespace kk
"""

_BINARY_CU = """\
// $name: the CUDA launchers of its math (${name}_math.h), for float, double, float16 and bfloat16.
#include <kernelkit/elementwise.cuh>
#include "${name}_math.h"

KK_BINARY_CUDA_LAUNCHER(kk::${Name}Op);
"""

_BINARY_CPU = """\
// $name: the CPU loops of its math (${name}_math.h), compiled by the host compiler.
#include <kernelkit/elementwise_cpu.h>
#include "${name}_math.h"

KK_BINARY_CPU_LOOP(kk::${Name}Op);
"""

_BINARY_H = """\
// $name: out = f(a, b) elementwise, broadcasting like torch, the torch-facing op (its math is in ${name}_math.h).
#pragma once

#ifdef KERNELKIT_BINDING
#include <kernelkit/torch_glue.h>
namespace kk {
template <typename A> struct ${Name}Op;  // defined in ${name}_math.h: the binding needs its name only
inline at::Tensor $name(const at::Tensor& a, const at::Tensor& b) {
  return binary_elementwise<${Name}Op>("$name", a, "a", b, "b");
}
}  // namespace kk
KERNELKIT_LIBRARY(m) {
  m.def("$name(Tensor a, Tensor b) -> Tensor");
  KK_IMPL_CPU_CUDA(m, "$name", kk::$name);
  kk::impl_autograd<kk::NoGrad>(m, "$name");  // no backward: refuse inputs that require grad
}
#endif  // KERNELKIT_BINDING
"""

_CUSTOM_CU = """\
// $name: your own kernel and its launcher, and the CPU implementation (torch-free: an edit recompiles this
// file alone, in about a second).
#include <cmath>  // std::exp, std::tanh, ...: on the device too
#include <kernelkit/launch.cuh>
#include "$name.h"

namespace kk {

template <typename T> __global__ void ${name}_kernel(const T* x, T* out, int64_t n) {
  for (int64_t i = global_thread_id(); i < n; i += grid_stride())
    out[i] = from_acc<T>(acc_t<T>(2) * to_acc(x[i]));  // EDIT: the kernel's work
}

template <typename T> cudaError_t ${name}_cuda(const T* x, T* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ${name}_kernel<<<tile_grid(n, 256), 256, 0, stream>>>(x, out, n);
  return cudaGetLastError();
}

template <typename T> void ${name}_cpu(const T* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = from_acc<T>(acc_t<T>(2) * to_acc(x[i]));  // EDIT: the CPU implementation
}

#define KK_${NAME}_INST(T)                                                    \\
  template cudaError_t ${name}_cuda<T>(const T*, T*, int64_t, cudaStream_t); \\
  template void ${name}_cpu<T>(const T*, T*, int64_t);
KK_INSTANTIATE_FLOATING(KK_${NAME}_INST);

}  // namespace kk
"""

_CUSTOM_H = """\
// $name: your own kernel (not an elementwise functor), on CUDA and on the CPU: the torch-facing op (the
// kernel and the CPU implementation are in $name.cu). Lines marked EDIT are yours.
#pragma once
#include <kernelkit/dtype.cuh>

namespace kk {
// out[i] = 2 x[i] for i < n: on `stream`, or on the CPU.  EDIT: the contract
template <typename T> cudaError_t ${name}_cuda(const T* x, T* out, int64_t n, cudaStream_t stream);
template <typename T> void ${name}_cpu(const T* x, T* out, int64_t n);
}  // namespace kk

#ifdef KERNELKIT_BINDING
#include <kernelkit/torch_glue.h>
namespace kk {
inline at::Tensor $name(const at::Tensor& x) {
  check_floating("$name", x, "x");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = new_output(xc.sizes(), xc);
  KK_DISPATCH_FLOATING(xc.scalar_type(), "$name", [&] {
    if (out.is_cuda()) {
      KK_CUDA_LAUNCH(out.device(), ${name}_cuda(cuda_cptr<scalar_t>(xc), cuda_ptr<scalar_t>(out), out.numel(),
                                                at::cuda::getCurrentCUDAStream()));
    } else {
      ${name}_cpu(cuda_cptr<scalar_t>(xc), cuda_ptr<scalar_t>(out), out.numel());  // the same types as on CUDA
    }
  });
  return out;
}
}  // namespace kk
KERNELKIT_LIBRARY(m) {
  m.def("$name(Tensor x) -> Tensor");  // EDIT: the schema
  KK_IMPL_CPU_CUDA(m, "$name", kk::$name);
  kk::impl_autograd<kk::NoGrad>(m, "$name");  // no backward: refuse inputs that require grad
}
#endif  // KERNELKIT_BINDING
"""

_SPEC_PY = """\
\"\"\"$name card: spec and PyTorch reference (written by kernelkit new). Lines marked EDIT are yours.\"\"\"
import kernelkit
from kernelkit import cardkit


def reference($params):
    return $reference  # EDIT: the op in PyTorch, for check and bench


SPEC = kernelkit.Spec(name="$name", reference=reference, make_inputs=cardkit.elementwise_inputs($n_inputs),
                      grad_inputs=$grad_inputs$sources)  # EDIT: shapes=, bench_sizes=, tolerances=, ... (kernelkit.Spec)


def setup(lib):  # fake kernels (output shapes for torch.compile)
    $fakes


WRONG = {}  # EDIT: buggy versions check must reject, e.g. cardkit.wrong_twins(reference) (kernelkit.cardkit)
"""

_CUSTOM_FAKE = "torch.library.register_fake(lib.qualname(\"$name\"))(lambda x: cardkit.fake_unary(\"$name\", x))"

_TEST_PY = """\
\"\"\"Tests of the $name card (written by kernelkit new): kernelkit's checker (fresh random inputs against the
reference over the spec's shapes, dtypes and strided views, and gradients where the spec has grad_inputs) on
every device here, and a short timing.\"\"\"
from pathlib import Path

import pytest
import torch

import kernelkit

if getattr(kernelkit, "__file__", None) is None:  # a folder named kernelkit on sys.path, not the package
    raise ImportError(f"'kernelkit' here is the folder {list(kernelkit.__path__)[0]} (a clone of kernelkit?), not the "
                      "installed package: run pytest from another directory (python -m pytest puts the current "
                      "one first on sys.path)")

HERE = Path(__file__).resolve().parent
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(device):
    result = kernelkit.check("$name", kernels_dir=HERE, device=device)
    assert result.ok, result.summary()


@pytest.mark.parametrize("device", DEVICES)
def test_bench_runs(device):
    result = kernelkit.bench("$name", kernels_dir=HERE, device=device, sizes=[(1 << 16,)])
    assert "$name" in result.summary()
"""


def validate_name(name: str) -> None:
    """A card name is a C identifier that is neither a C++ nor a Python keyword (it names C++ functions and
    ``kernelkit.ops.<name>``) and does not start with ``test_`` (pytest would collect its spec)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise KernelkitError(f"NAME: expected a C identifier (letters, digits, _; not starting with a digit), got {name!r}")
    if name in _CPP_KEYWORDS or keyword.iskeyword(name) or name.startswith("test_") or name.startswith("__"):
        raise KernelkitError(f"NAME: {name!r} is reserved (a C++ or Python keyword, a test_ or __ prefix): pick another")


def card_files(name: str, kind: str = "unary", backward: bool = False) -> Dict[str, str]:
    """File name -> text of a new card ``name``."""
    validate_name(name)
    if kind not in KINDS:
        raise KernelkitError(f"--kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    if backward and kind != "unary":
        raise KernelkitError(f"--backward: written for --kind unary (a {kind} op's gradient is card-specific: see "
                             "kernels/elementwise_mul.h for a binary one)")
    camel = "".join(part[:1].upper() + part[1:] for part in name.split("_")) or name
    subs = {"name": name, "Name": camel, "NAME": name.upper()}
    apart = f',\n                      sources=["{name}.cu", "{name}_cpu.cpp"]'  # the math's CUDA and CPU files
    if kind == "unary":
        parts = {k: Template(v).substitute(subs) if backward else "" for k, v in _UNARY_BACKWARD.items()}
        if not backward:
            parts["backward_reg"] = Template(_UNARY_NO_BACKWARD["backward_reg"]).substitute(subs)
        files = {f"{name}_math.h": _UNARY_MATH, f"{name}.cu": _UNARY_CU, f"{name}_cpu.cpp": _UNARY_CPU,
                 f"{name}.h": _UNARY_H}
        fakes = f'cardkit.register_elementwise_fakes(lib, "{name}"' + (f', "{name}_backward")' if backward else ")")
        spec = dict(params="x", reference="x * x", n_inputs=1, grad_inputs="(0,)" if backward else "()", fakes=fakes,
                    sources=apart)
    elif kind == "binary":
        parts = {}
        files = {f"{name}_math.h": _BINARY_MATH, f"{name}.cu": _BINARY_CU, f"{name}_cpu.cpp": _BINARY_CPU,
                 f"{name}.h": _BINARY_H}
        spec = dict(params="a, b", reference="a + 2 * b", n_inputs=2, grad_inputs="()",
                    fakes=f'cardkit.register_elementwise_fakes(lib, "{name}")', sources=apart)
    else:
        parts, files = {}, {f"{name}.cu": _CUSTOM_CU, f"{name}.h": _CUSTOM_H}
        spec = dict(params="x", reference="2 * x", n_inputs=1, grad_inputs="()",
                    fakes=Template(_CUSTOM_FAKE).substitute(subs), sources="")
    out = {f: Template(t).substitute(subs, **parts) for f, t in files.items()}
    py = Template(_SPEC_PY).substitute(subs, **spec)
    if kind == "custom":
        py = py.replace("import kernelkit\n", "import torch\n\nimport kernelkit\n", 1)
    return {**out, f"{name}.py": py, f"test_{name}.py": Template(_TEST_PY).substitute(subs)}


def new_card(name: str, directory=".", kind: str = "unary", backward: bool = False) -> List[Path]:
    """Write the card ``name`` into ``directory`` (created if missing); refuses to overwrite any file."""
    files = card_files(name, kind, backward)
    d = Path(directory).expanduser()
    if d.exists() and not d.is_dir():
        raise KernelkitError(f"--dir: {d} exists and is not a directory")
    existing = [f for f in files if (d / f).exists()]
    if existing:
        raise KernelkitError(f"{d / existing[0]} already exists: not overwriting (pick another NAME or --dir)")
    d.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, text in files.items():
        with open(d / fname, "x") as f:  # "x": never overwrite, even when a file appeared meanwhile
            f.write(text)
        written.append(d / fname)
    return written


def cmd_new(args) -> int:
    import shlex

    written = new_card(args.name, args.dir, args.kind, args.backward)
    d = shlex.quote(str(written[0].parent.resolve()))  # absolute: the commands work from any directory
    print(f"wrote {', '.join(p.name for p in written)} in {d}")
    # pytest run from the card's directory: `python -m pytest` puts the current directory first on sys.path, where
    # a folder named kernelkit (a clone's default name) would be imported instead of the package
    print(f"next: kernelkit check {args.name} --kernels-dir {d}\n      kernelkit bench {args.name} --kernels-dir {d}"
          f"\n      cd {d} && python -m pytest test_{args.name}.py")
    return 0


def register(sub) -> None:
    """Add the ``new`` subcommand to the ``kernelkit`` parser's subparsers."""
    p = sub.add_parser("new", help="write a new card (device code, binding, spec + reference, test) to edit",
                       description="Write a complete card that builds, passes `kernelkit check` and runs `kernelkit "
                       "bench` as written; the lines marked EDIT are the ones to change.")
    p.add_argument("name", help="the card's name: a C identifier (it names the op: kernelkit.ops.<name>)")
    p.add_argument("--dir", default=".", help="directory to write into (default: the current one)")
    p.add_argument("--kind", choices=KINDS, default="unary",
                   help="unary or binary elementwise (a functor), or custom (your own __global__ kernel)")
    p.add_argument("--backward", action="store_true", help="unary: add <name>_backward and autograd")
    p.set_defaults(func=cmd_new)
