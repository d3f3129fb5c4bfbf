"""A build cache a team or fleet shares, behind the local cache: read through and written through, its entries
signed by their writers and verified before they reach the local cache (docs/remote-cache.md).

``fetch(target)``: on a local miss, the library of ``target.key`` from the store, its signature and every digest
checked, landed in the local cache; that local path, or None (not there, refused, store unreachable).
``publish(target, so)``: after a build, the library signed and put in the store (a failure warns once and is
otherwise ignored). Modules: ``stores`` (the four verbs over fsspec and redis, bounded), ``signing`` (HMAC and
ed25519), ``entries`` (the signed manifest: packing and verifying), ``landing`` (into the local cache),
``configured`` (the settings, and what the process has learnt about its store), ``facts`` (the toolchain facts
record: ``supply_toolchain_facts`` before a plan, published beside the first entry a process publishes).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional, Tuple

from ... import settings
from ...errors import CacheUnwritable, KernelkitError
from ..progress import say
from . import configured, entries, facts, landing, signing, stores

log = logging.getLogger("kernelkit")

#: what this process did with the remote cache (tests, and a curious user)
STATS = {"fetched": 0, "misses": 0, "refused": 0, "published": 0, "facts_fetched": 0}
#: (store URL, facts key) whose facts record this process has published or found in the store
_FACTS_SHARED: set = set()

__all__ = ["STATS", "fetch", "forget", "keygen", "publish", "supply_toolchain_facts", "why"]


def fetch(target) -> Optional[Path]:
    """The local cache's path of ``target``'s library, fetched from the remote cache; None to build it. Raises
    when KERNELKIT_REMOTE_CACHE_REQUIRE is on and the store cannot supply it."""
    remote, why = configured.current()
    so = None
    if remote is not None and remote.read:
        so, why = _fetch(remote, target)
    elif remote is not None:
        why = f"{settings.REMOTE_CACHE_MODE.name}=write"
    if so is None and settings.REMOTE_CACHE_REQUIRE.get():
        raise KernelkitError(f"{target.name}: not built, since {settings.REMOTE_CACHE_REQUIRE.name} is on and the "
                             f"remote cache cannot supply it: {why}")
    return so


def _fetch(remote, target) -> Tuple[Optional[Path], str]:
    key = target.key
    try:
        raw = remote.call(lambda: remote.store.get(entries.entry_name(key), entries.MANIFEST_CAP))
        if raw is None:
            STATS["misses"] += 1
            nearest = _nearest(remote, target)
            if nearest:
                configured.once(f"{target.name}: not in the remote cache {remote.shown}; {nearest}")
            return None, f"{remote.shown} holds no entry of {target.name} with key {key[:16]}" + \
                (f"; {nearest}" if nearest else "")
        manifest = entries.verified_manifest(raw, target, remote.trusted)
        described = manifest["files"][0]
        data = remote.call(lambda: remote.store.get(entries.file_name(key, described["sha256"]), described["size"]),
                           described["size"])
        data = entries.check_file(described, data)
    except entries.Refused as e:
        STATS["refused"] += 1
        line = f"{target.name}: refused the remote cache's entry {key[:16]} from {remote.shown}: {e}"
        log.warning("kernelkit: %s", line)
        return None, line
    except stores.Unreachable as e:
        configured.give_up(remote, str(e))
        return None, f"{remote.shown} did not answer ({e})"
    try:
        so = landing.land(target, manifest, data, remote.shown)
    except CacheUnwritable as e:
        return None, f"the local cache cannot take it ({e})"
    if so is not None:
        STATS["fetched"] += 1
        say(f"{target.name}: fetched from the remote cache {remote.shown} (signed by {manifest['signed_by']})")
    return so, "" if so is not None else "it did not verify once in the local cache"


def supply_toolchain_facts() -> bool:
    """Before a plan: where this process has no toolchain facts yet and its local cache no record of them, the
    store's record for this environment (signed by a trusted key) lands in the local cache, for ``toolchain.facts``
    to check and use as its own; whether one landed. Costs nothing without a remote cache or with a local record."""
    if not settings.REMOTE_CACHE.get():
        return False
    from .. import cache, toolchain

    if toolchain.facts.cache_info().currsize:
        return False
    key = toolchain.facts_key()
    if cache.read_record("toolchain", key):
        return False
    remote, _ = configured.current()
    if remote is None or not remote.read:
        return False
    try:
        raw = remote.call(lambda: remote.store.get(facts.name(key), facts.CAP))
        if raw is None:
            return False
        record = facts.verified(raw, key, remote.trusted)
    except entries.Refused as e:
        STATS["refused"] += 1
        log.warning("kernelkit: refused the remote cache's toolchain facts %s from %s: %s", key[:16], remote.shown, e)
        return False
    except stores.Unreachable as e:
        configured.give_up(remote, str(e))
        return False
    try:
        cache.write_record("toolchain", key, record)
    except CacheUnwritable:
        return False
    STATS["facts_fetched"] += 1
    return True


def _publish_facts(remote) -> None:
    """The facts this process planned with, signed beside its first published entry (once per store and key)."""
    from .. import toolchain

    key = toolchain.facts_key()
    if (remote.url, key) in _FACTS_SHARED:
        return
    if not remote.call(lambda: remote.store.exists(facts.name(key))):
        blob = facts.pack(key, dict(toolchain.facts()), remote.signer)
        remote.call(lambda: remote.store.put(facts.name(key), blob), len(blob))
    _FACTS_SHARED.add((remote.url, key))


def _nearest(remote, target) -> str:
    """How the latest entry published under ``target``'s name differs from it ("" if there is none, or it cannot be
    verified)."""
    pointer = remote.call(lambda: remote.store.get(entries.name_pointer(target.name), entries.POINTER_CAP))
    key = pointer.decode(errors="replace").strip() if pointer else ""
    raw = remote.call(lambda: remote.store.get(entries.entry_name(key), entries.MANIFEST_CAP)) \
        if len(key) == 64 and key.isalnum() else None
    if raw is None:
        return ""
    try:
        theirs = entries.signed_manifest(raw, remote.trusted)
    except entries.Refused:
        return ""
    differ = entries.differences(theirs.get("inputs") or {}, entries.inputs(target))
    return f"its latest entry of {target.name} ({key[:16]}) differs in: {', '.join(differ) or 'nothing recorded'}"


def why(target) -> str:
    """Whether the local and remote caches hold ``target``, and if not, which input differs from the remote cache's
    nearest entry: ``kernelkit cache why NAME``'s answer, one line."""
    from .. import cache

    local = "in the local cache" if cache.verified_library(target.name, target.key) else "not in the local cache"
    remote, reason = configured.current()
    if remote is None:
        return f"{target.name} ({target.key[:16]}): {local}; no remote cache is used: {reason}"
    try:
        raw = remote.call(lambda: remote.store.get(entries.entry_name(target.key), entries.MANIFEST_CAP))
        if raw is None:
            nearest = _nearest(remote, target) or f"it holds no entry of {target.name} at all"
            return f"{target.name} ({target.key[:16]}): {local}; not in the remote cache {remote.shown}: {nearest}"
        manifest = entries.verified_manifest(raw, target, remote.trusted)
    except entries.Refused as e:
        return f"{target.name} ({target.key[:16]}): {local}; the remote cache's entry is refused: {e}"
    except stores.Unreachable as e:
        return f"{target.name} ({target.key[:16]}): {local}; the remote cache {remote.shown} did not answer ({e})"
    return (f"{target.name} ({target.key[:16]}): {local}; in the remote cache {remote.shown}, signed by "
            f"{manifest['signed_by']}")


