"""Host time per call of the seed ops vs torch.add (tiny CUDA tensors, no sync): interleaved rounds, best
round of five each. Run on a GPU host: python benchmarks/host_overhead.py"""
import torch, kernelkit
from kernelkit import ops
from kernelkit.bench import host_overhead_us as H

dev = "cuda"
one = torch.ones(1, device=dev)
mu = torch.randn(1, device=dev); sg = torch.rand(1, device=dev) + 0.5
a = torch.randn(1, device=dev)
ops.sample_normal(mu, sg, 1); ops.vector_add(a, a); ops.sigmoid(a)
fast = ops._FAST["sample_normal"]["sample_normal"]
fast_out = ops._FAST["sample_normal"]["sample_normal_out"]
fva = ops._FAST["vector_add"]["vector_add"]
out = torch.empty(1, 1, device=dev)
rows = {
    "torch.add": lambda: torch.add(one, one),
    "torch.sigmoid": lambda: torch.sigmoid(one),
    "torch.randn(1,1)": lambda: torch.randn(1, 1, device=dev),
    "kk vector_add": lambda: ops.vector_add(a, a),
    "fast vector_add": lambda: fva(a, a, 1),
    "kk sigmoid": lambda: ops.sigmoid(a),
    "kk sample_normal": lambda: ops.sample_normal(mu, sg, 1),
    "fast sample_normal": lambda: fast(mu, sg, 1),
    "fast sample_normal_out": lambda: fast_out(mu, sg, out),
}
best = {}
for _ in range(5):
    for k, f in rows.items():
        best[k] = min(best.get(k, 1e9), H(f, dev, calls=200, repeats=5))
for k, v in best.items():
    print(f"{k:26s} {v:6.2f} us  {v / best['torch.add']:.2f}x torch.add")
