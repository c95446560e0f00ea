"""Device-side subcommands (``edge-sdk run``, ``edge-sdk bench``): numpy + the interpreter only."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from edge_sdk.errors import InputError


def _read_input(path: str, spec) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--input {path} does not exist")
    if p.suffix == ".npy":
        return np.load(p, allow_pickle=False)
    try:
        from PIL import Image
    except ImportError as e:
        raise InputError(f"reading {p.suffix} images needs Pillow: pip install 'nested-edge-sdk[image]' "
                         "(or pass a .npy array)") from e
    _, h, w, c = spec.shape
    img = Image.open(p).convert("L" if c == 1 else "RGB").resize((w, h))
    arr = np.asarray(img, dtype=np.float32).reshape(h, w, c)
    lo, hi = spec.value_range
    return arr / 255.0 * (hi - lo) + lo  # image pixels 0..255 onto the model's raw range


def _is_batch(x: np.ndarray, spec) -> bool:
    """Whether an ``--input`` array is a batch, decided from the bundle's input spec
    ``[1, H, W, C]``: ``[N, H, W, C]`` is; for a grey model (C = 1) so is ``[N, H, W]``, while
    ``[H, W]`` and ``[H, W, 1]`` are one sample. Anything else goes to ``predict`` as one
    sample, whose shape error names the forms it accepts."""
    _, h, w, c = spec.shape
    if x.ndim == 4:
        return True
    return c == 1 and x.ndim == 3 and x.shape != (h, w, 1) and x.shape[1:] == (h, w)


def run_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="edge-sdk run",
                                description="Predict with a bundle under a budget.")
    p.add_argument("bundle")
    p.add_argument("--input", required=True,
                   help=".npy: one sample [H, W, C] or a batch [N, H, W, C] (a grey model also "
                        "takes [H, W] and [N, H, W]); or an image")
    p.add_argument("--latency-ms", type=float, default=None)
    p.add_argument("--memory-mb", type=float, default=None)
    p.add_argument("--policy", choices=["best", "cascade"], default="best")
    p.add_argument("--target-accuracy", type=float, default=0.95)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true", help="one JSON object per prediction")
    args = p.parse_args(argv)
    import edge_sdk

    model = edge_sdk.load(args.bundle, threads=args.threads, policy=args.policy,
                          target_accuracy=args.target_accuracy)
    budget = edge_sdk.Budget(args.latency_ms, args.memory_mb)
    x = _read_input(args.input, model.input_spec)
    batch = _is_batch(x, model.input_spec)
    preds = model.predict_batch(x, budget) if batch else [model.predict(x, budget)]
    for pr in preds:
        if args.json:
            print(json.dumps(pr.to_dict()))
        else:
            print(f"{pr.class_name}\tconfidence {pr.confidence:.4f}\tMI {pr.mutual_info:.5f}"
                  f"\t{'ABSTAIN' if pr.abstain else 'ok'}\t{pr.config_id}\t{pr.latency_ms:.3f} ms"
                  f"\tbudget {'met' if pr.budget_met else 'MISSED'}")
    return 0


def bench_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="edge-sdk bench",
                                description="Per-configuration latency of predict() against raw "
                                            "interpreter invoke() (median, batch 1).")
    p.add_argument("bundle")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import edge_sdk

    model = edge_sdk.load(args.bundle, threads=args.threads)
    spec = model.input_spec
    lo, hi = spec.value_range
    x = np.random.default_rng(0).uniform(lo, hi, spec.shape[1:]).astype(np.float32)
    print(f"backend {model.backend}, {args.threads} thread(s), {args.repeats} repeats")
    print(f"{'configuration':<16}{'invoke ms':>10}{'predict ms':>11}{'overhead us':>12}"
          f"{'ratio':>7}{'manifest MB':>12}")
    for c in model.manifest.configurations:
        interps = model._interpreters(c)
        xin = model._prepare(x, "x")
        for it, inp, _ in interps:
            it.set_tensor(inp, xin)
        raw, full = [], []
        for _ in range(args.repeats):  # interleaved, so drift hits both
            t0 = time.perf_counter()
            for it, _, _ in interps:
                it.invoke()
            raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            model.predict(x, config_id=c.id)
            full.append(time.perf_counter() - t0)
        r, f = statistics.median(raw) * 1e3, statistics.median(full) * 1e3
        mb = "-" if c.memory_mb is None else f"{c.memory_mb:.1f}"
        print(f"{c.id:<16}{r:>10.3f}{f:>11.3f}{(f - r) * 1e3:>12.1f}{f / r:>7.2f}{mb:>12}")
    return 0


def profile_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="edge-sdk profile",
        description="Measure this device through the real interpreter on a bundle's own slices "
                    "and write a device profile: effective GMAC/s and per-invoke overhead per "
                    "thread count, plus every configuration's latency. By default it goes to "
                    "the cache that edge_sdk.load(bundle, profile='auto') reads.")
    p.add_argument("bundle")
    p.add_argument("--out", default=None, help="profile YAML to write (default: the cache)")
    p.add_argument("--threads", default=None,
                   help="comma-separated thread counts (default: 1 and every core)")
    p.add_argument("--repeats", type=int, default=50, help="timed invokes per slice")
    p.add_argument("--name", default=None, help="profile name (default: this host's name)")
    args = p.parse_args(argv)
    from edge_sdk.errors import ProfileError
    from edge_sdk.profiles import cached_profile_path, measure_profile, write_profile

    try:
        threads = None if args.threads is None else \
            [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        raise ProfileError(f"--threads must be comma-separated integers, got {args.threads!r}")
    prof, rows = measure_profile(args.bundle, threads, args.repeats, args.name)
    print(f"{'threads':>7}  {'configuration':<16}{'MACs':>11}{'measured ms':>13}{'fitted ms':>11}"
          f"{'error':>8}")
    for r in rows:
        err = r["fitted_ms"] / r["measured_ms"] - 1
        print(f"{r['threads']:>7}  {r['config']:<16}{r['macs']:>11}{r['measured_ms']:>13.4f}"
              f"{r['fitted_ms']:>11.4f}{err:>+8.1%}")
    for route, table in prof.throughput.items():
        for t, f in sorted(table.items()):
            print(f"{route} {t} thread(s): {f.gmacs:.2f} GMAC/s effective, "
                  f"{f.overhead_ms * 1e3:.1f} us per invoke")
    out = args.out or cached_profile_path(args.bundle)
    header = ("# Written by `edge-sdk profile`: every figure below was measured on this host\n"
              "# through the real interpreter on the bundle named in `sources`.\n")
    print(write_profile(prof, out, header))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(sys.argv[1:]))
