"""The on-disk cache: content-addressed objects and libraries, written atomically, verified before use.

Layout under ``cache_dir()`` (mode 0700, as is the directory it lives in): every file belongs to a row of the
store table (``store.STORES``: each row's folder, key recipe, format version, gc rule and verify check)::

    lib/<name>-<key16>/           one linked library: the .so and manifest.json (sha256 of the .so)
    obj/<key>.o, obj/<key>.json   compiled translation units, NVRTC cubins and scanned kernel outlines, shared by
                                  every library that uses them (the json records the key and the sha256: a copy
                                  over another key's is corrupt)
    pch/<key>/                    a precompiled header (<kernelkit/binding.h>, a split's host preamble), its
                                  pch.json (sha256) and the ``building`` claim its detached builder holds
    src/<key>/                    sources written for load_inline, and generated TUs and headers
    shapes/<key>                  the key of an object compiled from a text of that host shape
    tune/<key>.json               autotuning winners (kept until a clear)
    plans/<key>.json              warm plans of torch-style extensions (``jit.fast.recall``)
    records/<store>/<key>.json    small records a warm start reads instead of working them out again (a split's
                                  frames and torch names, toolchain and NVRTC facts, the launcher, torch's
                                  signatures, device bandwidth, compile reports): ``record_path``, ``write_record``
    tmp/                          private build dirs; renamed into place only when complete
    locks/<id>.lock               filelock locks (flock: released by the kernel if the holder dies)
    last-gc, last-size-check      when gc and the size cap last ran

Keys are derived in ``keys`` (what invalidates what). Only regular files are read: a FIFO or device in
place of an entry is reported corrupt without being opened for reading (it would block forever). ``subdir`` and
the record functions refuse a folder or store the table lacks; what lies in no row's place (left by an older
kernelkit) is collected by age.

Whoever removes an entry holds that entry's lock (``library_lock`` / the object's key / the PCH claim), so
gc, clear and corruption handling never remove what another process is building or has just published.

This package's face re-exports the verbs the rest of kernelkit calls (``cache.cached_object``, ``cache.gc``, ...);
each lives in the module of what it does: ``root`` (the root, its safety, ``subdir``), ``files`` (reading, publishing
and removing files safely), ``locks``, ``generated`` (src/), ``objects`` (obj/, shapes/), ``libraries`` (lib/),
``pch``, ``records`` (records/, tune/), ``table`` (each row's entries), ``collect`` (gc, clear, the size cap),
``listing`` (entries, usage, info) and ``verifying``.
"""
from __future__ import annotations

from .collect import (
    CAP_GRACE_SECONDS,
    CAP_INTERVAL_SECONDS,
    DEFAULT_MAX_AGE_DAYS,
    GC_INTERVAL_SECONDS,
    STALE_LOCK_SECONDS,
    STALE_TMP_SECONDS,
    clear,
    enforce_size_cap,
    gc,
    max_bytes,
    maybe_gc,
)
from .files import private_tmpdir, publish_file
from .generated import (
    discard_source,
    generated_source_key,
    is_generated_source,
    require_writable,
    source_bytes,
    touch_source,
    write_source,
)
from .libraries import (
    land_library,
    library_dir,
    library_lock,
    publish_library,
    read_manifest,
    remove_library,
    verified_library,
    write_manifest,
)
from .listing import entries, info, store_entries, store_usage
from .locks import lock_timeout, locked, try_flock, try_locked
from .objects import cached_object, object_info, object_path, remember_shape, shaped_object, store_object
from .pch import PCH_CLAIM, PCH_META, drop_pch, pch_problem, pch_ready
from .records import read_record, record_path, store_tune_record, tune_record, tune_records, write_record
from .root import LAYOUT, cache_dir, check_safe, subdir, writing
from .table import KIND_DIRS
from .verifying import verify

__all__ = [
    "CAP_GRACE_SECONDS", "CAP_INTERVAL_SECONDS", "DEFAULT_MAX_AGE_DAYS", "GC_INTERVAL_SECONDS", "KIND_DIRS",
    "LAYOUT", "PCH_CLAIM", "PCH_META", "STALE_LOCK_SECONDS", "STALE_TMP_SECONDS", "cache_dir", "cached_object",
    "check_safe", "clear", "discard_source", "drop_pch", "enforce_size_cap", "entries", "gc",
    "generated_source_key", "info", "is_generated_source", "land_library", "library_dir", "library_lock",
    "lock_timeout", "locked", "max_bytes", "maybe_gc", "object_info", "object_path", "pch_problem", "pch_ready",
    "private_tmpdir", "publish_file", "publish_library", "read_manifest", "read_record", "record_path",
    "remember_shape", "remove_library", "require_writable", "shaped_object", "source_bytes", "store_entries",
    "store_object", "store_tune_record", "store_usage", "subdir", "touch_source", "try_flock", "try_locked",
    "tune_record", "tune_records", "verified_library", "verify", "write_manifest", "write_record", "write_source",
    "writing",
]
