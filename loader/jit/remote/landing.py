"""A verified remote entry lands in the local cache as a local build does (``lib/<name>-<key16>/``, its .so and
manifest.json), under the library's lock; the local cache is what every load is ever loaded from."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Optional

from .. import cache
from ..sources import sha256_file


def land(target, manifest: dict, data: bytes, origin: str) -> Optional[Path]:
    """The local cache's verified .so for ``target``, made from ``data`` (checked against ``manifest`` already);
    an entry another process published meanwhile is used as it is."""
    from .. import toolchain  # torch: imported when a library lands, not with the package

    with cache.locked(cache.library_lock(target.name, target.key), target.name):
        so = cache.verified_library(target.name, target.key, held=True)
        if so is not None:
            return so
        tmp = cache.private_tmpdir(f"lib-{target.name}-")
        try:
            out = tmp / target.so_name
            with cache.writing(out):
                out.write_bytes(data)
            local = {
                "name": target.name, "key": target.key, "so": target.so_name, "sha256": sha256_file(out),
                "created": time.time(), "build_seconds": manifest.get("build_seconds"), "pymodule": target.pymodule,
                "units": [{"file": u.display, "key": u.key} for u in target.units],
                "fingerprint": toolchain.fingerprint(), "fetched_from": origin,
                "signed_by": manifest.get("signed_by"),
            }
            cache.write_manifest(tmp, local)
            os.chmod(out, 0o700)
            os.chmod(tmp, 0o700)
            cache.publish_library(tmp, target.name, target.key)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cache.verified_library(target.name, target.key, held=True)