def publish(target, so: Path, build_seconds: float = 0.0) -> bool:
    """Put ``target``'s freshly built library in the remote cache, signed; whether it was put there. Never raises:
    a store that fails is warned about once and not asked again."""
    remote, _ = configured.current()
    if remote is None or not remote.write:
        return False
    try:
        if remote.call(lambda: remote.store.exists(entries.entry_name(target.key))):
            return False  # published already (by another process of the team: same key, same inputs)
        for name, data in entries.pack(target, so, remote.signer, build_seconds):
            remote.call(lambda name=name, data=data: remote.store.put(name, data), len(data))
        _publish_facts(remote)
    except stores.Unreachable as e:
        configured.give_up(remote, str(e), publishing=True)
        return False
    except Exception as e:  # noqa: BLE001 - publishing is a favour to others: it never fails this load
        configured.give_up(remote, f"{type(e).__name__}: {e}".splitlines()[0], publishing=True)
        return False
    STATS["published"] += 1
    say(f"{target.name}: published to the remote cache {remote.shown}")
    return True


def keygen(directory: Path) -> Tuple[Path, Path]:
    """A new ed25519 pair in ``directory``: (private key for writers, public key for readers)."""
    return signing.keygen(Path(directory))


def forget() -> None:
    """Forget what this process learnt about its store (one given up on is asked again)."""
    configured.forget()
    _FACTS_SHARED.clear()
