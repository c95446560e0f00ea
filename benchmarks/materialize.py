"""Materialisation on the device (issue 21 goals): per store bundle, what load() costs, how long
one slice takes to materialise (goal: one full-width sample of nested_vgg at 32x32, width_mult
0.5, <= 100 ms; width_mult 1.0 reported too), a width switch between resident slices (goal:
p99 <= 0.5 ms of SDK time, as before the store) and the first use of a non-resident slice
(materialise + verify + build + warm-up), reported apart from the latency estimate.

    python benchmarks/materialize.py --bundle B1 [--bundle B2 ...] [--repeats 15]

Torch-free (edge_sdk only); 1 interpreter thread. Every figure is a median of ``--repeats``
unless it says p99; nothing is asserted (the goals are printed beside the figures).
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_ms  # noqa: E402

import edge_sdk  # noqa: E402
from edge_sdk.bundle import check_slice, read_manifest  # noqa: E402
from edge_sdk.store.sources import read_store, representatives  # noqa: E402
from edge_sdk.store import materialize  # noqa: E402

PLENTY_MB = 1e9


def _recipe_rows(m):
    """(config, file index, recipe) of the widest width's point, sample 0 and largest head,
    and of the narrowest width's point and sample 0."""
    keys = sorted(m.graphs, key=float)
    rows = []
    for wk in (keys[-1], keys[0]) if len(keys) > 1 else (keys[0],):
        seen = set()
        for c in m.configurations:
            for i, r in enumerate(c.materialize):
                kind = "head" if r.heads else ("point" if r.sample is None else "sample")
                if r.width != wk or (kind, r.sample if kind == "sample" else 0) in seen:
                    continue
                if kind == "sample" and r.sample != 0:
                    continue
                if kind == "head" and r.heads != max(x.heads for cc in m.configurations
                                                     for x in cc.materialize
                                                     if x.width == wk):
                    continue
                seen.add((kind, 0))
                rows.append((c, i, r, kind))
    return rows


