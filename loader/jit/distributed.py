"""Compile once per job: every rank of a torch.distributed group asks for the same build; one rank (the
group's rank 0 by default) finds it in its cache or builds it, and the ranks whose cache lacks it receive
its bytes over the group (gloo or NCCL), check them against the sha256 announced for the key they computed
themselves, and publish them into their own cache as a local build would.

The exchange, all collective on ``group``:

1. every rank sends (its key, a digest per input file, whether its cache holds the entry, or the error its
   planning raised); any difference from the source rank is raised on every rank, naming the file;
2. if every rank holds the entry, each loads its own: nothing is sent;
3. the source rank obtains the build and broadcasts a header: ok with sha256 and size, or the error;
4. the ranks that still lack the entry (a shared cache may have it now) receive the bytes.

A rank that dies mid-exchange leaves the others in a collective that fails (peer gone) or times out (the
process group's ``timeout``); that failure is raised as a :class:`KernelkitError` naming the source rank.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .. import errors as _errors
from ..errors import BuildError, KernelkitError
from . import cache, keys, obtain, toolchain
from .progress import say
from .units import Target

__all__ = ["node_group", "check_group", "STATS"]

#: what this process moved over its groups: builds received, and bytes sent or received
STATS = {"received": 0, "sent_bytes": 0, "received_bytes": 0}


# ------------------------------------------------------------------------------------------- the group
def _dist():
    import torch.distributed as dist  # only a call with group= pays for it

    return dist


def check_group(group):
    """``group`` as a process group this rank belongs to; a clear error for anything else."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        raise KernelkitError("group=: torch.distributed is not initialized; call torch.distributed."
                             "init_process_group(...) on every rank first, or pass group=None")
    if group is None or group is dist.group.WORLD:
        group = dist.group.WORLD
    elif not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group=: expected a torch.distributed process group (or group.WORLD), got "
                        f"{type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise KernelkitError("group=: this rank is not a member of the process group it was given")
    return group


def node_group(local_world_size: Optional[int] = None):
    """A group of the ranks on this node (torchrun's LOCAL_WORLD_SIZE consecutive ranks), for ranks that
    share one cache directory per node. Collective: every rank of the job must call it."""
    dist = _dist()
    check_group(None)
    if local_world_size is None:
        raw = os.environ.get("LOCAL_WORLD_SIZE")
        if not raw or not raw.isdigit() or int(raw) < 1:
            raise KernelkitError("node_group: LOCAL_WORLD_SIZE is not set (torchrun sets it); pass "
                                 "local_world_size= (the number of ranks per node)")
        local_world_size = int(raw)
    if dist.get_world_size() % local_world_size:
        raise KernelkitError(f"local_world_size={local_world_size} does not divide the world size "
                             f"{dist.get_world_size()}")
    mine, _ = dist.new_subgroups(group_size=local_world_size)
    return mine


def _device(group):
    """NCCL moves only GPU tensors; every other backend here takes CPU ones."""
    import torch

    if _dist().get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@contextlib.contextmanager
def _collective(what: str, src: int, group) -> Iterator[None]:
    """Turn a failed or timed-out collective into an error that says what was waited for. Which rank is gone
    is not known here (every error a live rank meets is exchanged and named instead): one died or exited
    early, the building rank took longer than the group's timeout, or a rank did not make this call."""
    dist = _dist()
    try:
        yield
    except KernelkitError:
        raise
    except (RuntimeError, dist.DistError, ValueError) as e:  # gloo: peer closed / timed out; NCCL: watchdog
        me, builder = dist.get_rank(group), dist.get_global_rank(group, src)
        role = ("this rank builds for the others" if me == src else
                f"rank {builder} (group rank {src}) builds for the others")
        raise KernelkitError(
            f"{what}: a collective of the exchange failed on rank {dist.get_global_rank(group, me)} "
            f"({role}): {str(e).splitlines()[0] if str(e) else type(e).__name__}. Another rank of the group died "
            "or exited before this call, took longer to build than the process group's timeout "
            "(init_process_group(timeout=...) bounds the wait: make it longer than a cold build), or did not "
            "call with the same group=.") from None


