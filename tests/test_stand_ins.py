"""Link stand-ins (kernelkit.jit.fast.stand_ins): a relink whose objects reference nothing new in torch links against
small libraries standing in for torch's. No compiler but g++: the stand-ins of a library defining a function, a
data object, a thread-local and a weak function give the real link's interface, and serve only objects they
cover; unproven stand-ins are never used. CI: a card's kernel edit links against them, gives the interface of
the real link of the same objects, and its library loads and runs its CPU op. GPU: the edited kernel runs."""
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit.frontends import scaffold
from kernelkit.jit import running, toolchain
from kernelkit.jit.fast import stand_ins

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
LIB = """
int fake_fn(int x) { return x + 1; }
int fake_data[4] = {1, 2, 3, 4};
__thread int fake_tls = 5;
__attribute__((weak)) int fake_weak(void) { return 7; }
int fake_extra(void) { return 9; }
int fake_unused(void) { return 11; }
"""
USER = """
int fake_fn(int); extern int fake_data[4]; extern __thread int fake_tls; int fake_weak(void);
int user(int x) { return fake_fn(x) + fake_data[1] + fake_tls + fake_weak(); }
"""


@pytest.fixture(autouse=True)
def _on(monkeypatch):
    monkeypatch.setenv("KERNELKIT_LINK_STAND_INS", "1")
    monkeypatch.setattr(stand_ins, "_RECIPES", {})
    monkeypatch.setattr(stand_ins, "_PROOFS", {})
    if not stand_ins.enabled():
        pytest.skip("needs binutils' nm and readelf")


def _cc(tmp_path: Path, name: str, text: str, *flags: str) -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(text)
    out = tmp_path / name
    subprocess.run([toolchain.cxx(), "-x", "c", "-fPIC", *flags, str(src), "-o", str(out)], check=True)
    return out


