// Launching a card's NVRTC-compiled kernels (Spec.nvrtc_sources) from its binding, by name:
//
//   c10::cuda::CUDAGuard guard(x.device());
//   kk::kernel("scale").launch(blocks, 256, 0, at::cuda::getCurrentCUDAStream(), x_ptr, out_ptr, a, n);
//
// The loader compiles the files in nvrtc_sources with NVRTC (as kernelkit.load_kernels does), loads them for
// the current GPU and hands every kernel's handle to this library through kernelkit_nvrtc_kernels() below,
// again after each edit of those files: an edited kernel never rebuilds or relinks the binding. Torch-free
// (the CUDA runtime only), so any translation unit of the card may launch; errors are std::runtime_error (a
// RuntimeError in Python) naming the kernel and its file.
#pragma once

#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#if !defined(CUDART_VERSION) || CUDART_VERSION < 12000
#error "<kernelkit/kernels.h> needs the CUDA 12 runtime or newer (it launches cudaKernel_t handles)"
#endif

namespace kk {
namespace nvrtc_detail {

struct Param {
  size_t size = 0;   // bytes, as the compiled kernel records them (0: not known)
  std::string decl;  // as declared in the source: "float* x"
};

struct Entry {
  std::string name;          // the name expression: "scale", "axpy<float>"
  std::string source;        // the file it was compiled from, as the user knows it
  void* handle = nullptr;    // a cudaKernel_t (CUkernel): one handle serves every device
  bool params_known = false;
  std::vector<Param> params;
  mutable std::mutex mutex;
  mutable std::unordered_map<int, size_t> shared_allowed;  // device -> dynamic shared memory raised to so far
};

using Kernels = std::unordered_map<std::string, std::shared_ptr<const Entry>>;

struct Table {
  std::mutex mutex;
  Kernels kernels;
  std::string files;  // the card's nvrtc_sources, for messages
  std::string problem = "the loader has handed no NVRTC kernels to this library (does the card's spec list "
                        "nvrtc_sources?)";
};

// One table per shared library (hidden: two cards loaded in one process never share one), swapped whole.
__attribute__((visibility("hidden"))) inline Table& table() {
  static Table t;
  return t;
}

inline std::string demangle(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : type.name();
  std::free(name);
  return out;
}

[[noreturn]] inline void fail(const Entry& e, const std::string& what) {
  throw std::runtime_error("kernelkit: kernel '" + e.name + "' (" + e.source + "): " + what);
}

inline std::string declared(const Entry& e) {
  std::string out;
  for (const auto& p : e.params) out += (out.empty() ? "" : ", ") + p.decl;
  return out;
}

// A launch's arguments are copied to the GPU by size alone: one of another size is garbage there.
inline void check_args(const Entry& e, size_t n, const size_t* sizes, const std::type_info* const* types) {
  if (!e.params_known) return;
  if (n != e.params.size())
    fail(e, "takes " + std::to_string(e.params.size()) + " argument(s) (" + declared(e) + "), got " +
                std::to_string(n));
  for (size_t i = 0; i < n; ++i) {
    const Param& p = e.params[i];
    if (p.size != 0 && p.size != sizes[i])
      fail(e, "argument " + std::to_string(i + 1) + " '" + p.decl + "' is " + std::to_string(p.size) + " bytes, got " +
                  demangle(*types[i]) + " (" + std::to_string(sizes[i]) + " bytes); cast it to the declared type");
  }
}

// "4 float a\n8 float* x\n" (the loader's form) -> {4, "float a"}, {8, "float* x"}
inline std::vector<Param> parse_params(const std::string& text) {
  std::vector<Param> out;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    const size_t space = line.find(' ');
    Param p;
    p.size = std::stoull(line.substr(0, space));
    p.decl = space == std::string::npos ? "" : line.substr(space + 1);
    out.push_back(std::move(p));
    pos = end + 1;
  }
  return out;
}

inline std::string dims(dim3 d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

// Above 48 KB a kernel must be allowed its dynamic shared memory, once per device.
inline void allow_shared(const Entry& e, size_t bytes) {
  int device = 0;
  cudaGetDevice(&device);
  std::lock_guard<std::mutex> lock(e.mutex);
  size_t& allowed = e.shared_allowed[device];
  if (bytes <= allowed) return;
  const cudaError_t err = cudaFuncSetAttribute(e.handle, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (err != cudaSuccess) {
    cudaGetLastError();  // reported here: the card's next launch must not report it again
    fail(e, "shared_mem=" + std::to_string(bytes) + " bytes is more than this GPU allows the kernel (" +
                cudaGetErrorString(err) + ")");
  }
  allowed = bytes;
}

inline void launch(const Entry& e, dim3 grid, dim3 block, size_t shared_mem, cudaStream_t stream, void** args,
                   size_t n, const size_t* sizes, const std::type_info* const* types) {
  check_args(e, n, sizes, types);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // an empty input: nothing to launch
  if (shared_mem > 48 * 1024) allow_shared(e, shared_mem);
  const cudaError_t err = cudaLaunchKernel(static_cast<const void*>(e.handle), grid, block, args, shared_mem, stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail(e, std::string("launch failed: ") + cudaGetErrorString(err) + " (grid " + dims(grid) + ", block " +
                dims(block) + ", shared_mem " + std::to_string(shared_mem) + ")");
  }
}

}  // namespace nvrtc_detail

// One kernel of the card's nvrtc_sources, as compiled when kk::kernel() was called.
class NvrtcKernel {
 public:
  explicit NvrtcKernel(std::shared_ptr<const nvrtc_detail::Entry> entry) : entry_(std::move(entry)) {}

  // Launch on `stream` (e.g. at::cuda::getCurrentCUDAStream(), under a device guard). Each argument must
  // have its parameter's size: a float for `float a`, a pointer for `float* x` (t.data_ptr<float>()). A
  // grid with a 0 dimension launches nothing.
  template <typename... Args>
  void launch(dim3 grid, dim3 block, size_t shared_mem, cudaStream_t stream, const Args&... args) const {
    static_assert((std::is_trivially_copyable<Args>::value && ...),
                  "kk::kernel(...).launch copies its arguments to the GPU as bytes: pass plain values and "
                  "pointers (t.data_ptr<float>() for a tensor)");
    void* ptrs[] = {const_cast<void*>(static_cast<const void*>(&args))..., nullptr};
    const size_t sizes[] = {sizeof(Args)..., 0};
    const std::type_info* types[] = {&typeid(Args)..., nullptr};
    nvrtc_detail::launch(*entry_, grid, block, shared_mem, stream, ptrs, sizeof...(Args), sizes, types);
  }

  const std::string& name() const { return entry_->name; }
  const std::string& source() const { return entry_->source; }
  void* handle() const { return entry_->handle; }

 private:
  std::shared_ptr<const nvrtc_detail::Entry> entry_;
};

// Whether the card's nvrtc_sources have kernel `name` loaded in this process (e.g. to choose a path).
inline bool has_kernel(const std::string& name) {
  auto& t = nvrtc_detail::table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.kernels.count(name) != 0;
}

// Kernel `name` (a name expression: "scale", "axpy<float>") of the card's nvrtc_sources. Throws, naming the
// files and the kernels they have, when there is no such kernel or the kernels are not loaded here.
inline NvrtcKernel kernel(const std::string& name) {
  auto& t = nvrtc_detail::table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.kernels.find(name);
  if (it != t.kernels.end()) return NvrtcKernel(it->second);
  const std::string where = t.files.empty() ? "" : "of " + t.files + " ";
  if (!t.problem.empty())
    throw std::runtime_error("kernelkit: kernel '" + name + "' " + where + "is not loaded: " + t.problem);
  std::vector<std::string> known;
  for (const auto& k : t.kernels) known.push_back(k.first);
  std::sort(known.begin(), known.end());
  std::string listed;
  for (const auto& k : known) listed += (listed.empty() ? "" : ", ") + k;
  throw std::runtime_error("kernelkit: no kernel '" + name + "' in " + t.files + " (kernels: " +
                           (listed.empty() ? "none" : listed) + "); a template instantiation must be listed in "
                           "Spec.nvrtc_sources = {file: [\"name<type>\", ...]}");
}

}  // namespace kk

// The loader's entry point, found with ctypes in the card's library (weak: every translation unit may include
// this header). Replaces the kernel table at once. params[i] holds a line "size declaration" per parameter
// (size 0: not known), or is null when the parameters are not known; problem: why no kernel is loaded here.
extern "C" __attribute__((weak, visibility("default"))) int kernelkit_nvrtc_kernels(
    int n, const char* const* names, void* const* handles, const char* const* sources, const char* const* params,
    const char* files, const char* problem) {
  try {
    kk::nvrtc_detail::Kernels kernels;
    for (int i = 0; i < n; ++i) {
      auto e = std::make_shared<kk::nvrtc_detail::Entry>();
      e->name = names[i];
      e->source = sources[i];
      e->handle = handles[i];
      e->params_known = params[i] != nullptr;
      if (params[i]) e->params = kk::nvrtc_detail::parse_params(params[i]);
      kernels[e->name] = std::move(e);
    }
    auto& t = kk::nvrtc_detail::table();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.kernels.swap(kernels);
    t.files = files ? files : "";
    t.problem = problem ? problem : "";
    return 0;
  } catch (...) {
    return 1;
  }
}
