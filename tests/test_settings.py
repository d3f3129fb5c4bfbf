"""kernelkit.settings: one table of every KERNELKIT_* variable, one parse rule per type, its docs table (docs/configuration.md) checked
against it, KERNELKIT_FAST=0 turning every fast path off at its call site, and the warm-plan record keyed on the
settings that change a build only."""
import os
import re
import types
from pathlib import Path

import pytest

from kernelkit import settings
from kernelkit.errors import KernelkitError
from kernelkit.jit.fast import device_rebuild, pch

CONFIGURATION = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
ALL = list(settings.SETTINGS.values())
#: a valid value other than the default, for every setting
OTHER = {
    "KERNELKIT_CACHE_DIR": "/tmp/kk-other-cache", "KERNELKIT_PATH": "/tmp/kk-cards",
    "KERNELKIT_PREBUILT_PATH": "/tmp/kk-pb", "KERNELKIT_ARCH": "8.0;9.0+PTX", "KERNELKIT_NVCC": "/opt/cuda/bin/nvcc",
    "KERNELKIT_COMPILER_LAUNCHER": "ccache", "KERNELKIT_LOCK_TIMEOUT": "60", "KERNELKIT_CACHE_MAX_AGE_DAYS": "7",
    "KERNELKIT_CACHE_MAX_SIZE": "500M",
    "KERNELKIT_VERBOSE": "0", "KERNELKIT_FAST": "off", "KERNELKIT_PCH": "on", "KERNELKIT_DTYPE_SHARDS": "4",
    "KERNELKIT_LINK_STAND_INS": "no", "KERNELKIT_DEVICE_REBUILD": "false", "KERNELKIT_TORCH_CU": "full",
    "KERNELKIT_FASTCALL": "off", "KERNELKIT_PATCH_TORCH": "yes", "KERNELKIT_CAPTURE": "launch", "KERNELKIT_REPORT": "0",
    "KERNELKIT_NCU": "/opt/ncu", "KERNELKIT_COMPILE_COMMANDS": "/tmp/kk-ide", "KERNELKIT_AOT": "1", "KERNELKIT_AOT_OPS": "sigmoid",
    "KERNELKIT_AOT_KERNELS_DIR": "/tmp/kk-aot-cards", "KERNELKIT_AOT_BUILD_DIR": "/tmp/kk-aot-build",
    "KERNELKIT_REMOTE_CACHE": "s3://team-bucket/kk", "KERNELKIT_REMOTE_CACHE_MODE": "read",
    "KERNELKIT_REMOTE_CACHE_REQUIRE": "1", "KERNELKIT_REMOTE_CACHE_TIMEOUT": "2.5",
    "KERNELKIT_REMOTE_CACHE_SECRET": "/tmp/kk-secret", "KERNELKIT_REMOTE_CACHE_SIGNING_KEY": "/tmp/kk-signing.key",
    "KERNELKIT_REMOTE_CACHE_TRUSTED_KEYS": "/tmp/kk-a.pub",
}


@pytest.fixture
def clean(monkeypatch):
    """No KERNELKIT_* setting set (conftest turns some fast paths off for the session)."""
    for name in settings.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# ---------------------------------------------------------------------------------------------- the table
def test_the_table_is_well_formed():
    assert all(s.name.startswith("KERNELKIT_") and s.doc and "\n" not in s.doc for s in ALL)
    assert set(OTHER) == set(settings.SETTINGS)  # a new setting gets a sample value here, and a README row
    assert {s.name for s in ALL if s.changes_build} == {"KERNELKIT_ARCH", "KERNELKIT_NVCC", "KERNELKIT_FAST",
                                                        "KERNELKIT_DTYPE_SHARDS", "KERNELKIT_TORCH_CU"}


