// kernelkit's eager call path for torch ops (the Python module _kernelkit_fastcall).
//
// make(name, overload, fallback) returns a callable for one registered op that turns its Python
// arguments into IValues by the op's schema and calls the dispatcher (boxed). It skips the generic
// argument matching of the torch.ops callable (`fallback`), ~1-2 us per call. Everything after the
// conversion is the dispatcher's own path, so autograd, dispatch modes (FakeTensor, make_fx), vmap,
// the profiler and CUDA graph capture behave exactly as through torch.ops.
//
// What the fast path does not handle goes to `fallback` with the same arguments, so the behaviour and
// the error messages are torch's: tensor subclasses and __torch_function__ modes, JIT tracing, values
// that are not of the exact Python type the schema asks for (numpy scalars, SymInts, ...), unknown or
// missing keywords. Ops with argument or return types outside the list below get no fast callable.
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/utils/pybind.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace {

enum class Kind { Tensor, OptionalTensor, Int, Float, Bool, Scalar, OptionalGenerator };

struct Arg {
  Kind kind;
  bool kwarg_only;
  PyObject* name;  // interned
  std::optional<c10::IValue> default_value;
};

struct Spec {
  c10::OperatorHandle op;
  std::vector<Arg> args;
  size_t returns;
  ~Spec() {  // destroyed with the GIL held
    for (Arg& a : args) Py_XDECREF(a.name);
  }
};

struct FastOp {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* fallback;
  Spec* spec;
};

std::optional<Kind> kind_of(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::TensorType: return Kind::Tensor;
    case c10::TypeKind::IntType: return Kind::Int;
    case c10::TypeKind::FloatType: return Kind::Float;
    case c10::TypeKind::BoolType: return Kind::Bool;
    case c10::TypeKind::NumberType: return Kind::Scalar;
    case c10::TypeKind::OptionalType: {
      const auto elem = type->castRaw<c10::OptionalType>()->getElementType()->kind();
      if (elem == c10::TypeKind::TensorType) return Kind::OptionalTensor;
      if (elem == c10::TypeKind::GeneratorType) return Kind::OptionalGenerator;
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

bool push_tensor(PyObject* o, torch::jit::Stack& stack) {
  if (!THPVariable_CheckExact(o)) return false;  // subclasses may define __torch_function__
  stack.emplace_back(THPVariable_Unpack(o));
  return true;
}

bool push_int(PyObject* o, torch::jit::Stack& stack) {
  if (!PyLong_CheckExact(o)) return false;  // bool, numpy ints, SymInt: torch's rules decide
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  stack.emplace_back(static_cast<int64_t>(v));
  return true;
}

// Appends the IValue for `o`; false when the fallback should decide (never with a Python error set).
bool push(Kind kind, PyObject* o, torch::jit::Stack& stack) {
  switch (kind) {
    case Kind::Tensor: return push_tensor(o, stack);
    case Kind::OptionalTensor:
      if (o == Py_None) {
        stack.emplace_back();
        return true;
      }
      return push_tensor(o, stack);
    case Kind::Int: return push_int(o, stack);
    case Kind::Float:
      if (PyFloat_CheckExact(o)) {
        stack.emplace_back(PyFloat_AS_DOUBLE(o));
        return true;
      }
      if (!push_int(o, stack)) return false;
      stack.back() = c10::IValue(static_cast<double>(stack.back().toInt()));
      return true;
    case Kind::Bool:
      if (o != Py_True && o != Py_False) return false;
      stack.emplace_back(o == Py_True);
      return true;
    case Kind::Scalar:
      if (PyFloat_CheckExact(o)) {
        stack.emplace_back(c10::Scalar(PyFloat_AS_DOUBLE(o)));
        return true;
      }
      if (o == Py_True || o == Py_False) {
        stack.emplace_back(c10::Scalar(o == Py_True));
        return true;
      }
      if (!push_int(o, stack)) return false;
      stack.back() = c10::IValue(c10::Scalar(stack.back().toInt()));
      return true;
    case Kind::OptionalGenerator:
      if (o == Py_None) {
        stack.emplace_back();
        return true;
      }
      if (Py_TYPE(o) != reinterpret_cast<PyTypeObject*>(THPGeneratorClass)) return false;
      stack.emplace_back(reinterpret_cast<THPGenerator*>(o)->cdata);
      return true;
  }
  return false;
}

PyObject* keyword(PyObject* name, PyObject* const* values, PyObject* kwnames, Py_ssize_t nkw) {
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    if (key == name || PyUnicode_Compare(key, name) == 0) return values[k];
  }
  return nullptr;
}

// The stack of IValues for this call, or false when the fallback should take the call.
bool convert(const Spec& spec, PyObject* const* argv, Py_ssize_t nargs, PyObject* kwnames,
             torch::jit::Stack& stack) {
  if (at::impl::torch_function_mode_enabled() || torch::jit::tracer::isTracing()) return false;
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs > static_cast<Py_ssize_t>(spec.args.size())) return false;
  stack.reserve(spec.args.size());
  Py_ssize_t used = 0;
  for (size_t i = 0; i < spec.args.size(); ++i) {
    const Arg& a = spec.args[i];
    PyObject* o = nullptr;
    if (static_cast<Py_ssize_t>(i) < nargs) {
      if (a.kwarg_only) return false;
      o = argv[i];
    } else if (nkw) {
      o = keyword(a.name, argv + nargs, kwnames, nkw);
      used += o != nullptr;
    }
    if (o == nullptr) {
      if (!a.default_value) return false;
      stack.push_back(*a.default_value);
    } else if (!push(a.kind, o, stack)) {
      return false;
    }
  }
  return used == nkw;  // else an unknown or repeated keyword: torch's error
}

PyObject* fast_call(PyObject* self_, PyObject* const* argv, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<FastOp*>(self_);
  HANDLE_TH_ERRORS
  torch::jit::Stack stack;
  if (!convert(*self->spec, argv, PyVectorcall_NARGS(nargsf), kwnames, stack)) {
    stack.clear();
    return PyObject_Vectorcall(self->fallback, argv, nargsf, kwnames);
  }
  {
    pybind11::gil_scoped_release no_gil;  // as torch's own bindings: kernels may block or call back
    self->spec->op.callBoxed(stack);
  }
  const size_t n = self->spec->returns;
  if (n == 0) Py_RETURN_NONE;
  if (n == 1) return THPVariable_Wrap(std::move(stack[0]).toTensor());
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(n));
  if (tuple == nullptr) return nullptr;
  for (size_t i = 0; i < n; ++i) {
    PyObject* t = THPVariable_Wrap(std::move(stack[i]).toTensor());
    if (t == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), t);
  }
  return tuple;
  END_HANDLE_TH_ERRORS
}

