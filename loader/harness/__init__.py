"""Checking and timing ops against their references: specs, check, bench, stats, reports, the runner."""
