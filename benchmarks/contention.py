"""Real contention for the model's core (issue goal: keep p95 under T): a busy process pinned to
the core the model's thread is pinned to, started and stopped mid-run; the same bundle answered
(a) by the policy under ``UnderContention(latency_ms=T, quantile=0.95)`` and (b) pinned to the
full width the policy picks unconstrained, T = that full width's uncontended p95 x 1.2, both
measured in this run. Per arm and phase (quiet, contended, quiet again): the share of calls
within T, p50 / p95 of the whole ``predict`` call timed from outside, the configurations that
answered, switches of width after the first 20 calls of the phase (and apart, changes between
precision variants of one width: the policy's probes), accuracy on the test split, and how
many calls the rule took to react to the busy process starting and ending.

    python benchmarks/contention.py --bundle BUNDLE --data /work/shared/data/cifar10_dev.npz \\
        [--seconds 12] [--json out.json]

Linux only (os.sched_setaffinity); 1 interpreter thread; an otherwise idle host.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np

import edge_sdk

HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass\n"


def _xy(path: str | None, spec, n: int = 2000):
    if path is None:
        lo, hi = spec.value_range
        x = np.random.default_rng(0).uniform(lo, hi, (n, *spec.shape[1:])).astype(spec.dtype)
        return x, None
    d = np.load(path)
    return d["x_test"][:n], d["y_test"][:n]


def run_phase(model, xs, ys, seconds: float, pin: str | None, t_ms: float) -> dict:
    pc = time.perf_counter
    lat, cfg, ok = [], [], []
    end = pc() + seconds
    i = 0
    while pc() < end:
        j = i % len(xs)
        t0 = pc()
        p = model.predict(xs[j], config_id=pin)
        lat.append((pc() - t0) * 1e3)
        cfg.append(p.config_id)
        if ys is not None:
            ok.append(p.label == int(ys[j]))
        i += 1
    return {"lat": lat, "cfg": cfg, "ok": ok}


def summary(name: str, ph: dict, t_ms: float, first: str) -> dict:
    a = np.asarray(ph["lat"])
    cfg = ph["cfg"]
    # a switch: the answering network (width) changed; a precision variant's probe (the
    # policy times another precision of the same network for a few calls) is counted apart
    width = [c.split("-")[0] for c in cfg]
    switches = sum(1 for x, y in zip(width[20:], width[21:]) if x != y)
    probes = sum(1 for x, y, a, b in zip(cfg[20:], cfg[21:], width[20:], width[21:])
                 if x != y and a == b)
    w0 = first.split("-")[0]  # the full width, whatever precision answers it
    moved = next((i for i, c in enumerate(width) if c != w0), None)
    back = next((i for i, c in enumerate(width) if c == w0), None)
    return {"phase": name, "calls": len(a), "within": float(np.mean(a <= t_ms)),
            "p50": float(np.median(a)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)),
            "answered": Counter(cfg).most_common(3), "switches_after_20": switches,
            "variant_changes": probes,
            "accuracy": float(np.mean(ph["ok"])) if ph["ok"] else None,
            "first_other": moved, "first_back": back}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--data", default=None, help="an npz with x_test / y_test (accuracy)")
    ap.add_argument("--seconds", type=float, default=12.0, help="per phase")
    ap.add_argument("--quantile", type=float, default=0.95)
    ap.add_argument("--factor", type=float, default=1.2, help="T = factor x uncontended p95")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not hasattr(os, "sched_setaffinity"):
        print("no os.sched_setaffinity on this platform: nothing to measure")
        return
    core = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})  # the model's thread (this one) on one core
    plain = edge_sdk.load(args.bundle, threads=1)
    xs, ys = _xy(args.data, plain.input_spec)
    for _ in range(3000):
        plain.predict(xs[_ % len(xs)])  # the variants measured, the incumbent settled
    full = plain.predict(xs[0]).config_id
    base = run_phase(plain, xs, ys, min(args.seconds, 5.0), full, 0.0)
    p95 = float(np.percentile(base["lat"], 95))
    t_ms = args.factor * p95
    print(f"host {os.cpu_count()} cores, model thread pinned to core {core}; unconstrained "
          f"choice {full}: uncontended p50 {np.median(base['lat']):.4f} ms, p95 {p95:.4f} ms "
          f"-> T = {args.factor:g} x p95 = {t_ms:.4f} ms")
    ruled = edge_sdk.load(args.bundle, threads=1, rules=[
        edge_sdk.UnderContention(latency_ms=t_ms, quantile=args.quantile)])
    for _ in range(3000):
        ruled.predict(xs[_ % len(xs)])
    rows = []
    for arm, model, pin in (("rule UnderContention", ruled, None),
                            (f"pinned {full}", plain, full)):
        phases = []
        for name in ("quiet", "contended", "quiet again"):
            hog = None
            if name == "contended":
                hog = subprocess.Popen([sys.executable, "-c", HOG, str(core)])
                time.sleep(0.05)  # the hog running before the phase's first call
            try:
                ph = run_phase(model, xs, ys, args.seconds, pin, t_ms)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
            phases.append(summary(name, ph, t_ms, full))
        rows.append((arm, phases))
    print(f"\n{'arm':<28}{'phase':<13}{'calls':>7}{'within T':>9}{'p50 ms':>8}{'p95 ms':>8}"
          f"{'p99 ms':>8}{'switches':>9}{'variant':>8}{'acc':>7}  answered by")
    for arm, phases in rows:
        for s in phases:
            who = ", ".join(f"{c} {n / s['calls']:.0%}" for c, n in s["answered"])
            acc = "-" if s["accuracy"] is None else f"{s['accuracy']:.3f}"
            print(f"{arm:<28}{s['phase']:<13}{s['calls']:>7}{s['within']:>9.1%}{s['p50']:>8.3f}"
                  f"{s['p95']:>8.3f}{s['p99']:>8.3f}{s['switches_after_20']:>9}"
                  f"{s['variant_changes']:>8}{acc:>7}  {who}")
    # which configurations meet T under contention at all: each network's answering variant
    # pinned, the busy process running (the widest that does is what the rule should answer)
    oracle = []
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(core)])
    time.sleep(0.05)
    try:
        for c in plain.policy.candidates:
            ph = run_phase(plain, xs, ys, min(args.seconds, 4.0), c.id, t_ms)
            oracle.append(summary("contended", ph, t_ms, c.id) | {"config": c.id,
                                                                   "width": c.width})
    finally:
        hog.kill()
        hog.wait()
    print(f"\neach network pinned under the same contention (T = {t_ms:.4f} ms):")
    print(f"{'configuration':<20}{'calls':>7}{'within T':>9}{'p50 ms':>8}{'p95 ms':>8}{'acc':>7}")
    for s in oracle:
        acc = "-" if s["accuracy"] is None else f"{s['accuracy']:.3f}"
        print(f"{s['config']:<20}{s['calls']:>7}{s['within']:>9.1%}{s['p50']:>8.3f}"
              f"{s['p95']:>8.3f}{acc:>7}")
    meets = [s for s in oracle if s["within"] >= args.quantile]
    widest = max(meets, key=lambda s: s["width"])["config"] if meets else None
    print(f"the widest network that meets T on >= {args.quantile:.0%} of contended calls: "
          f"{widest}")
    rule = rows[0][1]
    print(f"\nreaction: the rule left {full} after {rule[1]['first_other']} calls of contention "
          f"and came back after {rule[2]['first_back']} calls of quiet "
          f"(T = {t_ms:.4f} ms, quantile {args.quantile:g})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"T_ms": t_ms, "full": full, "uncontended_p95": p95, "rows": rows,
                       "oracle": oracle, "widest": widest}, f, indent=1)


if __name__ == "__main__":
    main()
