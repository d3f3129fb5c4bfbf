"""benchmarks/warm_load_sections.py times loader functions by name: each one it names must exist, or the
benchmark would stop at its first load on the GPU host, where device time is short."""
import importlib
import inspect
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_every_section_names_a_loader_function(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sections = importlib.import_module("warm_load_sections").SECTIONS
    sys.modules.pop("warm_load_sections", None)
    missing = [f"kernelkit.{m}.{n}" for m, n, _ in sections
               if not inspect.isfunction(getattr(importlib.import_module("kernelkit." + m), n, None))]
    assert not missing, missing
    depths = [d for _, _, d in sections]
    assert depths[0] == 0 and all(b <= a + 1 for a, b in zip(depths, depths[1:])), depths  # a tree, in order
