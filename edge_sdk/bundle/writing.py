"""Writing a bundle atomically: every file is written and fsynced in a hidden temporary directory
beside the target, then renamed into place, so readers see no bundle, the old one or the whole
new one.

stdlib + pyyaml only.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TYPE_CHECKING

from edge_sdk.bundle.reading import manifest_to_yaml
from edge_sdk.bundle.files import PathLike
from edge_sdk.bundle.recovery import ExportLock
from edge_sdk.bundle.records import FILE_SUFFIX, MANIFEST_NAME, SIGNATURE_NAME, STORE_SUFFIX, _file_name
from edge_sdk.errors import BundleError
from edge_sdk.validation import got

if TYPE_CHECKING:
    from edge_sdk.bundle.manifest import Manifest


def _checked_files(manifest: Manifest, files: Mapping[str, Any]) -> dict[str, bytes]:
    if not isinstance(files, Mapping):
        raise BundleError(f"files: expected a mapping of file name -> bytes, {got(files)}")
    provided: dict[str, bytes] = {}
    for name, blob in files.items():
        path = f"files[{name!r}]"
        unc = manifest.uncertainty is not None and name == manifest.uncertainty.name
        _file_name(name, path, STORE_SUFFIX if manifest.is_store or unc else FILE_SUFFIX)
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise BundleError(f"{path}: expected bytes, {got(blob)}")
        provided[name] = bytes(blob)
    entries = manifest.stored_entries()  # layout store: the store only (the slices are virtual)
    listed = {e.name for e in entries}
    missing = [e.name for e in entries if e.name not in provided]
    if missing:
        raise BundleError(f"no data provided for file(s) listed in the manifest: {', '.join(missing)}")
    extra = [name for name in provided if name not in listed]
    if extra:
        raise BundleError(
            f"file(s) provided but not listed by any configuration in the manifest: {', '.join(extra)}"
        )
    for entry in entries:
        blob = provided[entry.name]
        if len(blob) != entry.bytes:
            raise BundleError(
                f"{entry.name!r}: the manifest says {entry.bytes} bytes, the data has {len(blob)} "
                "(build entries with file_entry(name, data))"
            )
        digest = hashlib.sha256(blob).hexdigest()
        if digest != entry.sha256:
            raise BundleError(
                f"{entry.name!r}: manifest sha256 {entry.sha256} does not match the data's "
                f"sha256 {digest} (build entries with file_entry(name, data))"
            )
    return {entry.name: provided[entry.name] for entry in entries}


def _fresh_name(parent: Path, stem: str) -> Path:
    for _ in range(100):
        candidate = parent / f"{stem}{secrets.token_hex(4)}"
        if not os.path.lexists(candidate):
            return candidate
    raise BundleError(f"cannot find an unused temporary name in {parent}")


def _make_temp_dir(parent: Path, stem: str) -> Path:
    # Not tempfile.mkdtemp: its 0700 mode would make the bundle unreadable to other users.
    for _ in range(100):
        candidate = _fresh_name(parent, stem)
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise BundleError(f"cannot create a temporary directory in {parent}")


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """Best effort: persist a directory's entries (not supported on every platform)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_target(target: Path, force: bool) -> bool:
    """Whether ``target`` exists (and may be replaced); BundleError if it must not be."""
    if not os.path.lexists(target):
        return False
    if not force:
        raise BundleError(f"{target} already exists; pass --force (force=True) to replace it")
    if target.is_symlink() or not target.is_dir():
        raise BundleError(f"{target} exists and is not a bundle directory; refusing to replace it")
    if not (target / MANIFEST_NAME).is_file() and any(target.iterdir()):
        raise BundleError(
            f"{target} exists and is not a bundle (no {MANIFEST_NAME}); refusing to replace it "
            "even with --force"
        )
    return True


