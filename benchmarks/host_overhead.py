"""Host time per call of the seed ops vs torch.add (tiny CUDA tensors, no sync): interleaved rounds, best
round of five each. ``kk ...`` rows are the public kernelkit.ops functions (the fast call path when it is
built); ``torch.ops ...`` rows call the same op through its torch.ops callable, as kernelkit.ops did before
kernelkit.fastcall. Run on a GPU host: python benchmarks/host_overhead.py"""
import torch

import kernelkit
from kernelkit import ops
from kernelkit.harness.timing import host_overhead_us as H
from kernelkit.jit import fastcall

dev = "cuda"
one = torch.ones(1, device=dev)
mu = torch.randn(1, device=dev)
sg = torch.rand(1, device=dev) + 0.5
a = torch.randn(1, device=dev)
out = torch.empty(1, 1, device=dev)
ops.sample_normal(mu, sg, 1)
ops.vector_add(a, a)
ops.sigmoid(a)
ops.elementwise_mul(a, a)
print("fast call path:", "on" if fastcall.module() is not None else f"off ({fastcall.error()})")
va = kernelkit.library("vector_add").ops.vector_add.default._op
sn = kernelkit.library("sample_normal").ops.sample_normal.default._op
rows = {
    "torch.add": lambda: torch.add(one, one),
    "torch.sigmoid": lambda: torch.sigmoid(one),
    "torch.mul": lambda: torch.mul(one, one),
    "torch.randn(1,1)": lambda: torch.randn(1, 1, device=dev),
    "kk vector_add": lambda: ops.vector_add(a, a),
    "kk elementwise_mul": lambda: ops.elementwise_mul(a, a),
    "kk sigmoid": lambda: ops.sigmoid(a),
    "kk sample_normal": lambda: ops.sample_normal(mu, sg, 1),
    "kk sample_normal out=": lambda: ops.sample_normal(mu, sg, 1, out=out),
    "torch.ops vector_add": lambda: va(a, a, 1),
    "torch.ops sample_normal": lambda: sn(mu, sg, 1),
}
best = {}
for _ in range(5):
    for k, f in rows.items():
        best[k] = min(best.get(k, 1e9), H(f, dev, calls=200, repeats=5))
print(torch.cuda.get_device_name(), torch.__version__)
for k, v in best.items():
    print(f"{k:26s} {v:6.2f} us  {v / best['torch.add']:.2f}x torch.add")