# ---------------------------------------------------------------------------------------- artifacts
@dataclasses.dataclass
class _Artifact:
    """How one kind of build is found, made, read and published: a library entry or an NVRTC cubin."""

    name: str
    key: str
    files: Dict[str, str]  # what the key is made of, by name -> digest (to name a difference)
    local: Callable[[], Optional[object]]  # this rank's verified result, or None
    make: Callable[[], Tuple[object, Path, dict]]  # (result, file to send, info for receivers)
    publish: Callable[[bytes, dict], object]  # store received bytes; returns the result


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(path: Path) -> str:
    try:
        return _digest(path.read_bytes())
    except OSError as e:
        return f"unreadable ({e.strerror})"


def _target_files(target: Target) -> Dict[str, str]:
    files = {"toolchain": toolchain.fingerprint(), "link flags": _digest("\0".join(target.ldflags).encode())}
    for u in target.units:
        files[f"file {u.display}"] = _read(u.path)
        shard = f" (dtype shard {u.shard[0]})" if getattr(u, "shard", None) else ""
        files[f"compile flags of {u.display}{shard}"] = u.key  # the unit key: what is left once the files agree
        for d in u.deps:
            files[f"file {target.display.get(str(d), d.name)}"] = _read(d)
    for path, sha in keys.link_files(target.ldflags):  # an archive or object the link flags name
        files[f"file {path}"] = sha
    return files


def library_artifact(target: Target, prebuilt_ok: bool) -> _Artifact:
    def local():
        return obtain.local(target, prebuilt_ok)

    def make():
        so, cached, seconds = obtain.obtain(target, prebuilt_ok)
        return (so, cached, seconds), so, {"build_seconds": round(seconds, 3)}

    def publish(data: bytes, info: dict):
        so = cache.land_library(target, data, {  # the same entry layout as a local build: gc/verify/list alike
            "build_seconds": info.get("build_seconds"), "fingerprint": toolchain.fingerprint(),
            "received_from_rank": info.get("from_rank"),
        })
        if so is None:
            raise KernelkitError(f"{target.name}: the build received from rank {info.get('from_rank')} did not "
                                 "verify once published in this rank's cache")
        return so, True, 0.0

    return _Artifact(target.name, target.key, _target_files(target), local, make, publish)


def program_artifact(program) -> _Artifact:
    from . import nvrtc

    files = {"NVRTC, arch and options": _digest("\0".join([nvrtc.FORMAT, "%d.%d" % nvrtc.version(), program.arch,
                                                          *program.options, "\0", *program.name_expressions])
                                                .encode()),
             f"file {program.display}": _digest(program.text.encode())}
    files.update({f"file {shown}": _digest(content.encode()) for _, shown, content in program.headers})

    def make():
        compiled = nvrtc.obtain(program)
        return compiled, compiled.cubin, {"meta": json.loads(compiled.cubin.with_suffix(".json").read_text())}

    def publish(data: bytes, info: dict):
        meta = info.get("meta") if isinstance(info.get("meta"), dict) else {}
        meta = {k: v for k, v in meta.items() if k not in ("sha256", "created")}  # recomputed on store
        with cache.locked(program.key, f"the instant kernels {program.name}"):
            if nvrtc._cached(program) is None:  # stored as a local compile stores it (no tmp/ left behind)
                nvrtc.store(program, data, {**meta, "received_from_rank": info.get("from_rank")})
            compiled = nvrtc._cached(program)
        if compiled is None:
            raise KernelkitError(f"{program.name}: the cubin received from rank {info.get('from_rank')} did not "
                                 "verify once stored in this rank's cache")
        return compiled

    return _Artifact(program.name, program.key, files, lambda: nvrtc._cached(program), make, publish)


# ------------------------------------------------------------------------------------------ errors
def _describe_error(e: BaseException) -> dict:
    """An exception as plain data, enough to raise the same message on another rank."""
    out = {"type": type(e).__name__, "message": str(e)}
    if isinstance(e, BuildError):
        out.update(what=e.what, diagnostics=e.diagnostics, log=e.log, command=e.command)
    return out


