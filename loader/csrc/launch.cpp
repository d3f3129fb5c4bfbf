// _kernelkit_launch: loads NVRTC-compiled cubins and launches their kernels on torch tensors.
//
// Torch-free on purpose (Python.h and the driver API's cuda.h only): it compiles in about a second and
// loads in well under a millisecond, so an instant kernel's warm start never waits for a big module.
// The driver is opened with dlopen (libcuda.so.1 is already loaded by torch), so building it needs no GPU.
// Arguments are packed from the kernel's parsed signature, one code per parameter:
//   p pointer (tensor, int address, None)   b bool   c/C int8/uint8   s/S int16/uint16   i/I int32/uint32
//   l/L int64/uint64   f float   d double   h half   B bfloat16
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cuda.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>

namespace {

PyObject* new_ref(PyObject* o) {  // Py_NewRef is Python 3.10+
  Py_INCREF(o);
  return o;
}

#define KK_STR2(x) #x
#define KK_STR(x) KK_STR2(x)  // expands cuda.h's versioned names (cuCtxGetCurrent -> ..._v2 where it is one)

struct Driver {
  decltype(&cuGetErrorString) GetErrorString = nullptr;
  decltype(&cuLibraryLoadData) LibraryLoadData = nullptr;
  decltype(&cuLibraryGetKernel) LibraryGetKernel = nullptr;
  decltype(&cuKernelGetFunction) KernelGetFunction = nullptr;
  decltype(&cuKernelGetParamInfo) KernelGetParamInfo = nullptr;  // driver 12.4+; optional
  decltype(&cuFuncSetAttribute) FuncSetAttribute = nullptr;
  decltype(&cuFuncGetAttribute) FuncGetAttribute = nullptr;
  decltype(&cuLaunchKernel) LaunchKernel = nullptr;
  decltype(&cuCtxGetCurrent) CtxGetCurrent = nullptr;
  decltype(&cuCtxSetCurrent) CtxSetCurrent = nullptr;
  decltype(&cuDeviceGet) DeviceGet = nullptr;
  decltype(&cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain = nullptr;
  decltype(&cuInit) Init = nullptr;
  bool ready = false;
};
Driver drv;
std::string driver_problem;

bool open_driver() {
  if (drv.ready) return true;
  if (!driver_problem.empty()) return false;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    driver_problem = std::string("the CUDA driver (libcuda.so.1) cannot be opened: ") + dlerror();
    return false;
  }
#define KK_LOAD(field, fn, required)                                                 \
  drv.field = reinterpret_cast<decltype(drv.field)>(dlsym(h, KK_STR(fn)));           \
  if (!drv.field && required) {                                                     \
    driver_problem = "the CUDA driver lacks " KK_STR(fn) " (driver 12.4 or newer needed)"; \
    return false;                                                                   \
  }
  KK_LOAD(GetErrorString, cuGetErrorString, true)
  KK_LOAD(LibraryLoadData, cuLibraryLoadData, true)
  KK_LOAD(LibraryGetKernel, cuLibraryGetKernel, true)
  KK_LOAD(KernelGetFunction, cuKernelGetFunction, true)
  KK_LOAD(KernelGetParamInfo, cuKernelGetParamInfo, false)
  KK_LOAD(FuncSetAttribute, cuFuncSetAttribute, true)
  KK_LOAD(FuncGetAttribute, cuFuncGetAttribute, true)
  KK_LOAD(LaunchKernel, cuLaunchKernel, true)
  KK_LOAD(CtxGetCurrent, cuCtxGetCurrent, true)
  KK_LOAD(CtxSetCurrent, cuCtxSetCurrent, true)
  KK_LOAD(DeviceGet, cuDeviceGet, true)
  KK_LOAD(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, true)
  KK_LOAD(Init, cuInit, true)
#undef KK_LOAD
  if (drv.Init(0) != CUDA_SUCCESS) {
    driver_problem = "cuInit failed: no usable CUDA device";
    return false;
  }
  drv.ready = true;
  return true;
}

PyObject* driver_error(CUresult r, const char* what) {
  const char* s = nullptr;
  if (drv.GetErrorString) drv.GetErrorString(r, &s);
  PyErr_Format(PyExc_RuntimeError, "%s failed: %s (CUresult %d)", what, s ? s : "unknown error", int(r));
  return nullptr;
}

bool need_driver() {
  if (open_driver()) return true;
  PyErr_SetString(PyExc_RuntimeError, driver_problem.c_str());
  return false;
}

// ------------------------------------------------------------------------------------ torch callbacks
PyObject* tensor_type = nullptr;     // torch.Tensor
PyObject* current_stream = nullptr;  // torch._C._cuda_getCurrentRawStream(device) -> int
PyObject* current_device = nullptr;  // torch.cuda.current_device() -> int
PyObject* s_data_ptr = nullptr;
PyObject* s_get_device = nullptr;
PyObject* s_is_contiguous = nullptr;
PyObject* s_dtype = nullptr;
PyObject* s_cuda_stream = nullptr;

PyObject* init(PyObject*, PyObject* args) {
  PyObject *t, *s, *d;
  if (!PyArg_ParseTuple(args, "OOO", &t, &s, &d)) return nullptr;
  Py_XSETREF(tensor_type, new_ref(t));
  Py_XSETREF(current_stream, new_ref(s));
  Py_XSETREF(current_device, new_ref(d));
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_get_device = PyUnicode_InternFromString("get_device");
  s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_cuda_stream = PyUnicode_InternFromString("cuda_stream");
  Py_RETURN_NONE;
}

// ------------------------------------------------------------------------------------------ loading
PyObject* load_library(PyObject*, PyObject* args) {
  Py_buffer image;
  if (!PyArg_ParseTuple(args, "y*", &image)) return nullptr;
  if (!need_driver()) {
    PyBuffer_Release(&image);
    return nullptr;
  }
  CUlibrary lib = nullptr;
  CUresult r = drv.LibraryLoadData(&lib, image.buf, nullptr, nullptr, 0, nullptr, nullptr, 0);
  PyBuffer_Release(&image);
  if (r != CUDA_SUCCESS) return driver_error(r, "cuLibraryLoadData");
  return PyLong_FromVoidPtr(lib);
}

PyObject* get_kernel(PyObject*, PyObject* args) {
  PyObject* lib_obj;
  const char* name;
  if (!PyArg_ParseTuple(args, "Os", &lib_obj, &name)) return nullptr;
  void* lib = PyLong_AsVoidPtr(lib_obj);
  if (PyErr_Occurred() || !need_driver()) return nullptr;
  CUkernel k = nullptr;
  CUresult r = drv.LibraryGetKernel(&k, static_cast<CUlibrary>(lib), name);
  if (r != CUDA_SUCCESS) return driver_error(r, "cuLibraryGetKernel");
  return PyLong_FromVoidPtr(k);
}

bool device_context(int device, CUcontext* ctx);

// [(offset, size), ...] of the kernel's parameters as the cubin records them; None on drivers before 12.4.
// The query loads the kernel, so it runs in `device`'s context.
PyObject* param_info(PyObject*, PyObject* args) {
  PyObject* k_obj;
  int device;
  if (!PyArg_ParseTuple(args, "Oi", &k_obj, &device)) return nullptr;
  void* k = PyLong_AsVoidPtr(k_obj);
  if (PyErr_Occurred() || !need_driver()) return nullptr;
  if (!drv.KernelGetParamInfo) Py_RETURN_NONE;
  CUcontext want, had = nullptr;
  if (!device_context(device, &want)) return nullptr;
  drv.CtxGetCurrent(&had);
  if (had != want) drv.CtxSetCurrent(want);
  PyObject* out = PyList_New(0);
  for (size_t i = 0;; ++i) {
    size_t offset = 0, size = 0;
    CUresult r = drv.KernelGetParamInfo(static_cast<CUkernel>(k), i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
    if (r != CUDA_SUCCESS) {
      Py_DECREF(out);
      if (had != want) drv.CtxSetCurrent(had);
      return driver_error(r, "cuKernelGetParamInfo");
    }
    PyObject* item = Py_BuildValue("(nn)", Py_ssize_t(offset), Py_ssize_t(size));
    PyList_Append(out, item);
    Py_DECREF(item);
  }
  if (had != want) drv.CtxSetCurrent(had);
  return out;
}

// ---------------------------------------------------------------------------------------- launching
struct DeviceState {
  CUcontext ctx = nullptr;
};
std::unordered_map<int, DeviceState> devices;
// (kernel, device) -> the dynamic shared memory the function is allowed so far (loading it on first use)
std::unordered_map<uint64_t, std::unordered_map<int, int>> prepared;

bool device_context(int device, CUcontext* ctx) {
  auto it = devices.find(device);
  if (it != devices.end()) {
    *ctx = it->second.ctx;
    return true;
  }
  CUdevice dev;
  CUresult r = drv.DeviceGet(&dev, device);
  if (r != CUDA_SUCCESS) return driver_error(r, "cuDeviceGet"), false;
  r = drv.DevicePrimaryCtxRetain(ctx, dev);  // the context torch's runtime uses on that device
  if (r != CUDA_SUCCESS) return driver_error(r, "cuDevicePrimaryCtxRetain"), false;
  devices[device].ctx = *ctx;
  return true;
}

// Loads the kernel into the current context before its first launch there (lazy loading inside a CUDA
// graph capture would be a load during capture) and raises its dynamic shared memory limit when asked.
bool prepare(CUkernel k, int device, unsigned shmem) {
  auto& per_device = prepared[reinterpret_cast<uint64_t>(k)];
  auto it = per_device.find(device);
  if (it != per_device.end() && (shmem <= 48 * 1024 || int(shmem) <= it->second)) return true;
  CUfunction f;
  CUresult r = drv.KernelGetFunction(&f, k);
  if (r != CUDA_SUCCESS) return driver_error(r, "cuKernelGetFunction (loading the kernel on this device)"), false;
  int allowed = it == per_device.end() ? 48 * 1024 : it->second;
  if (int(shmem) > allowed) {
    r = drv.FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shmem));
    if (r != CUDA_SUCCESS) {
      int static_smem = 0;
      drv.FuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f);
      PyErr_Format(PyExc_ValueError,
                   "shared_mem=%u bytes is more than this GPU allows the kernel (it also uses %d bytes of static "
                   "shared memory)", shmem, static_smem);
      return false;
    }
    allowed = int(shmem);
  }
  per_device[device] = allowed;
  return true;
}

