// Load a kernelkit card library built ahead of time, register its ops under a namespace of our choosing,
// call them through the dispatcher and compare with libtorch's own operations.
//
//   kk_consumer <path/to/kk_<card>.so> <card> <cpu|cuda>
//
// Each card library exports `int kernelkit_register(const char* ns)` (and `kernelkit_last_error()`).
// Every card exports the same two names, so they are opened with dlopen(RTLD_LOCAL) rather than linked:
// linking two of them into one program would make the names clash.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int failures = 0;

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const bool ok = got.sizes() == want.sizes() && got.scalar_type() == want.scalar_type() &&
                  at::allclose(got.cpu().to(at::kDouble), want.cpu().to(at::kDouble),
                               want.scalar_type() == at::kDouble ? 1e-12 : 1e-5,
                               want.scalar_type() == at::kDouble ? 1e-12 : 1e-6);
  std::printf("%-4s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) {
    ++failures;
    std::printf("     max |diff| = %g\n", (got.cpu().to(at::kDouble) - want.cpu().to(at::kDouble)).abs().max().item<double>());
  }
}

c10::OperatorHandle op(const std::string& ns, const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow((ns + "::" + name).c_str(), "");
}

std::string describe(const char* op, const at::Tensor& t) {
  return std::string(op) + " " + std::string(c10::toString(t.scalar_type())) + " " + c10::str(t.sizes());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <kk_card.so> <card> <cpu|cuda>\n", argv[0]);
    return 2;
  }
  const std::string card = argv[2], device_name = argv[3];
  void* handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  auto reg = reinterpret_cast<int (*)(const char*)>(dlsym(handle, "kernelkit_register"));
  auto last_error = reinterpret_cast<const char* (*)()>(dlsym(handle, "kernelkit_last_error"));
  if (!reg || !last_error) {
    std::fprintf(stderr, "%s exports no kernelkit_register\n", argv[1]);
    return 1;
  }
  const std::string ns = "kk_cpp_" + card;
  if (reg(ns.c_str()) != 0) {
    std::fprintf(stderr, "kernelkit_register(%s) failed: %s\n", ns.c_str(), last_error());
    return 1;
  }
  const at::Device device(device_name == "cuda" ? at::kCUDA : at::kCPU);
  if (device.is_cuda() && !at::hasCUDA()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  at::manual_seed(0);
  const std::vector<std::vector<int64_t>> shapes = {{1}, {7}, {1023}, {4097}, {33, 65}, {0}};
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    for (const auto& shape : shapes) {
      const auto opts = at::TensorOptions().dtype(dtype).device(device);
      const at::Tensor a = at::randn(shape, opts) * 4, b = at::randn(shape, opts);
      if (card == "sigmoid") {
        auto f = op(ns, "sigmoid").typed<at::Tensor(const at::Tensor&)>();
        expect_close(f.call(a), at::sigmoid(a), describe("sigmoid", a));
        // backward through the card's autograd kernel: d/dx sum(sigmoid(x)) = s (1 - s)
        const at::Tensor x = a.detach().requires_grad_(true);
        f.call(x).sum().backward();
        const at::Tensor s = at::sigmoid(a);
        expect_close(x.grad(), s * (1 - s), describe("sigmoid backward", a));
      } else if (card == "vector_add") {
        auto f = op(ns, "vector_add").typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::Scalar&)>();
        expect_close(f.call(a, b, 1), a + b, describe("vector_add", a));
        expect_close(f.call(a, b, 2.5), a + 2.5 * b, describe("vector_add alpha=2.5", a));
      } else if (card == "elementwise_mul") {
        auto f = op(ns, "elementwise_mul").typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
        expect_close(f.call(a, b), a * b, describe("elementwise_mul", a));
      } else {
        std::fprintf(stderr, "no test for card %s\n", card.c_str());
        return 2;
      }
    }
  }
  std::printf("%s on %s: %s\n", card.c_str(), device_name.c_str(), failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
