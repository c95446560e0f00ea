"""Peak memory of ``edge-sdk train`` on a photo folder, and on the same folder 10x larger.

The run is the user's command (``edge-sdk train --config photos``, decoded cache off, the
config's DataLoader workers) at ``--size`` px for ``--epochs``; every 0.5 s the proportional set
size (PSS: shared pages divided among the processes sharing them, so the workers' copy-on-write
pages are not counted twice) is summed over the process and all its children, and the peak is
kept. The larger folder links every training photo ``--times`` times (symlinks: same bytes, a
folder of 10x as many files); validation and test are linked once (they are decoded and held by
the evaluation, whose size is theirs, not the training folder's)::

    python benchmarks/photo_memory.py --data clothing-dataset-small --work runs/photo_memory
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil


def linked(src: Path, dst: Path, times: int) -> Path:
    """``dst``: ``src``'s train/ linked ``times`` times, its other splits once."""
    if (dst / ".done").is_file():
        return dst
    for split in sorted(d for d in src.iterdir() if d.is_dir() and not d.name.startswith(".")):
        for cls in sorted(d for d in split.iterdir() if d.is_dir()):
            out = dst / split.name / cls.name
            out.mkdir(parents=True, exist_ok=True)
            for f in sorted(cls.iterdir()):
                for k in range(times if split.name == "train" else 1):
                    link = out / f"{k}_{f.name}"
                    if not link.exists():
                        link.symlink_to(f.resolve())
    (dst / ".done").write_text("")
    return dst


def pss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def peak_of(folder: Path, args, work: Path) -> tuple[float, float, int]:
    """(peak PSS in GB, wall seconds, samples taken) of one training run."""
    exe = Path(sys.executable).with_name("edge-sdk")
    cmd = [str(exe), "train", "--config", "photos", "--no-progress", "--force",
           "--out", str(work / f"run_{folder.name}")]
    for s in (f"data.source=imagefolder:{folder}", f"data.image_size={args.size}",
              f"train.epochs={args.epochs}", "data.cache=none", "quantize.method=none",
              f"train.threads={args.threads}", *args.set):
        cmd += ["--set", s]
    t0 = time.perf_counter()
    with open(work / f"log_{folder.name}.txt", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        ps = psutil.Process(proc.pid)
        peak, samples = 0, 0
        while proc.poll() is None:
            peak = max(peak, pss(ps))
            samples += 1
            time.sleep(0.5)
            if args.max_seconds and time.perf_counter() - t0 > args.max_seconds:
                proc.terminate()  # the same span of both runs: load, the first steps
                proc.wait()
                return peak / 1e9, time.perf_counter() - t0, samples
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): see {log.name}")
    return peak / 1e9, time.perf_counter() - t0, samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="photo folder with train/ (val/ test/)")
    p.add_argument("--work", default="runs/photo_memory")
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--times", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", action="append", default=[], help="config override")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop each run after this long (the peak of the same span of both)")
    args = p.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    src = Path(args.data).resolve()
    big = linked(src, work / f"x{args.times}", args.times)
    rows = []
    for name, folder in (("1x", src), (f"{args.times}x", big)):
        n = sum(1 for _ in (folder / "train").rglob("*.*"))
        gb, s, k = peak_of(folder, args, work)
        rows.append((name, n, gb, s, k))
        print(f"{name}: {n} training photos, peak PSS {gb:.3f} GB ({k} samples, {s:.0f} s)",
              flush=True)
    print(f"\n| folder | training photos | peak PSS (process + workers) | wall s |\n|---|---|---|---|")
    for name, n, gb, s, _ in rows:
        print(f"| {name} | {n} | {gb:.3f} GB | {s:.0f} |")
    print(f"\nratio {rows[1][2] / rows[0][2]:.3f} (goal <= 1.10; peak <= 2.5 GB at {args.size} px)")


if __name__ == "__main__":
    main()