// A grid may have a 0 dimension (an empty input: nothing is launched); a block may not.
bool dims(PyObject* obj, const char* what, unsigned out[3], long least) {
  out[0] = out[1] = out[2] = 1;
  if (PyLong_Check(obj)) {
    long v = PyLong_AsLong(obj);
    if (v < least || v > 0x7fffffffL) {
      PyErr_Format(PyExc_ValueError, "%s must be an int >= %ld or a tuple of up to 3 such ints, got %R", what, least, obj);
      return false;
    }
    out[0] = unsigned(v);
    return true;
  }
  if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) < 1 || PyTuple_GET_SIZE(obj) > 3) {
    PyErr_Format(PyExc_TypeError, "%s must be an int or a tuple of 1 to 3 ints, got %R", what, obj);
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(obj); ++i) {
    long v = PyLong_AsLong(PyTuple_GET_ITEM(obj, i));
    if ((v == -1 && PyErr_Occurred()) || v < least || v > 0x7fffffffL) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "%s must hold ints >= %ld, got %R", what, least, obj);
      return false;
    }
    out[i] = unsigned(v);
  }
  return true;
}

uint16_t half_bits(float f) {  // round to nearest even, with overflow to inf and subnormals
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504
  if (x < 0x38800000u) {                                   // below the smallest normal half: subnormal
    const float a = std::fabs(f) * 16777216.0f;             // in units of 2^-24
    return uint16_t(sign | uint16_t(std::nearbyint(a)));
  }
  const uint32_t mant = x & 0x1fffu, base = (x - 0x38000000u) >> 13;
  const uint32_t up = mant > 0x1000u || (mant == 0x1000u && (base & 1u));
  return uint16_t(sign | (base + up));
}

