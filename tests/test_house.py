"""The package's shape, checked: no import circles and no import that runs back up the layers (imports inside
functions count: a lazy import is still a dependency), short functions, a narrow public face."""
import ast
import warnings
from pathlib import Path

import pytest

import kernelkit

ROOT = Path(kernelkit.__file__).resolve().parent

#: folder or top-level module -> layer: every module is at its folder's layer (no module is declared apart from its
#: folder) and may import its own layer or lower ones, never a higher one
LAYERS = {
    "kernelkit.version": 0, "kernelkit.errors": 0, "kernelkit.diagnostics": 0, "kernelkit.device_output": 0,
    "kernelkit.replace_file": 0, "kernelkit.settings": 0,
    "kernelkit.jit": 1,  # the JIT core: sources, toolchain, cache, cards, plan, build, obtain, nvrtc, registry, ...
    "kernelkit.instant": 2,  # instant kernels, on the JIT core
    "kernelkit.loading": 3, "kernelkit.distributed": 3, "kernelkit.cpp_extension": 3, "kernelkit.aot": 3,
    "kernelkit.patch": 3, "kernelkit.patch_site": 3,
    "kernelkit.ops": 4, "kernelkit.cardkit": 4, "kernelkit.harness": 4, "kernelkit.inspect": 4, "kernelkit.editors": 4,
    "kernelkit.frontends": 5, "kernelkit.__main__": 5,
    "kernelkit": 6,  # the face imports what it exports, lazily
}


def _modules():
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(["kernelkit", *parts])] = p
    return mods


def _edges(mods):
    """module -> the kernelkit modules it imports anywhere in its text (top level or inside functions)."""
    edges = {m: set() for m in mods}
    for m, p in mods.items():
        package = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                found = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                edges[m].update(found or ([target] if target in mods else []))
            elif isinstance(node, ast.Import):
                edges[m].update(a.name for a in node.names if a.name in mods)
        edges[m].discard(m)
    return edges


def _folder(module: str) -> str:
    """The row of ``LAYERS`` a module belongs to: its top-level folder or module under kernelkit."""
    return ".".join(module.split(".")[:2])


def _layer(module):
    return LAYERS[_folder(module)]


def _cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert _cycles(_edges(_modules())) == []


def test_every_folder_has_a_layer_and_only_folders_do():
    folders = {_folder(m) for m in _modules()}
    assert sorted(folders - set(LAYERS)) == [] and sorted(set(LAYERS) - folders) == []


def test_no_import_runs_back_up():
    edges = _edges(_modules())
    upward = sorted(f"{m} ({_layer(m)}) -> {t} ({_layer(t)})" for m, ts in edges.items() for t in ts
                    if _layer(t) > _layer(m))
    assert upward == []


def test_the_scan_sees_function_local_imports():
    """The checks above would pass vacuously if the scan missed imports: it must see lazy ones too."""
    edges = _edges(_modules())
    assert "kernelkit.instant.card_kernels" in edges["kernelkit.loading.cards"]  # imported inside a function
    assert "kernelkit.jit.obtain" in edges["kernelkit.instant.launcher"]


SETTINGS_EXEMPT = ()  # modules allowed to read KERNELKIT_* themselves: none

def _string_names(tree) -> dict:
    """Name -> the strings it may hold: module constants (``ENV = "KERNELKIT_X"``) and loop variables over a
    literal tuple or list of strings (``for var in ("KERNELKIT_X", ...)``)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names.update({t.id: [node.value.value] for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) \
                and isinstance(node.iter, (ast.Tuple, ast.List)):
            names[node.target.id] = [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]
    return names


def _is_environ(node) -> bool:
    return getattr(node, "attr", None) == "environ" or getattr(node, "id", None) == "environ"


def _env_key(node):
    """The expression naming the variable where ``node`` reads or writes the environment by name:
    ``os.environ.get(k)`` (``pop``, ``setdefault``), ``os.getenv(k)``, ``os.environ[k]``, ``k in os.environ``."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = getattr(func, "attr", None) or getattr(func, "id", None)
        if name == "getenv" or name in ("get", "pop", "setdefault") and _is_environ(getattr(func, "value", None)):
            return node.args[0]
    if isinstance(node, ast.Subscript) and _is_environ(node.value):
        return node.slice
    if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
            and _is_environ(node.comparators[0]):
        return node.left
    return None