def _fake_torch(tmp_path: Path, monkeypatch):
    """libfake.so in a dir that plays torch's library dir, and objects that reference it."""
    lib_dir = tmp_path / "torchlib"
    lib_dir.mkdir()
    _cc(lib_dir, "libfake.so", LIB, "-shared", "-Wl,-soname,libfake.so")
    monkeypatch.setattr(toolchain, "torch_library_paths", lambda cuda: [str(lib_dir)])
    user = _cc(tmp_path, "user.o", USER, "-c")
    extra = _cc(tmp_path, "extra.o", "int fake_extra(void); int more(void) { return fake_extra(); }", "-c")
    ldflags = ["-shared", f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", "-lfake"]
    return ldflags, user, extra


def _real_link(tmp_path: Path, ldflags, objects, out_name: str, trace=()) -> tuple:
    out = tmp_path / out_name
    cmd = [toolchain.cxx(), *map(str, objects), "-o", str(out), *ldflags]
    proc = subprocess.run([*cmd, *trace], capture_output=True, text=True, check=True)
    return cmd, out, proc.stdout + proc.stderr


def test_stand_ins_give_the_real_links_interface_and_serve_only_the_objects_they_cover(tmp_path, monkeypatch):
    ldflags, user, extra = _fake_torch(tmp_path, monkeypatch)
    trace = stand_ins.trace_flags([user], tmp_path)
    cmd, out, said = _real_link(tmp_path, ldflags, [user], "real.so", trace)
    assert stand_ins.wants_recipe("lib", ldflags)
    stand_ins.make_recipe("lib", ldflags, cmd, [user], out, said, tmp_path)
    recipe = stand_ins._RECIPES[("lib", *ldflags)]
    assert recipe is not None, "the stand-in link of the same objects was not proven equal"
    stand_in = recipe.where / "libfake.so"
    kinds = {f[7]: f[3] for f in stand_ins._dynsyms(stand_in) if f[6] != "UND"}
    assert kinds == {"fake_fn": "FUNC", "fake_data": "OBJECT", "fake_tls": "TLS", "fake_weak": "FUNC"}  # no more
    fast = stand_ins.command("lib", ldflags, [*cmd[:-len(ldflags) - 1], str(tmp_path / "fast.so"), *ldflags], [user])
    assert fast is not None and f"-L{recipe.where}" in fast
    subprocess.run(fast, check=True)
    assert stand_ins.interface(tmp_path / "fast.so") == stand_ins.interface(out)
    needed = subprocess.run(["readelf", "-d", str(tmp_path / "fast.so")], capture_output=True, text=True).stdout
    assert "[libfake.so]" in needed
    # an object referencing what the proving link did not (fake_extra) is linked for real
    assert stand_ins.command("lib", ldflags, cmd, [user, extra]) is None
    assert stand_ins.command("other", ldflags, cmd, [user]) is None  # recipes are per library
    monkeypatch.setenv("KERNELKIT_LINK_STAND_INS", "0")
    assert stand_ins.command("lib", ldflags, cmd, [user]) is None and not stand_ins.wants_recipe("x", ldflags)


def test_stand_ins_proven_on_a_thread_after_the_build_removed_its_files(tmp_path, monkeypatch):
    """A build returns while its stand-ins are proven: the proof works on its own links of the objects and
    the library (the build removes its pinned objects and moves the library), and a later link waits for it."""
    ldflags, user, _ = _fake_torch(tmp_path, monkeypatch)
    cmd, out, said = _real_link(tmp_path, ldflags, [user], "real.so", stand_ins.trace_flags([user], tmp_path))
    copy = shutil.copy(user, tmp_path / "kept.o")
    stand_ins.make_recipe_later("lib", ldflags, cmd, [user], out, said)
    user.unlink()
    out.rename(tmp_path / "published.so")
    fast = stand_ins.command("lib", ldflags, [cmd[0], copy, "-o", str(tmp_path / "fast.so"), *ldflags], [Path(copy)])
    assert fast is not None, "the proof did not survive the build's files going away"
    subprocess.run(fast, check=True)
    assert stand_ins.interface(tmp_path / "fast.so") == stand_ins.interface(tmp_path / "published.so")
    assert not any(p.name.startswith("proof-") for p in stand_ins._stand_in_dir().iterdir())  # its scratch is gone


def test_the_proof_leaves_the_built_library_as_it_was(tmp_path, monkeypatch):
    """A warm load stamps a hashed library's identity (inode, size, mtime, ctime): a proof ending after the
    build must not change it, as linking and unlinking a hard link to the library would (its ctime)."""
    ldflags, user, _ = _fake_torch(tmp_path, monkeypatch)
    cmd, out, said = _real_link(tmp_path, ldflags, [user], "real.so", stand_ins.trace_flags([user], tmp_path))
    before = out.stat()
    stand_ins.make_recipe_later("lib", ldflags, cmd, [user], out, said)
    stand_ins._finish_proofs()
    assert stand_ins._RECIPES[("lib", *ldflags)] is not None
    after = out.stat()
    assert (after.st_nlink, after.st_ctime_ns) == (before.st_nlink, before.st_ctime_ns)


def test_a_symbol_the_proving_objects_defined_is_not_covered_once_they_no_longer_do(tmp_path, monkeypatch):
    """own.o defines fake_fn at the proving link, so its stand-in lacks it; objects that leave fake_fn to
    torch again would link it untyped against the stand-ins, which is not the real link's interface."""
    ldflags, user, _ = _fake_torch(tmp_path, monkeypatch)
    own = _cc(tmp_path, "own.o", "int fake_fn(int x) { return x + 2; }", "-c")
    cmd, out, said = _real_link(tmp_path, ldflags, [user, own], "real.so",
                                stand_ins.trace_flags([user, own], tmp_path))
    stand_ins.make_recipe("lib", ldflags, cmd, [user, own], out, said, tmp_path)
    recipe = stand_ins._RECIPES[("lib", *ldflags)]
    assert recipe is not None and "fake_fn" not in recipe.covered
    assert stand_ins.command("lib", ldflags, cmd, [user, own]) is not None  # own.o still defines it
    alone, _, _ = _real_link(tmp_path, ldflags, [user], "alone.so")
    assert stand_ins.command("lib", ldflags, alone, [user]) is None
    subprocess.run(stand_ins._with_stand_ins([*alone[:-len(ldflags) - 1], str(tmp_path / "gap.so"), *ldflags],
                                             recipe.where), check=True)
    assert stand_ins.interface(tmp_path / "gap.so") != stand_ins.interface(tmp_path / "alone.so")  # why


def test_stand_ins_whose_link_differs_are_never_used(tmp_path, monkeypatch):
    ldflags, user, _ = _fake_torch(tmp_path, monkeypatch)
    trace = stand_ins.trace_flags([user], tmp_path)
    cmd, out, said = _real_link(tmp_path, ldflags, [user], "real.so", trace)
    calls = iter(range(100))
    monkeypatch.setattr(stand_ins, "interface", lambda lib: next(calls))  # every library looks different
    stand_ins.make_recipe("lib", ldflags, cmd, [user], out, said, tmp_path)
    assert stand_ins._RECIPES[("lib", *ldflags)] is None
    assert stand_ins.command("lib", ldflags, cmd, [user]) is None
    assert not stand_ins.wants_recipe("lib", ldflags)  # not tried again for these flags


def test_a_library_replaced_since_makes_its_stand_ins_unusable(tmp_path, monkeypatch):
    ldflags, user, _ = _fake_torch(tmp_path, monkeypatch)
    cmd, out, said = _real_link(tmp_path, ldflags, [user], "real.so", stand_ins.trace_flags([user], tmp_path))
    stand_ins.make_recipe("lib", ldflags, cmd, [user], out, said, tmp_path)
    assert stand_ins.command("lib", ldflags, cmd, [user]) is not None
    _cc(tmp_path / "torchlib", "libfake.so", LIB + "int fake_new(void) { return 1; }\n", "-shared")
    assert stand_ins.command("lib", ldflags, cmd, [user]) is None
    assert stand_ins.wants_recipe("lib", ldflags)


def _edit_kernel(d: Path, name: str, old: int, new: int) -> None:
    cu = d / f"{name}.cu"
    line = "out[i] = from_acc<T>(acc_t<T>({}) * to_acc(x[i]));  // EDIT: the kernel"
    assert line.format(old) in cu.read_text()
    cu.write_text(cu.read_text().replace(line.format(old), line.format(new)))


def _spy_links(monkeypatch, keep: Path) -> list:
    """Every link command, with copies of its objects (the build's pinned copies are removed after it)."""
    links, run = [], running.run_tool

    def spy(cmd, what, target, counter):
        output = run(cmd, what, target, counter)
        if counter == "links":
            at = cmd.index("-o")
            objects = [str(shutil.copy(o, keep / f"{len(links)}-{Path(o).name}")) for o in cmd[1:at]]
            links.append([cmd[0], *objects, "-o", cmd[at + 1], *cmd[at + 2:]])
        return output

    monkeypatch.setattr(running, "run_tool", spy)
    return links


@pytest.mark.cuda_build
def test_a_kernel_edit_links_against_stand_ins_with_the_real_links_interface(tmp_path, monkeypatch):
    """The custom scaffold's .cu holds its CPU op, so the stand-in-linked library runs here too."""
    d, keep = tmp_path / "cards", tmp_path / "keep"
    d.mkdir()
    keep.mkdir()
    scaffold.new_card("si_custom", d, "custom")
    links = _spy_links(monkeypatch, keep)
    kernelkit.load("si_custom", kernels_dir=d)
    x = torch.randn(4097, dtype=torch.float64)
    expected = {dt: kernelkit.ops.si_custom(x.to(dt)) for dt in DTYPES}
    _edit_kernel(d, "si_custom", 2, 3)
    before = running.STATS["stand_in_links"]
    lib = kernelkit.load("si_custom", kernels_dir=d)
    assert running.STATS["stand_in_links"] == before + 1
    for dt in DTYPES:  # the host code, the library's dependencies and its op registration, as linked
        assert torch.equal(kernelkit.ops.si_custom(x.to(dt)), expected[dt]), dt
    fast = links[-1]
    at = fast.index("-o")
    real = [a for a in fast if not a.startswith(f"-L{stand_ins._DIR[0]}")]
    real[at + 1] = str(tmp_path / "real.so")
    subprocess.run(real, check=True, capture_output=True)
    assert stand_ins.interface(Path(lib.path)) == stand_ins.interface(tmp_path / "real.so")


@pytest.mark.gpu
def test_on_the_gpu_a_kernel_edit_linked_against_stand_ins_runs_the_new_kernel(tmp_path):
    scaffold.new_card("sig_custom", tmp_path, "custom")
    kernelkit.load("sig_custom", kernels_dir=tmp_path)
    x = torch.randn(1 << 16, dtype=torch.float64, device="cuda")
    for old, factor in ((2, 3), (3, 5)):
        _edit_kernel(tmp_path, "sig_custom", old, factor)
        before = running.STATS["stand_in_links"]
        kernelkit.load("sig_custom", kernels_dir=tmp_path)
        assert running.STATS["stand_in_links"] == before + 1
        for dt in DTYPES:
            got = kernelkit.ops.sig_custom(x.to(dt))
            assert torch.allclose(got.double(), factor * x.to(dt).double(), rtol=1e-2, atol=1e-2), (factor, dt)
