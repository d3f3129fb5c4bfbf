"""Seeing inside a kernel: compile reports (registers, spills, shared memory, occupancy), SASS/PTX views, device
printf in the cell, and Nsight Compute profiles (``profile``)."""
from ..device_output import capture
from .compile_report import CompileReport, code, report
from .profiling import ProfileError, ProfileResult, profile

__all__ = ["CompileReport", "ProfileError", "ProfileResult", "capture", "code", "profile", "report"]
