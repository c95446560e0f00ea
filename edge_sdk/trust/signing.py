"""Signed bundles (docs/signing.md): an Ed25519 signature over ``manifest.yaml``'s raw
bytes, in ``manifest.yaml.sig`` beside it.

Why the manifest and only it: the manifest lists every file's size and sha256, so signing its
bytes signs every byte of the bundle, and verifying costs one signature check however large the
slices are (their sha256 is checked anyway, on the bytes the interpreters are built from).
Why a sha256 alone is not enough: anyone who can write the bundle directory can rewrite the
files *and* the manifest; only a key the app was built with says the update came from its team.

The verifier reads the manifest's bytes once, checks the signature over exactly those bytes
*before* parsing them (the YAML parser never sees unsigned input), then parses the same bytes,
and refuses any file in the directory the manifest does not list. Each refusal has its type:
:class:`UnsignedBundleError`, :class:`UntrustedKeyError`, :class:`SignatureMismatchError`,
:class:`UnlistedFileError`; a listed file changed after signing is the runtime's
:class:`ChecksumMismatchError`.

The signature file (ASCII, four lines; strict)::

    edge-sdk-signature: 1
    algorithm: ed25519
    key: <sha256 of the signer's public key, SubjectPublicKeyInfo DER, 64 hex>
    signature: <base64 of the 64-byte Ed25519 signature of manifest.yaml's bytes>

Keys are PEM files as OpenSSL writes them (``openssl genpkey -algorithm ed25519``: PKCS#8;
``openssl pkey -pubout``: SubjectPublicKeyInfo), so the signature also verifies with
``openssl pkeyutl -verify -rawin`` (docs/signing.md). Needs the optional ``cryptography``
package (``nested-edge-sdk[sign]``); without it every entry point here raises
:class:`SigningUnavailableError` naming the install line.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Union

from edge_sdk.bundle.reading import _MAX_MANIFEST_BYTES, _parse_manifest_text
from edge_sdk.bundle.records import MANIFEST_NAME, SIGNATURE_NAME
from edge_sdk.errors import (
    BundleError,
    ConfigError,
    SignatureError,
    SignatureMismatchError,
    SigningKeyError,
    SigningUnavailableError,
    UnlistedFileError,
    UnsignedBundleError,
    UntrustedKeyError,
)

if TYPE_CHECKING:  # cryptography is the optional [sign] extra: imported where used
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    from edge_sdk.bundle.manifest import Manifest

__all__ = ["INSTALL", "KeyLike", "generate_keypair", "key_id",
           "load_private_key", "load_public_key", "read_trusted_manifest", "sign_bundle",
           "signature_text", "signer"]

INSTALL = "pip install 'nested-edge-sdk[sign]'"
KeyLike = Union[str, "os.PathLike[str]", bytes]
_HEADER = "edge-sdk-signature: 1"
_MAX_SIG_BYTES = 1024  # the file is ~200 bytes; read no more
_MAX_KEY_BYTES = 16 << 10
_LINE = re.compile(r"^edge-sdk-signature: 1\nalgorithm: ed25519\nkey: ([0-9a-f]{64})\n"
                   r"signature: ([A-Za-z0-9+/]{86}==)\n$")


def _crypto() -> None:
    """SigningUnavailableError with the install line unless the ``cryptography`` modules used
    here import (each function imports them by name after this check)."""
    try:
        from cryptography.exceptions import InvalidSignature  # noqa: F401
        from cryptography.hazmat.primitives import serialization  # noqa: F401
        from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: F401
    except ImportError:
        raise SigningUnavailableError(
            "signed bundles need the optional cryptography package, which is not installed: "
            f"{INSTALL}") from None


# ---------------------------------------------------------------------------------- keys
def _key_bytes(key: KeyLike, what: str) -> tuple[bytes, str]:
    """(PEM bytes, a name for messages) of a path or PEM bytes."""
    if isinstance(key, (bytes, bytearray)):
        return bytes(key), f"{what} (PEM bytes)"
    if not isinstance(key, (str, os.PathLike)):
        raise SigningKeyError(f"{what} must be a PEM file path or PEM bytes, got "
                              f"{type(key).__name__}")
    p = Path(key)
    if not p.is_file():
        state = "is not a regular file" if p.exists() else "does not exist"
        raise SigningKeyError(f"{what} {p} {state}; expected an Ed25519 PEM key file")
    try:
        with open(p, "rb") as f:
            data = f.read(_MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise SigningKeyError(f"cannot read {what} {p}: {exc}") from None
    if len(data) > _MAX_KEY_BYTES:
        raise SigningKeyError(f"{what} {p} is larger than {_MAX_KEY_BYTES} bytes; an Ed25519 PEM "
                              "key is about 120")
    return data, f"{what} {p}"


def load_private_key(key: KeyLike) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PKCS#8 PEM file (``openssl genpkey -algorithm ed25519``)
    or its bytes; SigningKeyError naming what it is otherwise."""
    _crypto()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    data, name = _key_bytes(key, "signing key")
    if b"PUBLIC KEY" in data and b"PRIVATE KEY" not in data:
        raise SigningKeyError(f"{name} is a public key; signing needs the private key (PKCS#8 "
                              "PEM, 'BEGIN PRIVATE KEY')")
    try:
        k = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise SigningKeyError(f"{name} is encrypted; edge-sdk reads unencrypted PKCS#8 PEM "
                              "keys (openssl genpkey -algorithm ed25519)") from None
    except (ValueError, binascii.Error) as exc:
        raise SigningKeyError(f"{name} is not a PEM private key ({_first(exc)}); expected "
                              "an Ed25519 key in PKCS#8 PEM") from None
    if not isinstance(k, ed25519.Ed25519PrivateKey):
        raise SigningKeyError(f"{name} is a {type(k).__name__.lstrip('_')}, expected an "
                              "Ed25519 private key")
    return k