def _readme_table():
    """docs/configuration.md's table (README links it): variable -> default."""
    section = CONFIGURATION.read_text()
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `KERNELKIT_")]
    return {re.fullmatch(r"\s*`(\w+)`\s*", r[0]).group(1): r[1].strip() for r in rows}


def test_readme_lists_every_setting_with_its_default():
    assert _readme_table() == {s.name: s.shown_default() for s in ALL}


# ------------------------------------------------------------------------------------------ the parse rule
ON_OFF = [s for s in ALL if s.kind == "bool" or s.kind == "choice" and "off" in s.choices]


@pytest.mark.parametrize("setting", ON_OFF, ids=lambda s: s.name)
@pytest.mark.parametrize("raw", ["0", "off", "false", "no", "OFF", " Off ", "No"])
def test_every_switch_reads_off_as_off(setting, raw, clean):
    clean.setenv(setting.name, raw)
    assert setting.get() in (False, "off")


@pytest.mark.parametrize("setting", [s for s in ALL if s.kind == "bool"], ids=lambda s: s.name)
def test_a_boolean_reads_on_as_on_and_empty_as_its_default(setting, clean):
    for raw in ("1", "on", "true", "yes", "TRUE", " yes\t"):
        clean.setenv(setting.name, raw)
        assert setting.get() is True
    for raw in ("", "  "):
        clean.setenv(setting.name, raw)
        assert setting.get() is setting.default


@pytest.mark.parametrize("setting", [s for s in ALL if s.kind in ("bool", "int", "float", "choice", "size")],
                         ids=lambda s: s.name)
def test_a_bad_value_is_one_line_naming_the_variable(setting, clean):
    clean.setenv(setting.name, "maybe")
    with pytest.raises(KernelkitError) as e:
        setting.get()
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{setting.name}='maybe': expected ")


@pytest.mark.parametrize("name, raw, value", [
    ("KERNELKIT_PCH", "1", "on"), ("KERNELKIT_PCH", "Yes", "on"), ("KERNELKIT_PCH", "auto", "auto"),
    ("KERNELKIT_FASTCALL", "1", "on"), ("KERNELKIT_CAPTURE", "Launch", "launch"), ("KERNELKIT_CAPTURE", "1", "on"),
    ("KERNELKIT_DTYPE_SHARDS", "1", "off"), ("KERNELKIT_DTYPE_SHARDS", "4", "4"),
    ("KERNELKIT_TORCH_CU", "SPLIT", "split"), ("KERNELKIT_VERBOSE", " 2 ", 2), ("KERNELKIT_LOCK_TIMEOUT", "0.3", 0.3),
    ("KERNELKIT_COMPILER_LAUNCHER", " ccache ", "ccache"),
    ("KERNELKIT_CACHE_MAX_SIZE", "500M", 500 << 20), ("KERNELKIT_CACHE_MAX_SIZE", "1.5GB", 3 << 29),
    ("KERNELKIT_CACHE_MAX_SIZE", "off", None), ("KERNELKIT_CACHE_MAX_SIZE", "0", None),
    ("KERNELKIT_CACHE_DIR", "~/kk", Path.home() / "kk"),
    ("KERNELKIT_PATH", f"/a{os.pathsep}{os.pathsep}~/b", (Path("/a"), Path.home() / "b")),
])
def test_each_type_parses_its_values(name, raw, value, clean):
    clean.setenv(name, raw)
    assert settings.SETTINGS[name].get() == value


@pytest.mark.parametrize("name, raw", [("KERNELKIT_LOCK_TIMEOUT", "-1"), ("KERNELKIT_LOCK_TIMEOUT", "nan"),
                                       ("KERNELKIT_CACHE_MAX_AGE_DAYS", "0"), ("KERNELKIT_DTYPE_SHARDS", "8"),
                                       ("KERNELKIT_TORCH_CU", "off"), ("KERNELKIT_VERBOSE", "1.5")])
def test_values_out_of_range_are_refused(name, raw, clean):
    clean.setenv(name, raw)
    with pytest.raises(KernelkitError, match=f"^{name}="):
        settings.SETTINGS[name].get()


def test_a_value_is_read_at_each_access(clean):
    assert settings.VERBOSE.get() == 1
    clean.setenv("KERNELKIT_VERBOSE", "0")
    assert settings.VERBOSE.get() == 0


# ------------------------------------------------------------------------------------------- fast paths
@pytest.mark.parametrize("name", sorted(settings.FAST_PATHS))
def test_fast_turns_each_fast_path_off(name, clean):
    assert settings.fast_path(name)
    for raw in ("0", "off"):
        clean.setenv("KERNELKIT_FAST", raw)
        assert not settings.fast_path(name)


@pytest.mark.parametrize("path", [p for p in settings.FAST_PATHS.values() if p.knob is not None], ids=lambda p: p.name)
def test_each_fast_path_has_its_own_switch_too(path, clean):
    clean.setenv(path.knob.name, "full" if path.off == "full" else "off")
    assert not settings.fast_path(path.name)


def _looked(call) -> bool:
    """Whether ``call`` took its fast path: it returned something true, or reached a probe that fails."""
    try:
        return bool(call())
    except pytest.fail.Exception:
        return True


def _call_sites(monkeypatch):
    """fast path -> whether the code that asks takes it now, each probed without compiling anything."""
    from kernelkit.instant import launcher
    from kernelkit.jit import fastcall, keys, prebuilt, toolchain
    from kernelkit.jit.fast import shards, stand_ins
    from kernelkit.loading import arguments, extensions

    monkeypatch.setattr(toolchain, "is_gcc", lambda: True)
    for name in ("fingerprint", "nvcc_fingerprint"):
        monkeypatch.setattr(toolchain, name, lambda: "compiler")
    monkeypatch.setattr(keys, "host_shape_key", lambda *a: "shape")
    monkeypatch.setattr(stand_ins.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(shards, "_unit_blocker", lambda *a: None)
    monkeypatch.setattr(prebuilt, "prebuilt_dirs", lambda: pytest.fail("looked for prebuilt libraries"))
    monkeypatch.setattr(launcher, "_record", lambda: pytest.fail("read the launcher's record"))
    monkeypatch.setattr(arguments, "_recorded_orders", lambda: {"load": ("recorded",)})
    imported = types.SimpleNamespace(load=lambda name, imported: None)
    monkeypatch.setattr(arguments, "importlib", types.SimpleNamespace(import_module=lambda name: imported))
    monkeypatch.delitem(arguments.sys.modules, "torch.utils.cpp_extension", raising=False)
    monkeypatch.setattr(extensions, "open_extension", lambda *a, **k: None)
    asked = []
    extensions._recalled_or_planned(lambda use_record=False: asked.append(use_record), True, None, True)
    unit = types.SimpleNamespace(kind="cu", digest="d", flags=[], local_dirs=[], deps=[], roots=[], strategy="",
                                 path=types.SimpleNamespace(read_text=lambda errors: ""))
    return {
        "pch": pch.enabled(),
        "device_rebuild": device_rebuild.host_shape(unit) is not None,
        "dtype_shards": shards.count("cu", False, "", [], [], "d") == shards.SHARDS,
        "link_stand_ins": stand_ins.enabled(),
        "fastcall": fastcall.enabled(),
        "prebuilt": _looked(lambda: prebuilt.find_prebuilt(types.SimpleNamespace(name="x"))),
        "warm-plan record": asked == [True],
        "launcher record": _looked(launcher._recorded),
        "torch-signature record": arguments.torch_order.__wrapped__("load") == ("recorded",),
    }


def test_every_call_site_asks_its_fast_path(clean):
    """Each optional path is taken by default and not with KERNELKIT_FAST=0 (the torch .cu split's call site,
    jit.torch_cu, is being moved onto the settings module with the split's rewrite)."""
    clean.setenv("KERNELKIT_DTYPE_SHARDS", "4")  # with any number of CPUs
    on = _call_sites(clean)
    assert all(on.values()), on
    clean.setenv("KERNELKIT_FAST", "0")
    off = _call_sites(clean)
    assert not any(off.values()), off


# ------------------------------------------------------------------------------------------ the warm plan
def _call_key():
    from kernelkit.jit.fast import recall

    return recall.call_key("ext", [Path("/src/ext.cpp")], {"cpp": ["-O2"]}, [], "ext", False)


def test_build_environment_holds_exactly_the_build_settings(clean):
    names = [name for name, _ in settings.build_environment()]
    assert names == [s.name for s in ALL if s.changes_build]
    clean.setenv("KERNELKIT_TORCH_CU", "Full")
    assert ("KERNELKIT_TORCH_CU", "full") in settings.build_environment()


@pytest.mark.parametrize("setting", ALL, ids=lambda s: s.name)
def test_the_warm_plan_key_changes_with_build_settings_only(setting, clean):
    before = _call_key()
    clean.setenv(setting.name, OTHER[setting.name])
    assert (_call_key() != before) is setting.changes_build
    clean.setenv(setting.name, "")  # empty is the default: the same plan as unset
    assert _call_key() == before
