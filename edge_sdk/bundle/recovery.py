"""Kill-safe export: one exporter at a time per target, and the leftovers of a killed one.

A write renames a complete hidden ``.NAME.tmp-*`` directory into place; replacing a bundle takes
two renames (``NAME`` -> ``.NAME.old-*``, then ``.NAME.tmp-*`` -> ``NAME``), which are not
atomic together. A process killed in between leaves no ``NAME`` and the only good copy in
``.NAME.old-*``. So every export holds an exclusive ``fcntl.flock`` on ``.NAME.lock`` beside the
target for its whole run (:class:`ExportLock`), and under that lock first :func:`recover`\\ s:
no other live process can own a ``.tmp-*`` or ``.old-*`` of that target then, so

- a lone ``.old-*`` with no ``NAME`` is renamed back to ``NAME`` (never deleted: it may be the
  only copy);
- an ``.old-*`` beside an existing ``NAME`` (killed after the second rename) is deleted;
- every ``.tmp-*`` (killed before its rename) is deleted.

Readers never take the lock and never change the directory; :func:`missing_bundle_message`
tells them what a missing ``NAME`` with an ``.old-*`` beside it means. The lock file is deleted
by its holder when done (a killed export leaves it; the next one reuses it). POSIX only.

stdlib only.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from edge_sdk.errors import BundleError

__all__ = ["ExportLock", "leftovers", "lock_path", "missing_bundle_message", "recover"]


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


def leftovers(target: Path) -> tuple[list[Path], list[Path]]:
    """(``.NAME.tmp-*``, ``.NAME.old-*``) beside ``target``, sorted; read-only."""
    try:
        names = sorted(os.listdir(target.parent))
    except OSError:
        return [], []
    tmp = [target.parent / n for n in names if n.startswith(f".{target.name}.tmp-")]
    old = [target.parent / n for n in names if n.startswith(f".{target.name}.old-")]
    return tmp, old


def _held_by_someone(target: Path) -> bool:
    """Whether an export holds ``target``'s lock right now (best effort, read-only: a shared
    lock attempt on an existing lock file, released at once)."""
    import fcntl

    try:
        fd = os.open(lock_path(target), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def missing_bundle_message(target: Path) -> str | None:
    """One line for a missing ``target`` with an ``.old-*`` beside it (None otherwise)."""
    _, old = leftovers(target)
    if not old:
        return None
    if _held_by_someone(target):
        return (f"bundle directory not found: {target}; an export to it is running and is "
                f"replacing it right now (the previous bundle is at {old[-1].name}): retry "
                "when the export has finished")
    if len(old) == 1:
        return (f"bundle directory not found: {target}; an export was killed while replacing "
                f"it and the previous bundle is at {old[0]}: run the export again (it puts "
                f"the previous bundle back first) or rename {old[0].name} to {target.name}")
    return (f"bundle directory not found: {target}; {len(old)} previous bundles were left "
            f"beside it by killed exports ({', '.join(p.name for p in old)}): rename the one "
            f"to keep to {target.name}")


def recover(target: Path) -> list[str]:
    """Clean up after killed exports to ``target``; call only under :class:`ExportLock`.
    Returns what was done, one line each."""
    done = []
    tmp, old = leftovers(target)
    if old and not os.path.lexists(target):
        if len(old) == 1:
            os.replace(old[0], target)  # the only copy: put back, never deleted
            done.append(f"restored the previous bundle {target} from {old[0].name} (an "
                        "export was killed while replacing it)")
            old = []
        else:  # which one is the right copy is not ours to guess: keep them all
            done.append(f"left {len(old)} previous bundles beside the missing {target} "
                        f"untouched ({', '.join(p.name for p in old)})")
            old = []
    for path in old:  # NAME exists: these are leftovers of completed replacements
        shutil.rmtree(path, ignore_errors=True)
        done.append(f"removed {path.name}, left by a killed export after its replacement")
    for path in tmp:
        shutil.rmtree(path, ignore_errors=True)
        done.append(f"removed {path.name}, left by a killed export before its rename")
    return done


class ExportLock:
    """Exclusive lock on exports to ``target`` (``with ExportLock(target) as lock:``); entering
    recovers what killed exports left (``lock.recovered`` says what). Another export to the
    same target meanwhile gets a BundleError at once, rather than waiting."""

    def __init__(self, target: str | os.PathLike[str]):
        self.target = Path(os.path.abspath(os.fspath(target)))
        self.recovered: list[str] = []
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> ExportLock:
        import fcntl

        path = lock_path(self.target)
        for _ in range(100):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise BundleError(f"cannot create the export lock {path}: {exc}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise BundleError(f"another export to {self.target} is running (it holds "
                                  f"{path}); wait for it to finish, or export elsewhere") from None
            # the holder before us deletes the file when it is done: a lock on a file no longer
            # at `path` locks nothing another exporter would see, so open it again
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except OSError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise BundleError(f"cannot take the export lock {path}: it keeps being replaced")
        self._fd = fd
        try:
            self.recovered = recover(self.target)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        import fcntl

        if self._fd is not None:
            try:
                os.unlink(lock_path(self.target))  # while still held (see __enter__)
            except OSError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
