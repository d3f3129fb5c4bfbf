// kernelkit's C++ glue for the torch-facing binding translation unit.
//
// The loader compiles one binding TU per card header: it defines KERNELKIT_BINDING, includes this file
// and then the card's header. The card registers its ops inside KERNELKIT_LIBRARY(m) { ... }. The
// namespace is chosen at load time (it carries the build's content key), so the compiled binding object
// does not depend on it and is reused across edits of the device code.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#ifdef KERNELKIT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#endif

#include <memory>
#include <string>
#include <vector>

#define KERNELKIT_EXPORT extern "C" __attribute__((visibility("default")))

#ifdef KERNELKIT_WITH_CUDA
// Check a launcher's cudaError_t (launchers return cudaGetLastError() after their launch).
#define KERNELKIT_CUDA_CHECK(expr)                                                              \
  do {                                                                                          \
    cudaError_t kk_err_ = (expr);                                                               \
    TORCH_CHECK(kk_err_ == cudaSuccess, "CUDA error in ", #expr, ": ", cudaGetErrorString(kk_err_)); \
  } while (0)
#endif

namespace kernelkit {
namespace detail {
inline std::vector<std::unique_ptr<torch::Library>>& libraries() {
  static std::vector<std::unique_ptr<torch::Library>> libs;
  return libs;
}
inline std::string& last_error() {
  static std::string err;
  return err;
}
}  // namespace detail
}  // namespace kernelkit

// Registration entry point looked up by the loader with ctypes. Returns 0 on success; on failure the
// message is available through kernelkit_last_error().
#define KERNELKIT_LIBRARY(m)                                                                       \
  static void kernelkit_library_body_(torch::Library& m);                                         \
  KERNELKIT_EXPORT const char* kernelkit_last_error() { return kernelkit::detail::last_error().c_str(); } \
  KERNELKIT_EXPORT int kernelkit_register(const char* ns) {                                       \
    try {                                                                                          \
      auto lib = std::make_unique<torch::Library>(torch::Library::DEF, std::string(ns), std::nullopt, \
                                                  __FILE__, __LINE__);                            \
      kernelkit_library_body_(*lib);                                                               \
      kernelkit::detail::libraries().push_back(std::move(lib));                                   \
      return 0;                                                                                    \
    } catch (const std::exception& e) {                                                            \
      kernelkit::detail::last_error() = e.what();                                                  \
      return 1;                                                                                    \
    }                                                                                              \
  }                                                                                                \
  static void kernelkit_library_body_(torch::Library& m)