def load_public_key(key: KeyLike) -> Ed25519PublicKey:
    """An Ed25519 public key from a SubjectPublicKeyInfo PEM file (``openssl pkey -pubout``)
    or its bytes; SigningKeyError naming what it is otherwise (a private key is refused:
    an app ships public keys only)."""
    _crypto()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    data, name = _key_bytes(key, "trusted key")
    if b"PRIVATE KEY" in data:
        raise SigningKeyError(f"{name} is a private key; trusted keys are public keys (derive "
                              "one with edge-sdk keygen or openssl pkey -pubout), and a private "
                              "key must never ship with an app")
    try:
        k = serialization.load_pem_public_key(data)
    except (ValueError, binascii.Error) as exc:
        raise SigningKeyError(f"{name} is not a PEM public key ({_first(exc)}); expected an "
                              "Ed25519 key in SubjectPublicKeyInfo PEM") from None
    if not isinstance(k, ed25519.Ed25519PublicKey):
        raise SigningKeyError(f"{name} is a {type(k).__name__.lstrip('_')}, expected an "
                              "Ed25519 public key")
    return k


def key_id(public_key: Ed25519PublicKey) -> str:
    """sha256 (hex) of the key's SubjectPublicKeyInfo DER: what a signature file names."""
    _crypto()
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _first(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:160] or type(exc).__name__


def generate_keypair(private_path: str | os.PathLike[str], public_path: str | os.PathLike[str] | None
                     = None, force: bool = False) -> tuple[Path, Path]:
    """Write a new Ed25519 key pair: the private key as unencrypted PKCS#8 PEM (mode 0600),
    the public key as SubjectPublicKeyInfo PEM (default: ``<private>.pub``). Each written
    atomically; an existing file is replaced only with ``force``."""
    _crypto()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    priv = Path(private_path)
    pub = Path(public_path) if public_path is not None else priv.with_name(priv.name + ".pub")
    if priv.resolve() == pub.resolve():
        raise ConfigError(f"the private and public key paths are the same file: {priv}")
    for p in (priv, pub):
        if p.exists() and not force:
            raise ConfigError(f"{p} exists; pass --force to replace it (a replaced key cannot "
                              "sign for apps that trust the old one)")
    k = ed25519.Ed25519PrivateKey.generate()
    pem = k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
    pub_pem = k.public_key().public_bytes(serialization.Encoding.PEM,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    _write_atomic(priv, pem, 0o600)
    _write_atomic(pub, pub_pem, 0o644)
    return priv, pub


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Temp file in the same directory (created with ``mode``, never wider), fsync, rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ConfigError(f"could not write {path}: {exc}") from None


# ------------------------------------------------------------------------------ signing
def signature_text(manifest_bytes: bytes, private_key: Ed25519PrivateKey) -> bytes:
    """The signature file's bytes for ``manifest_bytes`` (see the module docstring)."""
    sig = private_key.sign(bytes(manifest_bytes))
    return (f"{_HEADER}\nalgorithm: ed25519\nkey: {key_id(private_key.public_key())}\n"
            f"signature: {base64.b64encode(sig).decode('ascii')}\n").encode("ascii")


def signer(key: KeyLike) -> Callable[[bytes], bytes]:
    """``manifest bytes -> signature file bytes`` with ``key`` (loaded now, so a bad key fails
    before anything is written); what :func:`edge_sdk.bundle.write_bundle` takes as ``sign``."""
    private_key = load_private_key(key)
    return lambda data: signature_text(data, private_key)


def sign_bundle(bundle_dir: str | os.PathLike[str], key: KeyLike) -> Path:
    """Sign the bundle at ``bundle_dir`` with the private ``key``: the manifest must parse and
    every file it lists must match (size, sha256) before anything is signed, and nothing
    unlisted may be in the directory. Writes ``manifest.yaml.sig`` atomically (replacing an
    older signature) and returns its path."""
    from edge_sdk.bundle.reading import read_manifest, verify_files

    sign = signer(key)
    root = Path(bundle_dir)
    read_manifest(root, verify=False)  # the typed errors for a missing or broken bundle
    data = _read_manifest_bytes(root)
    manifest = _parse_manifest_text(data, str(root / MANIFEST_NAME))
    verify_files(root, manifest)  # never sign bytes that already fail their checksums
    _check_listed(root, manifest)
    out = root / SIGNATURE_NAME
    _write_atomic(out, sign(data), 0o644)
    return out


# ----------------------------------------------------------------------------- verifying
@dataclass(frozen=True)
class _Signature:
    key: str
    signature: bytes


def _read_manifest_bytes(root: Path) -> bytes:
    path = root / MANIFEST_NAME
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_MANIFEST_BYTES + 1)  # the parser refuses more
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc}") from None