#: Fault injection for tests: called with the name of each step of a write ("written": the
#: temporary directory is complete; "aside": the old bundle is renamed aside, the new one not
#: yet in, the only window without NAME; "swapped": the new one is in, the old one not yet
#: deleted). A test sets it in a subprocess to kill it there. None in normal use.
fault_hook: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if fault_hook is not None:
        fault_hook(name)


def _swap(new: Path, target: Path) -> None:
    """Replace directory ``target`` by ``new``: old aside, new in, then delete the old one."""
    old = _fresh_name(target.parent, f".{target.name}.old-")
    os.replace(target, old)
    try:
        _step("aside")
        os.replace(new, target)
    except BaseException:
        try:
            os.replace(old, target)
        except OSError as exc:
            raise BundleError(
                f"could not replace {target}, and could not restore the previous bundle, "
                f"which is now at {old}: {exc}"
            ) from exc
        raise
    _step("swapped")
    shutil.rmtree(old, ignore_errors=True)
    if os.path.lexists(old):
        warnings.warn(f"could not delete the previous bundle moved aside to {old}", stacklevel=3)


def write_bundle(
    bundle_dir: PathLike,
    manifest: Manifest,
    files: Mapping[str, bytes],
    *,
    force: bool = False,
    lock: ExportLock | None = None,
    sign: Callable[[bytes], bytes] | None = None,
) -> Path:
    """Write ``manifest`` and ``files`` (name -> bytes) as the bundle directory ``bundle_dir``.

    ``sign``: manifest bytes -> the signature file's bytes
    (:func:`edge_sdk.trust.signing.signer`); the signature is written inside the same atomic write,
    so a signed bundle never exists unsigned, even for a moment.

    ``files`` must hold exactly the files the manifest lists (layout store: only the weight
    store, ``manifest.store``), with matching sha256 and size (make entries with
    :func:`file_entry`). Everything is written and fsynced in a hidden
    temporary directory next to the target, then renamed into place, so readers see either
    no bundle, the old one or the complete new one. An existing bundle is replaced only with
    ``force`` (old renamed aside, new renamed in, old deleted). On any failure the temporary
    directory is removed and an existing bundle is left as it was. Returns the bundle path.

    The whole write holds the target's :class:`~edge_sdk.bundle.recovery.ExportLock` (``lock``:
    one the caller already holds for its whole export, else taken here), under which what a
    killed export left is recovered first.
    """
    text = manifest_to_yaml(manifest)
    blobs = _checked_files(manifest, files)
    if sign is not None:
        blobs = {**blobs, SIGNATURE_NAME: sign(text.encode("utf-8"))}
    target = Path(os.path.abspath(os.fspath(bundle_dir)))
    if target.name in ("", ".", ".."):
        raise BundleError(f"bundle_dir must name a directory, got {os.fspath(bundle_dir)!r}")
    if lock is None:
        with ExportLock(target):
            return _write_locked(target, text, blobs, force)
    if not lock.held or lock.target != target:
        raise BundleError(f"write_bundle({target}): the lock passed is "
                          f"{'not held' if not lock.held else f'for {lock.target}'}")
    return _write_locked(target, text, blobs, force)


def _write_locked(target: Path, text: str, blobs: dict[str, bytes], force: bool) -> Path:
    parent = target.parent
    _check_target(target, force)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = _make_temp_dir(parent, f".{target.name}.tmp-")
    except OSError as exc:
        raise BundleError(f"could not write bundle {target}: {exc}") from exc
    try:
        for name, data in blobs.items():
            _write_synced(tmp / name, data)
        _write_synced(tmp / MANIFEST_NAME, text.encode("utf-8"))
        _fsync_dir(tmp)
        _step("written")
        if _check_target(target, force):  # checked again: it may have appeared meanwhile
            _swap(tmp, target)
        else:
            os.replace(tmp, target)
        _fsync_dir(parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise BundleError(f"could not write bundle {target}: {exc}") from exc
        raise
    return target