uint16_t bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // NaN stays NaN
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

const char* param_name(PyObject* names, Py_ssize_t i) {
  PyObject* n = PyTuple_GET_ITEM(names, i);
  return PyUnicode_AsUTF8(n);
}

// Packs one argument into `slot`. Returns false with a Python exception naming the argument.
bool pack(char code, PyObject* arg, PyObject* dtype, const char* kernel, Py_ssize_t i, PyObject* names,
          uint64_t* slot, int* device) {
  auto fail = [&](PyObject* exc, const char* expected) {
    PyErr_Format(exc, "%s(): argument %zd '%s' expects %s, got %R", kernel, i + 1, param_name(names, i), expected,
                 arg == Py_None ? arg : reinterpret_cast<PyObject*>(Py_TYPE(arg)));
    return false;
  };
  if (code == 'p') {
    if (arg == Py_None) return *slot = 0, true;
    if (PyLong_Check(arg)) {  // a raw device address
      *slot = PyLong_AsUnsignedLongLong(arg);
      return !PyErr_Occurred() || fail(PyExc_ValueError, "a tensor or a device address");
    }
    if (!PyObject_TypeCheck(arg, reinterpret_cast<PyTypeObject*>(tensor_type)))
      return fail(PyExc_TypeError, "a CUDA tensor");
    PyObject* got = PyObject_GetAttr(arg, s_dtype);
    if (!got) return false;
    Py_DECREF(got);  // dtypes are singletons, compared by identity
    if (dtype != Py_None && got != dtype) {
      PyErr_Format(PyExc_TypeError, "%s(): argument %zd '%s' expects a %S tensor, got %S", kernel, i + 1,
                   param_name(names, i), dtype, got);
      return false;
    }
    PyObject* dev = PyObject_CallMethodNoArgs(arg, s_get_device);
    if (!dev) return false;
    const long d = PyLong_AsLong(dev);
    Py_DECREF(dev);
    if (d < 0) {
      PyErr_Format(PyExc_ValueError, "%s(): argument %zd '%s' is a CPU tensor; the kernel runs on a GPU", kernel,
                   i + 1, param_name(names, i));
      return false;
    }
    if (*device < 0) {
      *device = int(d);
    } else if (*device != d) {
      PyErr_Format(PyExc_ValueError, "%s(): argument %zd '%s' is on cuda:%ld, an earlier one on cuda:%d", kernel,
                   i + 1, param_name(names, i), d, *device);
      return false;
    }
    PyObject* contiguous = PyObject_CallMethodNoArgs(arg, s_is_contiguous);
    if (!contiguous) return false;
    const int ok = PyObject_IsTrue(contiguous);
    Py_DECREF(contiguous);
    if (!ok) {
      PyErr_Format(PyExc_ValueError,
                   "%s(): argument %zd '%s' is not contiguous; a pointer parameter sees the storage in order, so "
                   "pass .contiguous()", kernel, i + 1, param_name(names, i));
      return false;
    }
    PyObject* ptr = PyObject_CallMethodNoArgs(arg, s_data_ptr);
    if (!ptr) return false;
    *slot = PyLong_AsUnsignedLongLong(ptr);
    Py_DECREF(ptr);
    return !PyErr_Occurred();
  }
  if (code == 'f' || code == 'd' || code == 'h' || code == 'B') {
    if (!PyFloat_Check(arg) && !PyLong_Check(arg) && !PyBool_Check(arg)) return fail(PyExc_TypeError, "a number");
    const double v = PyFloat_AsDouble(arg);
    if (v == -1.0 && PyErr_Occurred()) return false;
    *slot = 0;
    if (code == 'd') {
      std::memcpy(slot, &v, 8);
    } else if (code == 'f') {
      const float f = float(v);
      std::memcpy(slot, &f, 4);
    } else {
      const uint16_t b = code == 'h' ? half_bits(float(v)) : bf16_bits(float(v));
      std::memcpy(slot, &b, 2);
    }
    return true;
  }
  // integers: Python ints (and objects with __index__) only, range-checked for the declared type
  PyObject* index = PyNumber_Index(arg);
  if (!index) {
    PyErr_Clear();
    return fail(PyExc_TypeError, code == 'b' ? "a bool" : "an int");
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
  unsigned long long u = 0;
  bool negative = v < 0;
  if (overflow > 0) {
    u = PyLong_AsUnsignedLongLong(index);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      Py_DECREF(index);
      return fail(PyExc_OverflowError, "a value that fits its type");
    }
  } else if (overflow < 0) {
    Py_DECREF(index);
    return fail(PyExc_OverflowError, "a value that fits its type");
  }
  Py_DECREF(index);
  long long lo = 0;
  unsigned long long hi = 0;
  int bytes = 0;
  switch (code) {
    case 'b': lo = 0, hi = 1, bytes = 1; break;
    case 'c': lo = INT8_MIN, hi = INT8_MAX, bytes = 1; break;
    case 'C': lo = 0, hi = UINT8_MAX, bytes = 1; break;
    case 's': lo = INT16_MIN, hi = INT16_MAX, bytes = 2; break;
    case 'S': lo = 0, hi = UINT16_MAX, bytes = 2; break;
    case 'i': lo = INT32_MIN, hi = INT32_MAX, bytes = 4; break;
    case 'I': lo = 0, hi = UINT32_MAX, bytes = 4; break;
    case 'l': lo = INT64_MIN, hi = INT64_MAX, bytes = 8; break;
    case 'L': lo = 0, hi = UINT64_MAX, bytes = 8; break;
    default:
      PyErr_Format(PyExc_RuntimeError, "%s(): internal error: unknown parameter code %c", kernel, code);
      return false;
  }
  const bool fits = overflow > 0 ? u <= hi : (v >= lo && (negative || static_cast<unsigned long long>(v) <= hi));
  if (!fits) {
    PyErr_Format(PyExc_OverflowError, "%s(): argument %zd '%s' = %R does not fit its C type", kernel, i + 1,
                 param_name(names, i), arg);
    return false;
  }
  *slot = 0;
  const unsigned long long bits = overflow > 0 ? u : static_cast<unsigned long long>(v);
  std::memcpy(slot, &bits, bytes);  // little-endian: the low bytes are the value
  return true;
}

