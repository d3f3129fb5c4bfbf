"""The channel a strict worker reports through: HMAC-signed frames of JSON and raw tensor bytes on a pipe.

The parent reads a pipe of its own (not the worker's stdout, which the op can print to), checks each frame's
HMAC with a key it handed the worker before the op was imported, and decodes tensors from raw bytes with a
whitelist of dtypes: nothing the worker sends is unpickled, so a forged frame cannot run code in the parent.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import select
import struct
import time
from typing import List, Optional, Tuple

import torch

MAX_FRAME = 1 << 31  # bytes; a larger length is a corrupt or hostile frame, not data
DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}


class ChannelError(Exception):
    """The worker's channel broke: end of file, a bad signature, a timeout."""


def new_key() -> bytes:
    return os.urandom(32)


def encode_tensor(t: torch.Tensor) -> Tuple[dict, bytes]:
    """(descriptor, raw bytes) of a tensor, copied to the CPU in row-major order."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}, raw


def decode_tensor(desc: dict, raw: bytes) -> torch.Tensor:
    dtype = DTYPES.get(desc.get("dtype"))
    if dtype is None:
        raise ChannelError(f"the worker sent a tensor of unknown dtype {desc.get('dtype')!r}")
    shape = [int(s) for s in desc["shape"]]
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


def encode_value(v) -> Tuple[dict, List[bytes]]:
    """A descriptor for one output: a tensor (raw bytes follow), a JSON value, or an unsendable type's name."""
    if isinstance(v, torch.Tensor):
        desc, raw = encode_tensor(v)
        return {"tensor": desc}, [raw]
    try:
        json.dumps(v)
        return {"value": v}, []
    except (TypeError, ValueError):
        return {"type": type(v).__name__}, []


class Writer:
    """The worker's end: ``send(header, blobs)`` writes one signed frame."""

    def __init__(self, fd: int, key: bytes):
        self.fd, self.key = fd, key

    def send(self, header: dict, blobs: Optional[List[bytes]] = None) -> None:
        blobs = blobs or []
        head = json.dumps({**header, "blobs": [len(b) for b in blobs]}).encode()
        body = struct.pack(">I", len(head)) + head + b"".join(blobs)
        mac = hmac.new(self.key, body, hashlib.sha256).digest()
        frame = struct.pack(">Q", len(body)) + mac + body
        view = memoryview(frame)
        while view:
            view = view[os.write(self.fd, view):]


class Reader:
    """The parent's end: ``receive(deadline)`` returns (header, blobs) of the next frame; a timeout, end of file
    or a bad signature raises ChannelError."""

    def __init__(self, fd: int, key: bytes):
        self.fd, self.key, self.buffer = fd, key, bytearray()

    def _fill(self, n: int, deadline: float, idle=None) -> None:
        while len(self.buffer) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelError("timeout")
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if not ready:
                if idle is not None:
                    idle()
                continue
            chunk = os.read(self.fd, max(1 << 16, min(n - len(self.buffer), 1 << 24)))
            if not chunk:
                raise ChannelError("end of file")
            self.buffer += chunk

    def _take(self, n: int) -> bytes:
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    def receive(self, deadline: float, idle=None) -> Tuple[dict, List[bytes]]:
        """``idle()`` is called while waiting (the parent's memory watch)."""
        self._fill(8 + 32, deadline, idle)
        (size,) = struct.unpack(">Q", self._take(8))
        mac = self._take(32)
        if size > MAX_FRAME:
            raise ChannelError(f"a frame of {size} bytes: corrupt or forged")
        self._fill(size, deadline, idle)
        body = self._take(size)
        if not hmac.compare_digest(mac, hmac.new(self.key, body, hashlib.sha256).digest()):
            raise ChannelError("a frame with a bad signature: written by something other than the worker's reporter")
        (hlen,) = struct.unpack(">I", body[:4])
        header = json.loads(body[4:4 + hlen])
        blobs, at = [], 4 + hlen
        for n in header.pop("blobs", []):
            blobs.append(body[at:at + n])
            at += n
        return header, blobs