def _kernelkit_env_reads(tree) -> list:
    names = _string_names(tree)
    found = []
    for node in ast.walk(tree):
        key = _env_key(node)
        held = [key.value] if isinstance(key, ast.Constant) else names.get(getattr(key, "id", None), [])
        if any(isinstance(v, str) and v.startswith("KERNELKIT_") for v in held):
            found.append(node.lineno)
    return found


def _settings_scope():
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel != "settings.py" and not rel.startswith(SETTINGS_EXEMPT):
            yield rel, ast.parse(p.read_text())


def test_only_settings_reads_kernelkit_variables():
    """Every KERNELKIT_* variable is read through kernelkit.settings: one parse rule, one table, one doc."""
    reads = [f"{rel}:{line}" for rel, tree in _settings_scope() for line in _kernelkit_env_reads(tree)]
    assert reads == []


def test_a_settings_name_is_spelled_in_settings_only():
    """Code that writes a variable for children (or passes its name on) names it through its setting."""
    from kernelkit import settings

    spelled = [f"{rel}:{node.lineno} {node.value}" for rel, tree in _settings_scope() for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and node.value in settings.SETTINGS]
    assert spelled == []


@pytest.mark.parametrize("code", [
    'os.environ.get("KERNELKIT_X")', 'os.environ["KERNELKIT_X"]', 'os.getenv("KERNELKIT_X", "1")',
    '"KERNELKIT_X" in os.environ', 'ENV = "KERNELKIT_X"\nos.environ.get(ENV)', 'os.environ.pop("KERNELKIT_X")',
    'for v in ("KERNELKIT_X", "CUDA_HOME"):\n    os.environ.get(v)', 'os.environ.setdefault("KERNELKIT_X", "0")'])
def test_the_settings_rule_sees_every_way_of_reading(code):
    """The rule above would pass vacuously if the scan missed a form of reading the environment."""
    assert _kernelkit_env_reads(ast.parse(code))


def test_the_settings_rule_passes_other_variables():
    assert not _kernelkit_env_reads(ast.parse('os.environ.get("CUDA_HOME")\nKEY = "KERNELKIT_X"\nd.get(KEY)'))


def test_functions_are_short():
    long = []
    for p in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []


def test_a_narrow_face():
    assert len(kernelkit.__all__) <= 33
    for name in kernelkit.__all__:
        assert getattr(kernelkit, name) is not None
    assert not {"jit", "harness", "frontends", "magic", "randn", "elementwise_inputs"} & set(kernelkit.__all__)


@pytest.mark.parametrize("old,new", [("randn", "cardkit"), ("ELEMENTWISE_SHAPES", "cardkit"), ("cache_dir", "cache")])
def test_old_names_work_for_a_release_with_a_warning(old, new):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(kernelkit, old)
    assert value is not None
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)


def test_a_test_run_leaves_nothing_in_the_temporary_directory(tmp_path):
    """The tests' conftest puts everything a run writes to TMPDIR (kernelkit caches, tmp_path, compilers' files)
    into one directory of its own and removes it when the run passes: a run of a test that builds a cache entry
    and uses tmp_path leaves TMPDIR as it found it."""
    import os
    import subprocess
    import sys

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("KK_TEST_RUN_TMPDIR", "KERNELKIT_CACHE_DIR")}
    env["TMPDIR"] = str(tmpdir)
    tests = Path(__file__).resolve().parent
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{tests / 'test_loader_units.py'}::test_cli_cache_commands"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tests.parent)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert list(tmpdir.iterdir()) == []


# --------------------------------------------------------------------------------------------- the fast paths
FAST = "kernelkit.jit.fast"
#: modules outside jit.fast that still name a fast path's module, and why (each one is work left to do)
NAMES_A_FAST_PATH: dict = {}
#: the core a fast path is called by: it must not call back up into it (it is lent what it needs: fast.Core)
CALLERS = {"kernelkit.jit.build", "kernelkit.jit.plan", "kernelkit.jit.obtain", "kernelkit.jit.distributed"}


def _fast_path_modules(mods):
    return {m for m in mods if m.startswith(FAST + ".")}


def test_the_core_reaches_a_fast_path_only_through_the_table():
    """jit.fast's functions are the only way in: no module outside it imports one of its paths by name."""
    mods = _modules()
    edges = _edges(mods)
    named = sorted(f"{m} -> {t}" for m, ts in edges.items() for t in ts & _fast_path_modules(mods)
                   if not m.startswith(FAST) and m not in NAMES_A_FAST_PATH)
    assert named == []
    assert "kernelkit.jit.fast" in edges["kernelkit.jit.build"] and "kernelkit.jit.fast" in edges["kernelkit.jit.plan"]