// launch(kernel, name, codes, dtypes, names, grid, block, shared_mem, stream, args)
PyObject* launch(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 10) {
    PyErr_SetString(PyExc_TypeError, "launch() takes 10 arguments");
    return nullptr;
  }
  CUkernel k = static_cast<CUkernel>(PyLong_AsVoidPtr(a[0]));
  const char* kernel = PyUnicode_AsUTF8(a[1]);
  const char* codes = PyBytes_AS_STRING(a[2]);
  PyObject *dtypes = a[3], *names = a[4], *args = a[9];
  const Py_ssize_t np = PyBytes_GET_SIZE(a[2]);
  if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != np) {
    PyErr_Format(PyExc_TypeError, "%s() takes %zd argument(s), got %zd", kernel, np,
                 PyTuple_Check(args) ? PyTuple_GET_SIZE(args) : Py_ssize_t(-1));
    return nullptr;
  }
  unsigned grid[3], block[3];
  if (!dims(a[5], "grid", grid, 0) || !dims(a[6], "block", block, 1)) return nullptr;
  const long shmem = PyLong_AsLong(a[7]);
  if (shmem < 0 || PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "shared_mem must be a non-negative int, got %R", a[7]);
    return nullptr;
  }
  uint64_t slots[256];
  void* params[256];
  if (np > 256) {
    PyErr_Format(PyExc_ValueError, "%s(): more than 256 parameters", kernel);
    return nullptr;
  }
  int device = -1;
  for (Py_ssize_t i = 0; i < np; ++i) {
    if (!pack(codes[i], PyTuple_GET_ITEM(args, i), PyTuple_GET_ITEM(dtypes, i), kernel, i, names, &slots[i], &device))
      return nullptr;
    params[i] = &slots[i];
  }
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) Py_RETURN_NONE;  // after packing: arguments still checked
  if (!need_driver()) return nullptr;  // after packing: argument errors are reported without a GPU too
  if (device < 0) {  // no tensor among the arguments: the current device
    PyObject* d = PyObject_CallNoArgs(current_device);
    if (!d) return nullptr;
    device = int(PyLong_AsLong(d));
    Py_DECREF(d);
  }
  uint64_t stream = 0;
  if (a[8] == Py_None) {
    PyObject* dev = PyLong_FromLong(device);
    PyObject* s = PyObject_CallOneArg(current_stream, dev);
    Py_DECREF(dev);
    if (!s) return nullptr;
    stream = PyLong_AsUnsignedLongLong(s);
    Py_DECREF(s);
  } else {
    PyObject* s = PyLong_Check(a[8]) ? new_ref(a[8]) : PyObject_GetAttr(a[8], s_cuda_stream);
    if (!s) return nullptr;
    stream = PyLong_AsUnsignedLongLong(s);
    Py_DECREF(s);
  }
  if (PyErr_Occurred()) return nullptr;
  CUcontext want, had = nullptr;
  if (!device_context(device, &want)) return nullptr;
  drv.CtxGetCurrent(&had);
  if (had != want) drv.CtxSetCurrent(want);  // a NULL stream means the current context's
  bool ok = prepare(k, device, unsigned(shmem));
  CUresult r = CUDA_SUCCESS;
  if (ok)
    r = drv.LaunchKernel(reinterpret_cast<CUfunction>(k), grid[0], grid[1], grid[2], block[0], block[1], block[2],
                         unsigned(shmem), reinterpret_cast<CUstream>(stream), params, nullptr);
  if (had != want) drv.CtxSetCurrent(had);
  if (!ok) return nullptr;
  if (r != CUDA_SUCCESS) {
    std::string what = std::string("launching ") + kernel;
    return driver_error(r, what.c_str());
  }
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(tensor_type, current_stream, current_device)"},
    {"load_library", load_library, METH_VARARGS, "load_library(image: bytes) -> CUlibrary handle"},
    {"get_kernel", get_kernel, METH_VARARGS, "get_kernel(library, lowered_name) -> CUkernel handle"},
    {"param_info", param_info, METH_VARARGS, "param_info(kernel, device) -> [(offset, size)] or None"},
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(launch)), METH_FASTCALL,
     "launch(kernel, name, codes, dtypes, names, grid, block, shared_mem, stream, args)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernelkit_launch", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__kernelkit_launch() { return PyModule_Create(&module); }
