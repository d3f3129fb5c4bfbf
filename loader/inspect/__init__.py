"""Seeing inside a kernel: compile reports (registers, spills, shared memory, occupancy), SASS/PTX views, device
printf in the cell, and Nsight Compute profiles (``profile``)."""
from .device_output import capture
from .profiling import ProfileError, ProfileResult, profile
from .reports import CompileReport, code, report

__all__ = ["CompileReport", "ProfileError", "ProfileResult", "capture", "code", "profile", "report"]