def test_a_fast_path_never_calls_the_core_that_calls_it():
    mods = _modules()
    edges = _edges(mods)
    upward = sorted(f"{m} -> {t}" for m in _fast_path_modules(mods) | {FAST} for t in edges[m] & CALLERS)
    assert upward == []


def test_every_fast_path_is_in_the_table_with_its_switch_docs_and_test():
    """The table says, per path, its hooks (functions of jit.fast), its switch (a settings.FAST_PATHS entry), the
    docs section with its measured gain (a heading that exists) and its equivalence tests (files that exist)."""
    import re

    from kernelkit import settings
    from kernelkit.jit import fast

    repo = ROOT.parent
    headings = {}
    for row in fast.PATHS:
        assert row.name in settings.FAST_PATHS, row.name
        assert row.hooks and all(callable(getattr(fast, h, None)) for h in row.hooks), row
        doc, _, anchor = row.docs.partition("#")
        if doc not in headings:
            text = (repo / doc).read_text()
            headings[doc] = {re.sub(r"[^\w\- ]", "", h.replace("`", "")).strip().lower().replace(" ", "-")
                             for h in re.findall(r"^#+ (.+)$", text, re.M)}
        assert anchor in headings[doc], row.docs
        assert all((repo / t).is_file() for t in row.test.split()), row.test
    hooks = {h for row in fast.PATHS for h in row.hooks}
    public = {n for n, v in vars(fast).items() if callable(v) and getattr(v, "__module__", "") == fast.__name__
              and not n.startswith("_") and not isinstance(v, type)}
    assert public == hooks  # a hook no path answers, or a path's hook the table does not list


# ------------------------------------------------------------------------------------------ the cache's store table
#: the modules that own the cache's layout (kernelkit.jit.store's table and the cache package) and may join paths
#: onto its root
CACHE_OWNERS = ("jit/cache/", "jit/store.py")


def _calls(node, name: str) -> bool:
    return isinstance(node, ast.Call) and name in (getattr(node.func, "id", None), getattr(node.func, "attr", None))


def _cache_root_joins(tree) -> list:
    """Lines that join a path onto ``cache_dir()``: ``cache_dir() / x``, ``Path(cache_dir()) / x``,
    ``cache_dir().joinpath(x)``, ``os.path.join(cache_dir(), x)``, or any of them through a name bound to the root."""
    roots = set()

    def is_root(node) -> bool:
        return (_calls(node, "cache_dir") or (isinstance(node, ast.Name) and node.id in roots)
                or (_calls(node, "Path") and len(node.args) == 1 and is_root(node.args[0])))

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and is_root(node.value):
            roots.update(t.id for t in node.targets if isinstance(t, ast.Name))
    found = []
    for node in ast.walk(tree):
        divided = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and is_root(node.left)
        joined = _calls(node, "joinpath") and is_root(node.func.value)
        built = (_calls(node, "join") or _calls(node, "Path")) and len(node.args) > 1 and is_root(node.args[0])
        if divided or joined or built:
            found.append(node.lineno)
    return found


def test_only_the_cache_joins_paths_onto_its_root():
    """Every file under the cache belongs to a row of jit.store's table: other modules reach it through
    cache.subdir (a row's folder) or the record functions (cache.record_path, read_record, write_record)."""
    modules = {p.relative_to(ROOT).as_posix(): p for p in sorted(ROOT.rglob("*.py"))}
    joins = [f"{rel}:{line}" for rel, p in modules.items() if not rel.startswith(CACHE_OWNERS)
             for line in _cache_root_joins(ast.parse(p.read_text()))]
    assert joins == []


@pytest.mark.parametrize("code", [
    'cache.cache_dir() / "bandwidth.json"', 'Path(cache_dir()) / "x.json"', 'root = cache.cache_dir()\nroot / "x"',
    'cache.cache_dir().joinpath("x")', 'os.path.join(cache.cache_dir(), "x")', 'Path(cache.cache_dir(), "x")'])
def test_the_cache_rule_sees_every_way_of_joining(code):
    """The rule above would pass vacuously if the scan missed a way of joining a path onto the cache's root."""
    assert _cache_root_joins(ast.parse(code))


def test_the_cache_rule_passes_what_goes_through_the_table():
    assert not _cache_root_joins(ast.parse('cache.subdir("plans") / "x.json"\np.is_relative_to(cache.cache_dir())\n'
                                           'str(cache.cache_dir())\ncache.record_path("toolchain", key)'))