def _rebuild_error(d: dict, rank: int) -> BaseException:
    """The error the building rank raised, as the same class with the same message where possible."""
    if d.get("type") == "BuildError" and "what" in d:
        return BuildError(d["what"], d.get("diagnostics") or [], d.get("log") or "", d.get("command") or [])
    cls = getattr(_errors, str(d.get("type")), None)
    if isinstance(cls, type) and issubclass(cls, KernelkitError):
        with contextlib.suppress(Exception):
            return cls(d["message"])
    return KernelkitError(f"rank {rank} failed: {d.get('type')}: {d.get('message')}")


def _first_difference(mine: Dict[str, str], theirs: Dict[str, str], me: str, them: str) -> str:
    """The input a rank's key differs by, files first (a compiler or flag difference explains less)."""
    names = sorted(set(mine) | set(theirs), key=lambda k: (not k.startswith("file "), k))
    for k in names:
        if mine.get(k) != theirs.get(k):
            if k not in mine or k not in theirs:
                return f"{k} (present on only one of them)"
            return f"{k} ({them}: sha256 {theirs[k][:12]}, {me}: {mine[k][:12]})"
    return "nothing the key is made of differs visibly (a different kernelkit version?)"


# ---------------------------------------------------------------------------------------- exchange
def _gather(group, src: int, what: str, value):
    dist = _dist()
    out: List[object] = [None] * dist.get_world_size(group)
    with _collective(what, src, group):
        dist.all_gather_object(out, value, group=group)
    return out


def planning_failed(error: BaseException, group, what: str, src: int = 0) -> None:
    """Join the key exchange with ``error`` (this rank could not plan), so no other rank waits on it."""
    _gather(group, src, what, {"error": _describe_error(error)})


def _raise_failures(entries: List[dict], art: _Artifact, group, when: str, mine: Optional[BaseException]) -> None:
    """Every rank raises once any rank reported an error: the failing rank its own, the others one naming
    every rank that failed and why."""
    dist = _dist()
    failed = [(dist.get_global_rank(group, r), e["error"]) for r, e in enumerate(entries) if e.get("error") is not None]
    if not failed:
        return
    if mine is not None:
        raise mine
    named = "; ".join(f"rank {r}: {err.get('type')}: {str(err.get('message')).splitlines()[0] if err.get('message') else ''}"
                      for r, err in failed)
    raise KernelkitError(f"{art.name}: {len(failed)} rank(s) of the group failed {when}, so no rank goes on: {named}")


def _check_agreement(entries: List[dict], art: _Artifact, src: int, group,
                     mine: Optional[BaseException] = None) -> None:
    dist = _dist()
    _raise_failures(entries, art, group, "before the exchange (planning or reading their cache)", mine)
    ref = entries[src]
    for r, e in enumerate(entries):
        if e["key"] != ref["key"]:
            g, s = dist.get_global_rank(group, r), dist.get_global_rank(group, src)
            raise KernelkitError(
                f"{art.name}: rank {g}'s sources differ from rank {s}'s: {_first_difference(ref['files'], e['files'], f'rank {s}', f'rank {g}')}. "
                f"Every rank of group= must load the same code (rank {g} key {e['key'][:12]}, rank {s} key "
                f"{ref['key'][:12]}); check that each node has the same checkout and toolchain.")


def exchange(art: _Artifact, group, src: int = 0):
    """Every rank: the verified build, obtained by ``src`` (a group rank) and sent to the ranks lacking it."""
    dist = _dist()
    group = check_group(group)
    me, n = dist.get_rank(group), dist.get_world_size(group)
    if not 0 <= src < n:
        raise ValueError(f"src: group rank {src} is not in a group of {n} ranks")
    what = f"{art.name} (group={n} ranks)"
    have, error = _attempt(art.local)
    entries = _gather(group, src, what, {"key": art.key, "files": art.files, "have": have is not None,
                                         "error": None if error is None else _describe_error(error)})
    _check_agreement(entries, art, src, group, error)
    if all(e["have"] for e in entries):
        return have  # every cache holds it: nothing moves
    header, data, result, failure = _build_at_src(art, have, group, src) if me == src else (None, b"", None, None)
    box = [header]
    with _collective(what, src, group):
        dist.broadcast_object_list(box, group_src=src, group=group)
    header = box[0]
    if not header["ok"]:
        if me == src:
            raise failure
        raise _rebuild_error(header["error"], dist.get_global_rank(group, src))
    if me != src:
        have, error = _attempt(art.local)  # a cache shared with the building rank holds it now
    needs = _gather(group, src, what, {"need": me != src and have is None,
                                       "error": None if error is None else _describe_error(error)})
    _raise_failures(needs, art, group, "reading their cache after the build", error)
    needy = [r for r, need in enumerate(needs) if need["need"]]
    if needy:
        got = _transfer(data, header["size"], needy, me, src, n, group, what)
        if me in needy:
            return _received(art, got, header, dist.get_global_rank(group, src))
    return result if me == src else have