void fast_dealloc(PyObject* self_) {
  auto* self = reinterpret_cast<FastOp*>(self_);
  PyObject_GC_UnTrack(self_);
  Py_CLEAR(self->fallback);
  delete self->spec;
  Py_TYPE(self_)->tp_free(self_);
}

int fast_traverse(PyObject* self_, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<FastOp*>(self_)->fallback);
  return 0;
}

int fast_clear(PyObject* self_) {
  Py_CLEAR(reinterpret_cast<FastOp*>(self_)->fallback);
  return 0;
}

PyObject* fast_repr(PyObject* self_) {
  const auto& schema = reinterpret_cast<FastOp*>(self_)->spec->op.schema();
  std::string name = schema.name();
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  return PyUnicode_FromFormat("<kernelkit fast call of %s>", name.c_str());
}

PyObject* fast_get_fallback(PyObject* self_, void*) {
  PyObject* fb = reinterpret_cast<FastOp*>(self_)->fallback;
  if (fb == nullptr) Py_RETURN_NONE;
  Py_INCREF(fb);
  return fb;
}

PyGetSetDef fast_getset[] = {
    {"fallback", fast_get_fallback, nullptr, "the torch.ops callable that takes what the fast path does not", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject FastOpType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// make(name, overload, fallback) -> callable, or None when the schema has types the fast path skips.
PyObject* make(PyObject*, PyObject* args) {
  const char* name = nullptr;
  const char* overload = nullptr;
  PyObject* fallback = nullptr;
  if (!PyArg_ParseTuple(args, "ssO:make", &name, &overload, &fallback)) return nullptr;
  HANDLE_TH_ERRORS
  if (!PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "make: fallback must be callable");
    return nullptr;
  }
  const auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) {
    PyErr_Format(PyExc_ValueError, "make: no registered op %s.%s", name, overload);
    return nullptr;
  }
  auto spec = std::make_unique<Spec>(Spec{*handle, {}, 0});
  const auto& schema = handle->schema();
  if (schema.is_vararg() || schema.is_varret()) Py_RETURN_NONE;
  for (const auto& a : schema.arguments()) {
    const auto kind = kind_of(a.type());
    if (!kind) Py_RETURN_NONE;
    PyObject* key = PyUnicode_InternFromString(a.name().c_str());
    if (key == nullptr) return nullptr;
    spec->args.push_back(Arg{*kind, a.kwarg_only(), key, a.default_value()});
  }
  for (const auto& r : schema.returns()) {
    if (r.type()->kind() != c10::TypeKind::TensorType) Py_RETURN_NONE;
  }
  spec->returns = schema.returns().size();
  FastOp* self = PyObject_GC_New(FastOp, &FastOpType);
  if (self == nullptr) return nullptr;
  self->vectorcall = fast_call;
  Py_INCREF(fallback);
  self->fallback = fallback;
  self->spec = spec.release();
  PyObject_GC_Track(reinterpret_cast<PyObject*>(self));
  return reinterpret_cast<PyObject*>(self);
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"make", make, METH_VARARGS,
     "make(name, overload, fallback): a fast eager callable for the registered op name.overload, or None"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_kernelkit_fastcall", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__kernelkit_fastcall() {
  FastOpType.tp_name = "kernelkit.FastOp";
  FastOpType.tp_basicsize = sizeof(FastOp);
  FastOpType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  FastOpType.tp_vectorcall_offset = offsetof(FastOp, vectorcall);
  FastOpType.tp_call = PyVectorcall_Call;
  FastOpType.tp_dealloc = fast_dealloc;
  FastOpType.tp_traverse = fast_traverse;
  FastOpType.tp_clear = fast_clear;
  FastOpType.tp_repr = fast_repr;
  FastOpType.tp_getset = fast_getset;
  if (PyType_Ready(&FastOpType) < 0) return nullptr;
  return PyModule_Create(&module_def);
}
