"""The torch-style .cu corpus on the GPU: every file built by torch's own loader and by kernelkit (split where
the split applies, as written where it does not) gives the same outputs, bit for bit, the same Python-visible
names and docstrings; a file that does not compile fails in both, kernelkit citing the user's line.

torch's build runs in a child process: a TORCH_LIBRARY namespace can be defined once per process."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit.errors import BuildError

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "torch_cu"))
from cases import CASES, HERE  # noqa: E402

pytestmark = pytest.mark.gpu

CHILD = textwrap.dedent("""
    import json, sys, torch
    from torch.utils import cpp_extension
    sys.path.insert(0, {here!r})
    from cases import CASES
    case = CASES[{file!r}]
    module = cpp_extension.load({name!r}, [{path!r}], extra_cuda_cflags=list(case.cuda_flags),
                                is_python_module=case.pybind, build_directory={build!r})
    module = module if case.pybind else None
    outputs = case.run(module, "cuda")
    torch.cuda.synchronize()
    torch.save([o.cpu() if isinstance(o, torch.Tensor) else o for o in outputs], {out!r})
    names = sorted(n for n in dir(module) if not n.startswith("_")) if module is not None else []
    docs = {{n: getattr(module, n).__doc__ for n in names}} if module is not None else {{}}
    json.dump({{"names": names, "docs": docs}}, open({meta!r}, "w"))
""")


def _torchs(file: str, name: str, tmp_path: Path):
    build = tmp_path / "torch_build"
    build.mkdir()
    out, meta = tmp_path / "torch_out.pt", tmp_path / "torch_meta.json"
    code = CHILD.format(here=str(HERE), file=file, name=name, path=str(HERE / file), build=str(build), out=str(out),
                        meta=str(meta))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        return None, proc.stderr[-4000:]
    return (torch.load(out), json.loads(meta.read_text())), ""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("file", sorted(CASES))
def test_same_results_as_torchs_own_build(file, tmp_path, monkeypatch, capfd):
    case = CASES[file]
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "kk_cache"))  # a build, so its path is said
    name = "kk_corpus_" + Path(file).stem
    theirs, error = _torchs(file, name, tmp_path)
    if case.run is None:  # a file with an error in it: both builds fail, kernelkit citing the user's line
        assert theirs is None
        with pytest.raises(BuildError) as e:
            kernelkit.load(name, [str(HERE / file)], extra_cuda_cflags=list(case.cuda_flags),
                           is_python_module=case.pybind)
        assert f"{file}:{case.error_line}" in str(e.value), str(e.value)
        return
    assert theirs is not None, error
    outputs, meta = theirs
    ours = kernelkit.load(name, [str(HERE / file)], extra_cuda_cflags=list(case.cuda_flags),
                          is_python_module=case.pybind)
    said = capfd.readouterr().err
    assert ("split (" in said) == (case.decision == "split"), said  # the path the CPU tests expect ran here
    module = ours if case.pybind else None
    mine = case.run(module, "cuda")
    torch.cuda.synchronize()
    assert len(mine) == len(outputs)
    for i, (a, b) in enumerate(zip(mine, outputs)):
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape, (i, a.dtype, b.dtype, a.shape, b.shape)
            assert torch.equal(a.cpu(), b) or (a.isnan().any() and torch.equal(a.cpu().nan_to_num(), b.nan_to_num())), \
                f"output {i} of {file} differs from torch's build: max |diff| {(a.cpu() - b).abs().max()}"
        else:
            assert a == b, (i, a, b)
    if module is not None:
        names = sorted(n for n in dir(module) if not n.startswith("_"))
        assert names == meta["names"]
        assert {n: getattr(module, n).__doc__ for n in names} == meta["docs"]



@pytest.mark.parametrize("file, old, new, call, before, after", [
    ("relu_extension.cu", "v * slope;", "v * slope * 3.0f;", lambda m, x: m.leaky_relu(x, 0.1),
     lambda x: torch.where(x > 0, x, x * 0.1), lambda x: torch.where(x > 0, x, x * 0.1 * 3.0)),
    ("thrust_sort.cu", "y[i] = fabsf(x[i]);", "y[i] = -fabsf(x[i]);", lambda m, x: m.sorted_abs(x),
     lambda x: torch.sort(x.abs()).values, lambda x: torch.sort(-x.abs()).values),
])
def test_a_kernel_body_edit_runs_the_new_device_code(file, old, new, call, before, after, tmp_path, monkeypatch,
                                                     capfd):
    """Only the device code is compiled: a split's device TU (its host TU cached), or, for a file built as written,
    the device code placed into the earlier object. The library that loads runs the edited kernel."""
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "kk_cache"))
    src = tmp_path / file
    src.write_text((HERE / file).read_text())
    x = torch.randn(4097, device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    torch.testing.assert_close(call(kernelkit.load("kk_swap_" + src.stem, [str(src)]), x), before(x))
    capfd.readouterr()
    src.write_text(src.read_text().replace(old, new))
    edited = kernelkit.load("kk_swap_" + src.stem, [str(src)])
    said = capfd.readouterr().err
    assert ("host TU cached" if CASES[file].decision == "split" else "device code only") in said, said
    torch.testing.assert_close(call(edited, x), after(x))
