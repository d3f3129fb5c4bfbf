"""What kernelkit.check found: one :class:`Case` per op call (or gradcheck, statistics or contract run),
gathered in a :class:`CheckResult` that prints as a table and says where each failure was."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import torch

from ..errors import KernelkitError
from . import report
from .compare import Mismatch, dtype_name


class CheckError(KernelkitError, AssertionError):
    """``CheckResult.raise_for_status()``: the op disagrees with its reference; ``.result`` has details."""

    def __init__(self, result: "CheckResult"):
        self.result = result
        super().__init__(result.message())


@dataclasses.dataclass
class Case:
    """One call of the op (or one gradcheck / statistics / contract run) and what was found."""

    kind: str  # values | stats | seeding | gradcheck | backward | contract
    dtype: Optional[torch.dtype]
    shape: tuple
    layout: str  # for a contract case: the contract's name
    trial: int
    seed: int
    ok: bool = True
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    max_abs64: Optional[float] = None
    max_rel64: Optional[float] = None
    min_p: Optional[float] = None
    #: output values compared with the reference (elements; 1 per non-tensor output)
    compared: int = 0
    messages: List[str] = dataclasses.field(default_factory=list)
    mismatches: List[Mismatch] = dataclasses.field(default_factory=list)
    #: the exception's type name when the op raised instead of returning (a failed launch, not a wrong value)
    raised: Optional[str] = None

    def fail(self, message: str) -> None:
        self.ok = False
        self.messages.append(message)

    def op_raised(self, error: BaseException) -> None:
        text = str(error).strip()
        self.raised = type(error).__name__
        self.fail(f"the op raised {self.raised}: {text.splitlines()[0] if text else ''}")

    def title(self) -> str:
        return (f"{self.kind} {dtype_name(self.dtype)} shape {report.fmt_shape(self.shape)} {self.layout}"
                f" trial {self.trial} (seed {self.seed})")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["dtype"] = dtype_name(self.dtype)
        d["mismatches"] = [dict(m.__dict__, index=list(m.index)) for m in self.mismatches]
        return d


def _worst(cases: List[Case], attr: str, fn=max) -> str:
    vals = [getattr(c, attr) for c in cases if getattr(c, attr) is not None]
    return report.fmt_num(fn(vals)) if vals else "-"


@dataclasses.dataclass
class CheckResult:
    name: str
    device: str
    cases: List[Case]
    elapsed_s: float = 0.0
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def compared(self) -> int:
        """Output values of the op compared with the reference's (values and statistics cases)."""
        return sum(c.compared for c in self.cases)

    @property
    def status(self) -> str:
        """"ok", "FAIL" (a case failed) or "nothing checked" (no case failed, but no output value was
        compared: every shape empty, or every input rejected by both op and reference)."""
        if self.failures:
            return "FAIL"
        return "ok" if self.compared else "nothing checked"

    @property
    def ok(self) -> bool:
        """True only when no case failed and at least one output value was compared."""
        return self.status == "ok"

    @property
    def failures(self) -> List[Case]:
        return [c for c in self.cases if not c.ok]

    def raise_for_status(self) -> "CheckResult":
        if not self.ok:
            raise CheckError(self)
        return self

    def summary(self) -> str:
        n, bad = len(self.cases), len(self.failures)
        verdict = {"ok": "ok", "FAIL": f"FAIL ({bad} of {n} cases)",
                   "nothing checked": "NOTHING CHECKED (0 output values compared)"}[self.status]
        return f"check {self.name} on {self.device}: {verdict}, {n} cases in {self.elapsed_s:.2f}s"

    HEADERS = ("check", "dtype", "cases", "shapes", "max abs", "max rel", "f64 abs", "f64 rel", "min p", "status")

    def rows(self) -> List[list]:
        groups: Dict[tuple, List[Case]] = {}
        for c in self.cases:
            groups.setdefault((c.kind, dtype_name(c.dtype)), []).append(c)
        rows = []
        for (kind, dtype), cs in groups.items():
            bad = sum(not c.ok for c in cs)
            status = "ok" if not bad else f"FAIL {bad}/{len(cs)}"
            rows.append([kind, dtype, len(cs), len({c.shape for c in cs}), _worst(cs, "max_abs"), _worst(cs, "max_rel"),
                         _worst(cs, "max_abs64"), _worst(cs, "max_rel64"), _worst(cs, "min_p", min), status])
        return rows

    def details(self, max_cases: int = 3) -> str:
        """The failures, readable: which case (kind, dtype, shape, layout, seed), what was wrong, where.
        One failing case per distinct (kind, shape) first, so a pattern (e.g. always the last index) shows;
        every failed contract is shown (each names a different promise the op breaks)."""
        firsts = list({(c.kind, c.shape, c.layout if c.kind == "contract" else ""): c
                       for c in reversed(self.failures)}.values())[::-1]
        contracts = sum(c.kind == "contract" for c in firsts)
        shown = (firsts + [c for c in self.failures if c not in firsts])[:max(max_cases, contracts + 1)]
        lines = []
        for c in shown:
            lines.append(f"- {c.title()}:")
            lines += [f"    {m}" for m in c.messages]
        if len(self.failures) > len(shown):
            lines.append(f"... and {len(self.failures) - len(shown)} more failing cases")
        if self.status == "nothing checked":
            lines.append("- no output value was compared with the reference: every shape is empty, or the op and the "
                         "reference rejected every input; give shapes with elements")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def message(self) -> str:
        return self.summary() + "\n" + self.details()

    def __repr__(self) -> str:
        text = report.text_table(self.HEADERS, self.rows())
        return self.summary() + "\n" + text + ("\n" + self.details() if not self.ok or self.notes else "")

    def _repr_html_(self) -> str:
        details = self.details() if not self.ok or self.notes else ""
        return report.html_table(self.HEADERS, self.rows(), title=self.summary(), details=details)

    def to_dict(self) -> dict:
        return {"name": self.name, "device": self.device, "ok": self.ok, "status": self.status,
                "compared": self.compared, "elapsed_s": self.elapsed_s,
                "notes": self.notes, "rows": [dict(zip(self.HEADERS, r)) for r in self.rows()],
                "failures": [c.to_dict() for c in self.failures[:20]], "message": self.message()}
