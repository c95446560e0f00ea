"""Kill-safe export (issue 19 §2): a subprocess replacing a bundle is killed at each step of the
write (fault hook in edge_sdk.bundle.writing); load() then never changes the directory and says
in one line what a missing bundle with a lone ``.NAME.old-*`` means; the next export, under the
target's lock, puts that copy back and removes stale ``.tmp-*``, never a running export's files.
And load() racing a live export sees the old or the new bundle, or a typed error. No torch."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import edge_sdk
from edge_sdk import bundle as b
from edge_sdk.bundle.recovery import lock_path
from edge_sdk.errors import BundleError
from test_bundle import files_for, manifest_dict

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _manifest(tag: str) -> b.Manifest:
    data = manifest_dict()
    data["source"] = {"tag": tag}
    return b.Manifest.from_dict(data)


def _tag(target: Path) -> str:
    return b.read_manifest(target).source["tag"]


# The child writes bundle `tag` to `target` (force) and, at step `kill_at`, kills itself
# (SIGKILL: no cleanup, no finally) or, with `pause`, touches `ready` and waits for `go`.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    sys.path[:0] = [{tests!r}, {root!r}]
    from edge_sdk import bundle as b
    from edge_sdk.bundle import writing
    from test_export_recovery import _manifest
    from test_bundle import files_for
    target, tag, kill_at, mode, ready, go, repeat = sys.argv[1:8]

    def hook(step):
        if step != kill_at:
            return
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        Path(ready).touch()
        while not Path(go).exists():
            time.sleep(0.01)

    writing.fault_hook = hook
    for i in range(int(repeat)):
        t = tag if int(repeat) == 1 else ("A" if i % 2 else "B")
        m = _manifest(t)
        b.write_bundle(target, m, files_for(m), force=True)
""").format(tests=str(HERE), root=str(ROOT))


def _child(target: Path, tag: str, kill_at: str = "", mode: str = "kill", repeat: int = 1,
           tmp: Path | None = None) -> subprocess.Popen:
    tmp = tmp or target.parent
    return subprocess.Popen([sys.executable, "-c", CHILD, str(target), tag, kill_at, mode,
                             str(tmp / "ready"), str(tmp / "go"), str(repeat)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _listing(parent: Path) -> list[tuple[str, int]]:
    return sorted((p.name, p.stat().st_ino) for p in parent.iterdir())


@pytest.fixture
def target(tmp_path) -> Path:
    t = tmp_path / "out" / "bundle"
    m = _manifest("A")
    b.write_bundle(t, m, files_for(m))
    assert sorted(os.listdir(t.parent)) == ["bundle"]  # the lock file went with its holder
    return t


@pytest.mark.parametrize("step", ["written", "aside", "swapped"])
def test_a_kill_at_each_step_is_recovered_by_the_next_export(target, step):
    child = _child(target, "B", step)
    assert child.wait(60) == -signal.SIGKILL, child.stderr.read()
    tmp, old = b.recovery.leftovers(target)
    before = _listing(target.parent)
    if step == "aside":  # the window: no NAME, the only good copy aside
        assert not target.exists() and len(old) == 1 and len(tmp) == 1
        for load in (b.read_manifest, lambda t: edge_sdk.load(t, profile=None)):
            with pytest.raises(BundleError) as info:
                load(target)
            msg = str(info.value)
            assert "\n" not in msg and old[0].name in msg
            assert "killed while replacing it" in msg and "run the export again" in msg
    else:  # NAME is whole: the old one (written) or the new one (swapped)
        assert _tag(target) == {"written": "A", "swapped": "B"}[step]
        assert len(tmp) == (step == "written") and len(old) == (step == "swapped")
    assert _listing(target.parent) == before  # load() never changes the directory
    with b.ExportLock(target) as lock:  # what the next export does first
        assert len(lock.recovered) == 1 + (step == "aside")
        assert _tag(target) == {"written": "A", "aside": "A", "swapped": "B"}[step]
        assert b.recovery.leftovers(target) == ([], [])
    m = _manifest("C")
    b.write_bundle(target, m, files_for(m), force=True)
    assert _tag(target) == "C" and sorted(os.listdir(target.parent)) == ["bundle"]


def test_a_running_exports_files_are_never_touched(target, tmp_path):
    """While an export is paused between its renames (holding the lock), a second export is
    refused at once and leaves everything as it is; load() says an export is running."""
    child = _child(target, "B", "aside", mode="pause", tmp=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert child.poll() is None and time.monotonic() < deadline, child.stderr.read()
            time.sleep(0.01)
        before = _listing(target.parent)
        m = _manifest("C")
        with pytest.raises(BundleError, match="another export to .* is running"):
            b.write_bundle(target, m, files_for(m), force=True)
        with pytest.raises(BundleError, match="an export to it is running"):
            b.read_manifest(target)
        assert _listing(target.parent) == before
    finally:
        (tmp_path / "go").touch()
    assert child.wait(60) == 0, child.stderr.read()
    assert _tag(target) == "B" and sorted(os.listdir(target.parent)) == ["bundle"]


def test_two_killed_exports_leave_both_copies_for_a_person_to_choose(target):
    for tag in ("B", "C"):  # the second export restores A first, then is killed the same way
        assert _child(target, tag, "aside").wait(60) == -signal.SIGKILL
        with b.ExportLock(target):
            pass
    child = _child(target, "D", "aside")
    assert child.wait(60) == -signal.SIGKILL
    stray = target.parent / ".bundle.old-stray"  # a second copy nobody can rank
    os.rename(b.recovery.leftovers(target)[1][0], stray)
    (target.parent / ".bundle.old-other").mkdir()
    with pytest.raises(BundleError, match="2 previous bundles were left beside it"):
        b.read_manifest(target)
    with b.ExportLock(target) as lock:
        assert any("untouched" in line for line in lock.recovered)
    assert stray.is_dir() and (target.parent / ".bundle.old-other").is_dir()


def test_load_racing_a_live_export_sees_a_whole_bundle_or_a_typed_error(target):
    child = _child(target, "", repeat=200)
    seen: dict[str, int] = {}
    while child.poll() is None:
        try:
            m = b.read_manifest(target)  # sha256 of every file against its manifest
            seen[m.source["tag"]] = seen.get(m.source["tag"], 0) + 1
        except BundleError as exc:
            assert "\n" not in str(exc)
            seen["typed error"] = seen.get("typed error", 0) + 1
    assert child.returncode == 0, child.stderr.read()
    assert set(seen) <= {"A", "B", "typed error"} and seen.get("A", 0) + seen.get("B", 0) > 0
    assert sorted(os.listdir(target.parent)) == ["bundle"] and not lock_path(target).exists()
