"""Who may write the remote cache: entries' manifests are signed, and a reader accepts only signatures it can check.

Two schemes. A team secret (``KERNELKIT_REMOTE_CACHE_SECRET=<file>``): HMAC-SHA256 with it, which everyone holding
it can both make and check. Public keys (ed25519, the ``cryptography`` package): a writer signs with its private
key (``KERNELKIT_REMOTE_CACHE_SIGNING_KEY``), readers check with the public keys they list
(``KERNELKIT_REMOTE_CACHE_TRUSTED_KEYS``); a writer trusts its own. A signature names its key by a short id (the
sha256 of the secret or the public key), so a reader can say "unknown signer" instead of "bad signature".
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path
from typing import Dict, Optional, Tuple

from ... import settings
from ...errors import KernelkitError

HMAC = "hmac-sha256"
ED25519 = "ed25519"
PRIVATE_NAME = "kernelkit-cache.key"
PUBLIC_NAME = "kernelkit-cache.pub"
_MIN_SECRET = 16  # bytes: a shorter secret is guessable


_ID_DOMAIN = b"kernelkit-remote-cache\0"


def _key_id(scheme: str, material: bytes) -> str:
    return f"{scheme}:{hashlib.sha256(_ID_DOMAIN + material).hexdigest()[:16]}"


def _read(path: Path, what: str, setting) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise KernelkitError(f"{setting.name}={path}: cannot read the {what} ({e.strerror or e})") from None


class Secret:
    """HMAC-SHA256 with a team secret: signs and checks."""

    scheme = HMAC

    def __init__(self, secret: bytes):
        self.secret = secret
        self.key_id = _key_id(HMAC, secret)

    def sign(self, data: bytes) -> dict:
        return {"scheme": HMAC, "key_id": self.key_id, "signature": hmac.new(self.secret, data, "sha256").hexdigest()}

    def check(self, data: bytes, signature: str) -> bool:
        return hmac.compare_digest(hmac.new(self.secret, data, "sha256").hexdigest(), str(signature))


class PublicKey:
    """An ed25519 public key: checks."""

    scheme = ED25519

    def __init__(self, key):
        from cryptography.hazmat.primitives import serialization

        self.key = key
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.key_id = _key_id(ED25519, raw)

    def check(self, data: bytes, signature: str) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            self.key.verify(base64.b64decode(str(signature), validate=True), data)
        except (InvalidSignature, ValueError):
            return False
        return True


class PrivateKey:
    """An ed25519 private key: signs (its public half is among the reader's trusted keys)."""

    scheme = ED25519

    def __init__(self, key):
        self.key = key
        self.public = PublicKey(key.public_key())
        self.key_id = self.public.key_id

    def sign(self, data: bytes) -> dict:
        return {"scheme": ED25519, "key_id": self.key_id, "signature": base64.b64encode(self.key.sign(data)).decode()}


def _secret() -> Optional[Secret]:
    path = settings.REMOTE_CACHE_SECRET.get()
    if path is None:
        return None
    secret = _read(path, "team secret", settings.REMOTE_CACHE_SECRET).strip()
    if len(secret) < _MIN_SECRET:
        raise KernelkitError(f"{settings.REMOTE_CACHE_SECRET.name}={path}: the secret is {len(secret)} bytes; use "
                             f"{_MIN_SECRET} or more (e.g. head -c 32 /dev/urandom | base64 > {path})")
    return Secret(secret)


def _private_key() -> Optional[PrivateKey]:
    path = settings.REMOTE_CACHE_SIGNING_KEY.get()
    if path is None:
        return None
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(_read(path, "signing key", settings.REMOTE_CACHE_SIGNING_KEY), None)
    except (ValueError, TypeError) as e:
        raise KernelkitError(f"{settings.REMOTE_CACHE_SIGNING_KEY.name}={path}: not an unencrypted PEM private key "
                             f"({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KernelkitError(f"{settings.REMOTE_CACHE_SIGNING_KEY.name}={path}: not an ed25519 key "
                             "(kernelkit cache keygen DIR makes one)")
    return PrivateKey(key)


def _public_key(path: Path) -> PublicKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(_read(path, "public key", settings.REMOTE_CACHE_TRUSTED_KEYS))
    except ValueError as e:
        raise KernelkitError(f"{settings.REMOTE_CACHE_TRUSTED_KEYS.name}: {path} is not a PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KernelkitError(f"{settings.REMOTE_CACHE_TRUSTED_KEYS.name}: {path} is not an ed25519 key")
    return PublicKey(key)


def keys() -> Tuple[object, Dict[str, object]]:
    """(the signer, None if this process may not write; key id -> checker, every key a reader trusts)."""
    secret, private = _secret(), _private_key()
    trusted: Dict[str, object] = {}
    for key in [_public_key(p) for p in settings.REMOTE_CACHE_TRUSTED_KEYS.get()]:
        trusted[key.key_id] = key
    if private is not None:
        trusted[private.key_id] = private.public
    if secret is not None:
        trusted[secret.key_id] = secret
    return private or secret, trusted


def keygen(directory: Path) -> Tuple[Path, Path]:
    """Write a new ed25519 pair into ``directory``: the private key (mode 0600) and the public key to hand to
    readers. Refuses to overwrite an existing private key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / PRIVATE_NAME, directory / PUBLIC_NAME
    if private.exists():
        raise KernelkitError(f"{private} exists already: kernelkit does not overwrite a signing key")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public
