"""Atomic file writes for the report (a reader never sees a half-written PNG or report.md)."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
