"""Two GPUs: every card right on cuda:1 while cuda:0 is current, a DDP training step over NCCL whose model
uses kernelkit ops (with autograd) against the same step in pure PyTorch, and group= over NCCL.

Skipped on a host with fewer than two GPUs. Run as a script, this file is one NCCL rank:
``python test_multi_gpu.py ROOT RANK WORLD``."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
WORLD = 2
KERNEL = 'extern "C" __global__ void scale(float* x, float a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }'

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]


# ------------------------------------------------------------------------------------ cards on cuda:1
def _card_names():
    import kernelkit

    return sorted(kernelkit.cards())


@pytest.mark.parametrize("name", _card_names() if torch.cuda.device_count() >= 2 else [])
def test_every_card_is_right_on_cuda_1_while_cuda_0_is_current(name):
    import kernelkit

    torch.cuda.set_device(0)
    result = kernelkit.check(name, device="cuda:1")
    assert result.ok, result
    assert torch.cuda.current_device() == 0  # the ops' device guards restored it


# ------------------------------------------------------------------------------------- one NCCL rank
def _model(ops: bool) -> torch.nn.Module:
    import kernelkit

    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(64, 64)
            self.gate = torch.nn.Parameter(torch.randn(64))

        def forward(self, x):
            h = self.linear(x)
            if ops:
                return kernelkit.ops.elementwise_mul(kernelkit.ops.sigmoid(h), self.gate.expand_as(h).contiguous())
            return torch.sigmoid(h) * self.gate.expand_as(h)

    torch.manual_seed(0)
    return Gated()


def _ddp_step(ops: bool, rank: int) -> dict:
    """One SGD step of a DDP model on this rank's batch; the parameters after it."""
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_model(ops).cuda(rank), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator(device=f"cuda:{rank}").manual_seed(100 + rank)
    x = torch.randn(32, 64, device=f"cuda:{rank}", generator=g)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    return {k: v.detach().cpu().double().tolist() for k, v in model.module.state_dict().items()}


def worker(root: Path, rank: int, world: int) -> None:
    import torch.distributed as dist

    import kernelkit

    os.environ["KERNELKIT_CACHE_DIR"] = str(root / f"rank{rank}" / "cache")  # no shared filesystem
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{root / 'store'}", rank=rank, world_size=world)
    mod = kernelkit.load_kernels(KERNEL, name="scaling", group=dist.group.WORLD)
    x = torch.ones(8, device=f"cuda:{rank}")
    mod.scale[1, 32](x, 3.0, 8)
    out = {"kernels_cached": mod.cached, "scaled": x.tolist(),
           "ops": _ddp_step(True, rank), "torch": _ddp_step(False, rank)}
    (root / f"result{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def nccl_job(tmp_path_factory):
    root = tmp_path_factory.mktemp("nccl")
    procs = [subprocess.Popen([sys.executable, str(HERE), str(root), str(r), str(WORLD)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for r in range(WORLD)]
    logs = [p.communicate(timeout=600)[0].decode(errors="replace")[-3000:] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, logs
    return [json.loads((root / f"result{r}.json").read_text()) for r in range(WORLD)]


def test_a_ddp_step_with_kernelkit_ops_matches_pure_pytorch(nccl_job):
    for rank in nccl_job:
        assert rank["ops"].keys() == rank["torch"].keys()
        for name in rank["ops"]:
            torch.testing.assert_close(torch.tensor(rank["ops"][name]), torch.tensor(rank["torch"][name]),
                                       rtol=1e-5, atol=1e-6)
    # DDP averaged the gradients: both ranks hold the same parameters
    assert nccl_job[0]["ops"] == nccl_job[1]["ops"]


def test_group_over_nccl_compiles_once_and_runs_on_each_gpu(nccl_job):
    assert [r["kernels_cached"] for r in nccl_job] == [False, True]
    assert all(r["scaled"] == [3.0] * 8 for r in nccl_job)


if __name__ == "__main__":
    worker(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
