"""A bundle's files on disk: where a name the manifest lists resolves (inside the bundle
directory, never through a link out of it) and the sha256 every file is checked against.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Union

from edge_sdk.bundle.records import FILE_SUFFIX, STORE_SUFFIX, _file_name
from edge_sdk.errors import BundleError

__all__ = ["PathLike", "resolve_file", "sha256_file"]

PathLike = Union[str, "os.PathLike[str]"]
_CHUNK = 1 << 20  # hashing reads files in 1 MiB chunks


def sha256_file(path: PathLike) -> tuple[str, int]:
    """(hex sha256, bytes read) of a file, hashed in chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def resolve_file(bundle_dir: PathLike, name: str) -> Path:
    """The path of bundle file ``name`` (a ``.tflite`` file or the ``.bin`` weight store), which
    must exist and resolve to inside ``bundle_dir``."""
    is_store = isinstance(name, str) and name.endswith(STORE_SUFFIX)
    _file_name(name, "file name", STORE_SUFFIX if is_store else FILE_SUFFIX)
    root = Path(bundle_dir).resolve()
    candidate = root / name
    resolved = candidate.resolve()  # follows symlinks
    if resolved == root or not resolved.is_relative_to(root):
        raise BundleError(
            f"{root}: file {name!r} resolves to {resolved}, outside the bundle directory; "
            "bundle files must be inside the bundle"
        )
    if not resolved.exists():
        raise BundleError(f"{root}: file {name!r} listed in the manifest is missing")
    if not resolved.is_file():
        raise BundleError(f"{root}: {name!r} is not a regular file")
    return resolved
