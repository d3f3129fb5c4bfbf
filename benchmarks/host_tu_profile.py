"""Where a split torch-style .cu's host TU spends its compile time: g++'s own phase timings (-ftime-report).

For each file, the split's host TU is compiled with torch's host flags three ways: whole, its preamble alone
(the leading torch includes, which kernelkit's precompiled header stands in for), and as kernelkit compiles it
with that preamble precompiled (g++'s own PCH). The preamble's figures are what a precompiled header could
save; the rest (the user's host code: instantiating torch's and pybind11's
templates for it, AT_DISPATCH's lambdas, the binding, optimising and emitting code) is what a host edit pays
with the header precompiled.

Usage: python benchmarks/host_tu_profile.py [--files PATH ...] [--repeat 2] [--out results.json]
(default files: the four .cu styles of benchmarks/cpp_extension_bench.py; compile only, no GPU needed)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "tests/fixtures/torch_ext/sample.cu", ROOT / "tests/fixtures/torch_ext/mul.cu",
         ROOT / "tests/fixtures/torch_cu/lltm_accessor.cu", ROOT / "tests/fixtures/torch_cu/muladd_library.cu"]
#: gcc's phases, and the timers inside them worth a row
PHASES = ("phase parsing", "phase lang. deferred", "phase opt and generate")
TIMERS = ("template instantiation", "|name lookup", "|overload resolution", "callgraph optimization",
          "integrated RA", "expand", "varconst")


def report(text: str) -> dict:
    """{timer: wall seconds} from g++'s -ftime-report (its lines read ``name : usr (%) sys (%) wall (%) GGC``,
    the TOTAL line ``TOTAL : usr sys wall GGC``)."""
    out = {}
    for line in text.splitlines():
        name, colon, rest = line.partition(":")
        fields = rest.replace("(", " ").replace(")", " ").split()
        wall = 2 if name.strip() == "TOTAL" else 4
        if colon and len(fields) > wall:
            try:
                out[name.strip()] = float(fields[wall])
            except ValueError:
                continue
    return out


def compile_timed(cxx: str, flags, source: Path) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([cxx, *flags, "-ftime-report", "-c", str(source), "-o", str(source.with_suffix(".o"))],
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{source}: g++ failed:\n{proc.stderr[-3000:]}")
    return {"wall": wall, **report(proc.stderr)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", nargs="*", type=Path, default=FILES)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    from kernelkit.jit import plan, toolchain
    from kernelkit.jit.fast import torch_headers
    from kernelkit.jit.fast.split import Split, host_flags, local_headers, split_source

    rows = []
    with tempfile.TemporaryDirectory(prefix="kk-host-tu-") as tmp:
        for path in args.files:
            result = split_source(path.read_text(), str(path), local_headers([path.parent]), torch_headers.heavy)
            if not isinstance(result, Split):
                print(f"{path.name}: not split ({result}); skipped")
                continue
            flags = host_flags(plan._torch_style_flags(path.stem, "cu", True, [], ["9.0"], False))
            flags += [f"-iquote{path.parent}"]
            d = Path(tmp) / path.stem
            d.mkdir()
            whole, preamble, rest = d / "host.cpp", d / "preamble.cpp", d / "host_pch.cpp"
            whole.write_text(result.host.whole)
            preamble.write_text(result.host.preamble or result.host.prefix)
            rest.write_text(result.host.text)  # #include <the preamble>, then the rest, as kernelkit compiles it
            header = d / result.host.preamble_name
            header.write_text(result.host.preamble)
            t0 = time.perf_counter()
            subprocess.run([toolchain.cxx(), *flags, "-x", "c++-header", str(header), "-o", f"{header}.gch"],
                           check=True, capture_output=True)
            pch_s = time.perf_counter() - t0
            runs = {kind: [compile_timed(toolchain.cxx(), flags + extra, src) for _ in range(args.repeat)]
                    for kind, src, extra in (("whole", whole, []), ("preamble", preamble, []),
                                             ("with_pch", rest, [f"-I{d}", "-Winvalid-pch"]))}
            med = {kind: {k: statistics.median(r[k] for r in rs if k in r) for k in rs[0]} for kind, rs in runs.items()}
            rows.append({"file": str(path.relative_to(ROOT)), "pch_build": pch_s, **med})
            print(f"{path.name}: whole {med['whole']['wall']:.1f} s, preamble alone {med['preamble']['wall']:.1f} s, "
                  f"with the preamble precompiled {med['with_pch']['wall']:.1f} s (the PCH built in {pch_s:.1f} s)")
            for kind, m in med.items():
                print(f"  {kind:>9} by phase: " + ", ".join(f"{k} {m.get(k, 0):.2f}" for k in (*PHASES, *TIMERS)))
            if args.out:
                Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