def _build_at_src(art: _Artifact, have, group, src: int) -> Tuple[dict, bytes, object, Optional[Exception]]:
    """On ``src``: (the header announcing its build, the build's bytes, what it returns, None), its build made
    where its cache lacks it; or a header saying why it failed and the exception, raised once it is announced."""
    try:
        result, path, info = art.make() if have is None else (have, _artifact_file(have), {})
        data = Path(path).read_bytes()
        header = {"ok": True, "key": art.key, "sha256": _digest(data), "size": len(data),
                  "info": {**info, "from_rank": _dist().get_global_rank(group, src)}}
        return header, data, result, None
    except Exception as e:  # noqa: BLE001 - sent before it is raised here, so no rank waits for a failed build
        return {"ok": False, "error": _describe_error(e)}, b"", None, e


def _received(art: _Artifact, got: bytes, header: dict, sender: int):
    """The build ``sender`` (a global rank) sent, stored once it matches the sha256 and key it announced."""
    if _digest(got) != header["sha256"] or header["key"] != art.key:
        raise KernelkitError(f"{art.name}: the build received from rank {sender} does not match the sha256 it "
                             "announced for this key; nothing was stored")
    say(f"{art.name}: received build {art.key[:12]} ({len(got)} bytes) from rank {sender}")
    return art.publish(got, header["info"])


def _attempt(fn) -> Tuple[object, Optional[BaseException]]:
    """(fn(), None), or (None, the exception): a rank's error is exchanged before it is raised."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 - every rank raises it (or names it) after the exchange
        return None, e


def _artifact_file(have) -> Path:
    return have[0] if isinstance(have, tuple) else have.cubin


def _transfer(data: bytes, size: int, needy: Sequence[int], me: int, src: int, n: int, group, what: str) -> bytes:
    """Broadcast when every other rank needs the bytes (a tree beats n sends), else send to each that does."""
    import torch

    dist = _dist()
    device = _device(group)
    if me == src:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(size, dtype=torch.uint8, device=device)
    with _collective(what, src, group):
        if len(needy) == n - 1:
            dist.broadcast(buf, group_src=src, group=group)
        elif me == src:
            for r in needy:
                dist.send(buf, group_dst=r, group=group)
        elif me in needy:
            dist.recv(buf, group_src=src, group=group)
    if me == src:
        STATS["sent_bytes"] += size * len(needy)  # delivered, whether by broadcast or by sends
        return b""
    if me not in needy:
        return b""
    STATS["received"] += 1
    STATS["received_bytes"] += size
    return buf.cpu().numpy().tobytes()


@contextlib.contextmanager
def joining(group, what: str) -> Iterator[None]:
    """Around planning under group=: a rank whose planning raises still joins the exchange, with its error,
    so the other ranks raise too instead of waiting for it."""
    if group is None:
        yield
        return
    check_group(group)
    try:
        yield
    except Exception as e:
        with contextlib.suppress(KernelkitError):
            planning_failed(e, check_group(group), what)
        raise


def obtain_library(target: Target, group, prebuilt_ok: bool = True):
    """api.obtain under group=: (path, cached, seconds)."""
    return exchange(library_artifact(target, prebuilt_ok), group)


def obtain_program(program, group):
    """nvrtc.obtain under group=: the Compiled cubin."""
    return exchange(program_artifact(program), group)
