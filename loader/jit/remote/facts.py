"""The toolchain facts record (``toolchain.facts``: torch's include and library paths, CUDA_HOME, nvcc flags) shared
through the store, signed like an entry: a process whose local cache has none takes the writer's instead of
importing torch.utils.cpp_extension and setuptools to work them out, which was most of an empty-cache load's time.

The record lands in the local cache under its own key (``toolchain.facts_key``: the prefix, torch's file and version,
CUDA_HOME, CUDA_PATH and PATH), where ``toolchain.facts`` trusts it only as far as it trusts one of its own: while the
toolkit files it names have the reader's sizes and mtimes. A machine whose toolkit differs works its facts out.

Layout in a store: ``records/toolchain/<facts key>.json`` = ``{"manifest": "<JSON text>", "signature": {...}}``.
"""
from __future__ import annotations

import json

from . import entries

#: what a facts record may weigh: a few KiB of paths and flags
CAP = 1 << 16


def name(key: str) -> str:
    return f"records/toolchain/{key}.json"


def pack(key: str, record: dict, signer) -> bytes:
    """The signed blob of ``record`` stored as the facts of ``key``."""
    text = json.dumps({"format": entries.FORMAT, "schema": entries.SCHEMA, "kind": "toolchain facts", "key": key,
                       "facts": record}, sort_keys=True)
    return json.dumps({"manifest": text, "signature": signer.sign(text.encode())}).encode()


def verified(raw: bytes, key: str, trusted) -> dict:
    """The facts in ``raw`` if a trusted key signed them as the facts of ``key``; entries.Refused if not."""
    if len(raw) > CAP:
        raise entries.Refused(f"it is over the {CAP >> 10} KiB a facts record may have (not parsed)")
    manifest = entries.signed_manifest(raw, trusted)
    if manifest.get("kind") != "toolchain facts" or manifest.get("key") != key:
        raise entries.Refused(f"it is not the toolchain facts of key {key[:16]} (it says {manifest.get('kind')!r} of "
                              f"{str(manifest.get('key'))[:16]}: moved or wrong key)")
    if not isinstance(manifest.get("facts"), dict):
        raise entries.Refused("its manifest holds no facts")
    return manifest["facts"]
