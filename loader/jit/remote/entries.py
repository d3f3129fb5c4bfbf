"""A remote cache entry: the blobs it is made of, and the signed manifest that says what they must be.

Layout in a store, named by the target's cache key (which covers sources, headers, flags, archs, toolchain and
torch already)::

    <key>/files/<sha256>    each file of the entry (the library), named by its content
    <key>/entry.json        {"manifest": "<manifest JSON text>", "signature": {scheme, key_id, signature}}

The manifest records the schema, the key, the library's name, each file's name, sha256 and size, and the
toolchain, torch and archs it was built with. ``entry.json`` is written last and whole, and files are named by
their content, so two writers publishing the same key at once never mix one's manifest with the other's bytes.
A reader checks the signature over the manifest text as stored, then that the manifest is this target's, then
every file's size and sha256 as it arrives: any failure is :class:`Refused` with a one-line reason. What a reader
takes from the store is bounded before anything is parsed or hashed: an ``entry.json`` by :data:`MANIFEST_CAP`, a
file by the size its (verified) manifest declares; the store reads at most one byte beyond either.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Dict, List, Tuple

SCHEMA = 1
FORMAT = "kernelkit-remote-cache"
ENTRY = "entry.json"
#: the most bytes an entry.json may have: one over it is refused unparsed (a real one is a few KiB, a label and a
#: 16-digit digest per source and header)
MANIFEST_CAP = 1 << 20
#: what a name pointer holds: a 64-digit key
POINTER_CAP = 64
_SHA256 = re.compile(r"[0-9a-f]{64}")


class Refused(Exception):
    """An entry that must not be used; the message is the one-line reason."""


def entry_name(key: str) -> str:
    return f"{key}/{ENTRY}"


def file_name(key: str, sha256: str) -> str:
    return f"{key}/files/{sha256}"


def _environment(target) -> dict:
    from .. import prebuilt, toolchain

    lines = dict(line.split("=", 1) for line in toolchain.fingerprint().splitlines() if "=" in line)
    return {"toolchain": lines, "torch": lines.get("torch"), "archs": prebuilt.target_archs(target)}


def name_pointer(name: str) -> str:
    """Where the key of the latest entry published for ``name`` is kept: a hint for explaining a miss (the entry it
    points to is verified like any other before its manifest is read)."""
    return f"names/{name}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def inputs(target) -> Dict[str, str]:
    """What a build is made of, by label (each source and header by content, each unit's flags, the link flags,
    the archs, each line of the toolchain): what a miss compares with the nearest stored entry."""
    from .. import cache

    found = {f"toolchain {k}": v for k, v in _environment(target)["toolchain"].items()}
    found["archs"] = ",".join(_environment(target)["archs"]) or "no GPU"
    for u in target.units:
        found[f"source {u.display}"] = _digest(cache.source_bytes(u.path))
        found[f"flags of {u.display}"] = _digest(json.dumps(u.flags).encode())
        for d in u.deps:
            found[f"header {target.display.get(str(d), d.name)}"] = _digest(cache.source_bytes(d))
    found["link flags"] = _digest(json.dumps(target.ldflags).encode())
    return found


def differences(theirs: Dict[str, str], ours: Dict[str, str]) -> List[str]:
    """The inputs that differ, in words: a toolchain line with both values, a file or flag by its label."""
    out = []
    for label in dict.fromkeys([*ours, *theirs]):
        there, here = theirs.get(label), ours.get(label)
        if there == here:
            continue
        if there is None or here is None:
            out.append(f"{label} ({'only here' if there is None else 'only there'})")
        elif label.startswith("toolchain ") or label == "archs":
            out.append(f"{label} ({there} there, {here} here)")
        else:
            out.append(label)
    return out


def pack(target, so: Path, signer, build_seconds: float = 0.0) -> List[Tuple[str, bytes]]:
    """(name in the store, bytes) of each blob of ``target``'s entry, in the order to write them: files first,
    the signed manifest last."""
    data = so.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    manifest = {"format": FORMAT, "schema": SCHEMA, "key": target.key, "name": target.name, "so": target.so_name,
                "pymodule": target.pymodule, "files": [{"name": target.so_name, "sha256": sha, "size": len(data)}],
                "created": time.time(), "build_seconds": round(build_seconds, 3), "inputs": inputs(target),
                **_environment(target)}
    text = json.dumps(manifest, sort_keys=True)
    entry = {"manifest": text, "signature": signer.sign(text.encode())}
    return [(file_name(target.key, sha), data), (entry_name(target.key), json.dumps(entry).encode()),
            (name_pointer(target.name), target.key.encode())]


def signed_manifest(raw: bytes, trusted: Dict[str, object]) -> dict:
    """The manifest of a stored entry.json whose signature a trusted key checks; ``raw`` over MANIFEST_CAP (the
    store read one byte beyond it) is refused before it is parsed."""
    if len(raw) > MANIFEST_CAP:
        raise Refused(f"its entry.json is over the {MANIFEST_CAP >> 20} MiB a manifest may have (not parsed: damaged "
                      "or not kernelkit's)")
    try:
        entry = json.loads(raw)
        text, signature = entry["manifest"], entry["signature"]
        scheme, key_id, value = signature["scheme"], signature["key_id"], signature["signature"]
    except (ValueError, TypeError, KeyError):
        raise Refused("its entry.json is not a signed manifest (damaged or not kernelkit's)") from None
    checker = trusted.get(key_id) if isinstance(key_id, str) else None
    if checker is None or checker.scheme != scheme:
        raise Refused(f"signed by {key_id}, a key this reader does not trust (unknown signer)")
    if not (isinstance(text, str) and checker.check(text.encode(), value)):
        raise Refused(f"its signature by {key_id} does not match its manifest (tampered manifest or forged signature)")
    try:
        manifest = json.loads(text)
    except ValueError:
        raise Refused("its signed manifest is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("schema") != SCHEMA:
        raise Refused(f"its manifest is not schema {SCHEMA} of {FORMAT} (written by another kernelkit version)")
    manifest["signed_by"] = key_id
    return manifest


def verified_manifest(raw: bytes, target, trusted: Dict[str, object]) -> dict:
    """The manifest of ``target``'s entry, signed by a trusted key and naming this very target; Refused if not."""
    manifest = signed_manifest(raw, trusted)
    if manifest.get("key") != target.key:
        raise Refused(f"it is the entry of key {str(manifest.get('key'))[:16]}, stored under {target.key[:16]} "
                      "(wrong key)")
    if manifest.get("name") != target.name or manifest.get("so") != target.so_name:
        raise Refused(f"it names {manifest.get('name')!r} ({manifest.get('so')!r}), not {target.name!r}")
    archs = _environment(target)["archs"]
    if manifest.get("archs") != archs:
        raise Refused(f"it was built for {','.join(manifest.get('archs') or []) or 'no GPU'}; this load needs "
                      f"{','.join(archs) or 'no GPU'} (wrong arch)")
    files = manifest.get("files")
    if not (isinstance(files, list) and len(files) == 1 and isinstance(files[0], dict)
            and files[0].get("name") == target.so_name and isinstance(files[0].get("sha256"), str)
            and _SHA256.fullmatch(files[0]["sha256"]) and type(files[0].get("size")) is int and files[0]["size"] >= 0):
        raise Refused("its manifest does not list the library's sha256 and size")
    return manifest


def check_file(described: dict, data) -> bytes:
    """``data`` if it is the file the manifest describes; Refused naming what differs. ``data`` is what a get
    limited to the declared size read: one byte more says the stored file is larger, and no more of it was read."""
    if data is None:
        raise Refused(f"{described['name']} is missing from the store (missing file)")
    if len(data) > described["size"]:
        raise Refused(f"{described['name']} is larger than the {described['size']} bytes its manifest says (damaged; "
                      "not read further)")
    if len(data) != described["size"]:
        raise Refused(f"{described['name']} is {len(data)} bytes, its manifest says {described['size']} (damaged)")
    if hashlib.sha256(data).hexdigest() != described["sha256"]:
        raise Refused(f"{described['name']} does not match the sha256 its manifest records (tampered byte)")
    return data
