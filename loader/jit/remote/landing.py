"""A verified remote entry lands in the local cache as a local build does (``lib/<name>-<key16>/``, its .so and
manifest.json), under the library's lock; the local cache is what every load is ever loaded from."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .. import cache


def land(target, manifest: dict, data: bytes, origin: str) -> Optional[Path]:
    """The local cache's verified .so for ``target``, made from ``data`` (checked against ``manifest`` already);
    an entry another process published meanwhile is used as it is."""
    from .. import toolchain  # torch: imported when a library lands, not with the package

    return cache.land_library(target, data, {
        "build_seconds": manifest.get("build_seconds"), "fingerprint": toolchain.fingerprint(),
        "fetched_from": origin, "signed_by": manifest.get("signed_by"),
    })