def bench_bundle(path: str, repeats: int) -> None:
    m = read_manifest(path, verify=False)
    if not m.is_store:
        print(f"{path}: layout {m.layout!r}, not a store bundle; skipped")
        return
    src = m.source or {}
    print(f"\n== {path}: {src.get('architecture', '?')} ({src.get('posterior', '?')}), "
          f"input {list(m.input.shape)}, store {m.store.bytes / 1024:.0f} KiB, "
          f"{len(m.configurations)} configurations, {len(m.file_entries())} distinct files, "
          f"widths {', '.join(sorted(m.graphs, key=float))}")
    t_store = median_ms(lambda: read_store(path, m), max(3, repeats // 3))
    store = read_store(path, m)
    print(f"store.bin read + sha256 + decode: {t_store:.2f} ms (held in memory: "
          f"{store.nbytes / 1024:.0f} KiB inflated)")
    print(f"{'slice':<26}{'kind':>7}{'KiB':>8}{'materialise ms':>16}{'sha256 ms':>11}"
          f"{'check ms':>10}{'same bytes':>12}")
    for c, i, r, kind in _recipe_rows(m):
        entry = c.files[i]
        graph = m.graphs[r.width]

        def make():
            return materialize(store, graph, r.width, sample=r.sample, heads=r.heads)

        data = make()
        t_make = median_ms(make, repeats, warmup=1)
        t_sha = median_ms(lambda: hashlib.sha256(data).hexdigest(), repeats)
        t_chk = median_ms(lambda: check_slice(data, entry.name, c, m.input, m.batch_dim),
                          repeats)
        same = hashlib.sha256(data).hexdigest() == entry.sha256
        goal = "  (goal <= 100 ms)" if kind == "sample" and r.width == max(m.graphs, key=float) \
            else ""
        print(f"{entry.name:<26}{kind:>7}{len(data) / 1024:>8.0f}{t_make:>16.2f}{t_sha:>11.2f}"
              f"{t_chk:>10.3f}{str(same):>12}{goal}")

    reps = set(representatives(m).values())
    loads = []
    for _ in range(max(3, repeats // 5)):
        t0 = time.perf_counter()
        model = edge_sdk.load(path, profile=None, threads=1, memory_reader=lambda: PLENTY_MB)
        loads.append((time.perf_counter() - t0) * 1e3)
    made = sum(model._slices.materialize_ms[n] for n in reps)
    print(f"load(): {statistics.median(loads):.0f} ms, of which {made:.0f} ms materialising + "
          f"verifying the {len(reps)} representative slices the backend parses "
          f"({len(m.file_entries())} files in all: every one would be "
          f"~{made / len(reps) * len(m.file_entries()):.0f} ms)")

    # first use of a non-resident slice: a fresh model, each configuration once, in order of
    # the widths; the representatives are resident bytes already (materialised at load)
    model = edge_sdk.load(path, profile=None, threads=1, memory_reader=lambda: PLENTY_MB)
    spec = model.input_spec
    lo, hi = spec.value_range
    x = np.random.default_rng(0).uniform(lo, hi, spec.shape[1:]).astype(spec.dtype)
    print(f"{'first use':<16}{'files':>6}{'materialised':>13}{'materialise ms':>16}"
          f"{'first use ms':>14}{'next call ms':>14}")
    for c in m.configurations:
        if c.scope == "all" and c.samples not in (1, max(cc.samples for cc in m.configurations
                                                         if cc.scope == "all")):
            continue
        if c.scope == "head" and c.samples != max(cc.samples for cc in m.configurations
                                                  if cc.scope == "head"):
            continue
        before = dict(model._slices.materialize_ms)
        made_before = model._slices.materialized
        model.predict(x, config_id=c.id)
        fresh = {n: v for n, v in model._slices.materialize_ms.items()
                 if before.get(n) != v}
        p = model.predict(x, config_id=c.id)
        print(f"{c.id:<16}{len(c.files):>6}{model._slices.materialized - made_before:>13}"
              f"{sum(fresh.values()):>16.1f}{model.first_use_ms.get(c.id, 0.0):>14.1f}"
              f"{p.latency_ms:>14.3f}")

    # width switch between resident slices: SDK time (latency - invoke) per call alternating
    points = sorted((c for c in m.configurations if c.scope == "point"), key=lambda c: c.width)
    a, b = points[0], points[-1]
    for c in (a, b):
        model.warm_up(config_ids=[c.id])
    sdk, wall = [], []
    for k in range(max(200, repeats * 20)):
        t0 = time.perf_counter()
        p = model.predict(x, config_id=(a if k % 2 else b).id)
        wall.append((time.perf_counter() - t0) * 1e3)
        sdk.append(p.latency_ms - p.invoke_ms)
    print(f"width switch {a.id} <-> {b.id} (resident): SDK time median "
          f"{statistics.median(sdk) * 1e3:.1f} us, p99 {np.percentile(sdk, 99) * 1e3:.1f} us "
          f"(goal p99 <= 500 us); whole call median {statistics.median(wall):.3f} ms")

    # the same switch decided by the policy over every candidate: a budget only the narrow
    # point slice meets, then one the wide point slice meets (everything resident: warmed)
    fast = model.policy.predicted_latency_ms(a)
    wide = model.policy.predicted_latency_ms(b)
    tight, roomy = edge_sdk.Budget(latency_ms=fast * 1.05), edge_sdk.Budget(latency_ms=wide * 1.5)
    for budget in (tight, roomy):
        model.warm_up(budget)
    sdk, chosen = [], set()
    for k in range(max(200, repeats * 20)):
        p = model.predict(x, tight if k % 2 else roomy)
        sdk.append(p.latency_ms - p.invoke_ms)
        chosen.add(p.config_id)
    plan = []
    nothing = edge_sdk.Budget(latency_ms=1e-6)  # nothing fits: every candidate is looked at
    for _ in range(2000):
        t0 = time.perf_counter()
        model.policy.preview(nothing)
        plan.append((time.perf_counter() - t0) * 1e6)
    print(f"the policy's decision over all {len(m.configurations)} candidates when none fits "
          f"(its worst case): median {statistics.median(plan):.1f} us, p99 "
          f"{np.percentile(plan, 99):.1f} us")
    print(f"policy switch over {len(m.configurations)} candidates (budgets {fast * 1.05:.2f} / "
          f"{wide * 1.5:.2f} ms, chose {', '.join(sorted(chosen))}): SDK time median "
          f"{statistics.median(sdk) * 1e3:.1f} us, p99 {np.percentile(sdk, 99) * 1e3:.1f} us")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", action="append", required=True, help="a store bundle (repeat)")
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    print(f"numpy {np.__version__}; backend {edge_sdk.load(args.bundle[0], profile=None).backend}"
          f"; 1 interpreter thread")
    for path in args.bundle:
        bench_bundle(path, args.repeats)


if __name__ == "__main__":
    main()
