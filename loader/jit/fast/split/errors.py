"""Why a file is built as written: raised anywhere in the split, returned as ``Unsplittable``."""
from __future__ import annotations


class Refuse(Exception):
    def __init__(self, reason: str, line: int = 0):
        super().__init__(reason)
        self.reason = reason
        self.line = line
