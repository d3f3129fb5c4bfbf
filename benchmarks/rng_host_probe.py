"""What torch's CUDA generator bookkeeping (philox_cuda_state), a capture-status query and an at::empty
cost per op call: tiny inline ops that do only that and launch an empty kernel, vs torch.add. GPU host:
python benchmarks/rng_host_probe.py"""
import torch

import kernelkit
from kernelkit.harness.timing import host_overhead_us as H

lib = kernelkit.load_inline("genprobe", cuda="__global__ void kk_probe_noop() {}\nvoid launch_noop() { kk_probe_noop<<<1, 32>>>(); }\n", cpp=r'''
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <mutex>
void launch_noop();
void op_plain(const at::Tensor& t) { launch_noop(); }
void op_gen(const at::Tensor& t) {
  auto* g = at::get_generator_or_default<at::CUDAGeneratorImpl>(std::nullopt, at::cuda::detail::getDefaultCUDAGenerator());
  { std::lock_guard<std::mutex> lock(g->mutex_); (void)g->philox_cuda_state(4); }
  launch_noop();
}
void op_capture(const at::Tensor& t) { (void)c10::cuda::currentStreamCaptureStatusMayInitCtx(); launch_noop(); }
at::Tensor op_alloc(const at::Tensor& t) { launch_noop(); return at::empty({1, 1}, t.options()); }
KERNELKIT_LIBRARY(m) {
  m.def("plain(Tensor t) -> ()"); m.def("gen(Tensor t) -> ()"); m.def("capture(Tensor t) -> ()"); m.def("alloc(Tensor t) -> Tensor");
  m.impl("plain", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(op_plain)));
  m.impl("gen", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(op_gen)));
  m.impl("capture", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(op_capture)));
  m.impl("alloc", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(op_alloc)));
}
''')
t = torch.ones(1, device="cuda")
o = lib.ops
fns = {"torch.add": lambda: torch.add(t, t), "plain": lambda: o.plain.default._op(t), "gen": lambda: o.gen.default._op(t),
       "capture": lambda: o.capture.default._op(t), "alloc": lambda: o.alloc.default._op(t)}
best = {}
for _ in range(5):
    for k, f in fns.items():
        best[k] = min(best.get(k, 1e9), H(f, "cuda", calls=200, repeats=5))
for k, v in best.items():
    print(f"{k:10s} {v:6.2f} us")
