"""Seeing inside a kernel: compile reports (registers, spills, shared memory, occupancy), SASS/PTX views, and device printf in the cell."""
from .device_output import capture
from .reports import CompileReport, code, report

__all__ = ["CompileReport", "capture", "code", "report"]