def _read_signature(root: Path) -> _Signature:
    path = root / SIGNATURE_NAME
    if not path.exists() and not path.is_symlink():
        raise UnsignedBundleError(f"{root} is not signed (no {SIGNATURE_NAME}); trusted keys "
                                  "were given, so only a bundle signed by one of them loads "
                                  "(edge-sdk sign BUNDLE --key KEY)")
    if path.is_symlink() or not path.is_file():
        raise SignatureError(f"{path} is not a regular file; expected the signature file "
                             "edge-sdk sign writes")
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_SIG_BYTES + 1)
    except OSError as exc:
        raise SignatureError(f"cannot read {path}: {exc}") from None
    try:
        m = _LINE.match(data.decode("ascii")) if len(data) <= _MAX_SIG_BYTES else None
    except UnicodeDecodeError:
        m = None
    if m is None:
        raise SignatureError(f"{path} is not an edge-sdk signature file (expected four lines: "
                             f"'{_HEADER}', 'algorithm: ed25519', 'key: <64 hex>', "
                             "'signature: <base64 of 64 bytes>')")
    return _Signature(m.group(1), base64.b64decode(m.group(2), validate=True))


def _trusted(trusted_keys: Iterable[KeyLike] | KeyLike) -> dict[str, Ed25519PublicKey]:
    if isinstance(trusted_keys, (str, bytes, bytearray, os.PathLike)):
        trusted_keys = [trusted_keys]  # one key given as itself
    try:
        keys = list(trusted_keys)
    except TypeError:
        raise SigningKeyError(f"trusted_keys must be a list of PEM file paths or PEM bytes, got "
                              f"{type(trusted_keys).__name__}") from None
    if not keys:
        raise SigningKeyError("trusted_keys is empty: name at least one public key (or pass "
                              "None to load unsigned bundles)")
    out: dict[str, Ed25519PublicKey] = {}
    for k in keys:
        pk = load_public_key(k)
        out[key_id(pk)] = pk
    return out


def _check_listed(root: Path, manifest: Manifest) -> None:
    listed = {MANIFEST_NAME, SIGNATURE_NAME} | {e.name for e in manifest.stored_entries()}
    try:
        present = sorted(os.listdir(root))
    except OSError as exc:
        raise BundleError(f"cannot list {root}: {exc}") from None
    extra = [n for n in present if n not in listed]
    if extra:
        shown = ", ".join(repr(n) for n in extra[:5]) + (" ..." if len(extra) > 5 else "")
        raise UnlistedFileError(f"{root} holds {len(extra)} file(s) its manifest does not list "
                                f"({shown}); a signed bundle holds only its manifest, "
                                f"{SIGNATURE_NAME} and the files the manifest lists")


def read_trusted_manifest(bundle_dir: str | os.PathLike[str],
                          trusted_keys: Iterable[KeyLike] | KeyLike) -> Manifest:
    """The bundle's Manifest, parsed from bytes whose signature verified under one of
    ``trusted_keys`` *before* they were parsed; every file of the directory must be listed.
    The listed files' sizes and sha256 are the runtime's next check (``read_slices`` /
    ``read_store``): a byte changed after signing is a ChecksumMismatchError there."""
    _crypto()
    from cryptography.exceptions import InvalidSignature

    keys = _trusted(trusted_keys)
    root = Path(bundle_dir)
    if not (root / MANIFEST_NAME).is_file():
        from edge_sdk.bundle.reading import read_manifest

        read_manifest(root, verify=False)  # its typed error for a missing bundle or manifest
    data = _read_manifest_bytes(root)
    sig = _read_signature(root)
    if sig.key not in keys:
        raise UntrustedKeyError(f"{root} is signed by key {sig.key[:16]}..., which is not "
                                f"among the {len(keys)} trusted key(s) "
                                f"({', '.join(k[:16] + '...' for k in keys)})")
    try:
        keys[sig.key].verify(sig.signature, data)
    except InvalidSignature:
        raise SignatureMismatchError(
            f"{root}: the signature by trusted key {sig.key[:16]}... does not match "
            f"{MANIFEST_NAME}'s bytes: the manifest changed after it was signed") from None
    manifest = _parse_manifest_text(data, str(root / MANIFEST_NAME))
    _check_listed(root, manifest)
    return manifest
