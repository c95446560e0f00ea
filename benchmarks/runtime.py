"""The on-device runtime on a real bundle: predict() overhead over raw invoke(), width-switch
time, latency vs MACs per width, a budget trace, and cascade vs always-full.

    python benchmarks/runtime.py --bundle /tmp/bundle_fm [--data npz:DIR/fashion_mnist.npz]

Torch-free except for loading the evaluation data when --data is given (trainer.data).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import edge_sdk


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--data", default=None, help="source whose test split drives the trace")
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--samples", type=int, default=1000, help="test samples for trace/cascade")
    args = p.parse_args()
    model = edge_sdk.load(args.bundle, threads=1)
    spec = model.input_spec
    lo, hi = spec.value_range
    x = np.random.default_rng(0).uniform(lo, hi, spec.shape[1:]).astype(np.float32)
    points = [c for c in model.manifest.configurations if c.scope == "point"]

    print(f"backend {model.backend}; 1 thread; batch 1; median of {args.repeats}, the three "
          f"timings interleaved call by call")
    print(f"{'config':<14}{'invoke ms':>10}{'set+inv+get':>12}{'predict ms':>11}"
          f"{'over invoke us':>15}{'over s+i+g us':>14}{'ratio':>7}{'lat/lat(1)':>11}"
          f"{'MACs/MACs(1)':>13}")
    full = max(points, key=lambda c: c.width)
    lat, rows = {}, {}
    for c in points:
        interps = model._interpreters(c)
        xin = model._prepare(x, "x")
        bare, copy, pred = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for it, _, _ in interps:
                it.invoke()
            t1 = time.perf_counter()
            for it, inp, out in interps:  # what any caller of the interpreter must do
                it.set_tensor(inp, xin)
                it.invoke()
                it.get_tensor(out)
            t2 = time.perf_counter()
            model.predict(x, config_id=c.id)
            t3 = time.perf_counter()
            bare.append(t1 - t0)
            copy.append(t2 - t1)
            pred.append(t3 - t2)
        lat[c.id] = statistics.median(bare) * 1e3
        rows[c.id] = (statistics.median(copy) * 1e3, statistics.median(pred) * 1e3)
    for c in points:
        raw, (sig, prd) = lat[c.id], rows[c.id]
        print(f"{c.id:<14}{raw:>10.3f}{sig:>12.3f}{prd:>11.3f}{(prd - raw) * 1e3:>15.1f}"
              f"{(prd - sig) * 1e3:>14.1f}{prd / raw:>7.3f}{raw / lat[full.id]:>11.2f}"
              f"{c.macs / full.macs:>13.2f}")

    # width switch with slices resident: alternate two configurations, time each call
    a, b = points[0], full
    switch = []
    for i in range(args.repeats):
        c = a if i % 2 else b
        t0 = time.perf_counter()
        model.predict(x, config_id=c.id)
        switch.append((time.perf_counter() - t0) * 1e3 - lat[c.id])
    print(f"\nwidth switch overhead (alternating {a.id} / {b.id}): median "
          f"{statistics.median(switch) * 1e3:.1f} us, p99 {np.percentile(switch, 99) * 1e3:.1f} us")

    if args.data is None:
        return
    from trainer.config import DataConfig
    from trainer.data import load_data

    data = load_data(DataConfig(source=args.data))
    xs, ys = data.test.raw[: args.samples], data.test.y[: args.samples].numpy()

    # this process's latency of every configuration as the policy measures it (the invokes'
    # wall time, Prediction.latency_ms), median of pinned predictions
    true_ms = {c.id: statistics.median(model.predict(x, config_id=c.id).latency_ms
                                       for _ in range(max(args.repeats // 3, 20)))
               for c in model.manifest.configurations}

    def ideal(budget):
        """The rule applied with the true latencies: what a perfect predictor would choose."""
        fit = [c for c in model.manifest.configurations
               if (budget.latency_ms is None or true_ms[c.id] <= budget.latency_ms)
               and (budget.memory_mb is None or model.policy.memory_need_mb(c) <= budget.memory_mb)]
        return min(fit, key=model.policy.preference).id if fit else None

    # budget trace: latency budget stepping down and back up, then a memory squeeze
    fast, slow = min(lat.values()), max(lat.values())
    phases = [("roomy", edge_sdk.Budget(latency_ms=slow * 3)),
              ("tight", edge_sdk.Budget(latency_ms=(fast + slow) / 2 + 0.1)),
              ("tightest", edge_sdk.Budget(latency_ms=fast * 1.5 + 0.1)),
              ("recovered", edge_sdk.Budget(latency_ms=slow * 3)),
              ("memory squeeze", edge_sdk.Budget(memory_mb=min(c.memory_mb or 1e9
                                                               for c in points) + 0.01))]
    print(f"\n{'phase':<16}{'budget':>22}{'rule (true latency)':>21}{'chosen':>26}{'acc':>7}"
          f"{'met':>7}{'rule':>7}")
    all_met, all_rule, n = 0, 0, 0
    for name, budget in phases:
        preds = [model.predict(xi, budget) for xi in xs]
        met = np.mean([pr.budget_met for pr in preds])
        want = ideal(budget)
        rule = np.mean([pr.config_id == want for pr in preds])
        all_met, all_rule, n = all_met + met * len(preds), all_rule + rule * len(preds), \
            n + len(preds)
        top = max(set(pr.config_id for pr in preds), key=[pr.config_id for pr in preds].count)
        acc = np.mean([pr.label == y for pr, y in zip(preds, ys)])
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        btxt = f"{fmt(budget.latency_ms)} ms / {fmt(budget.memory_mb)} MB"
        print(f"{name:<16}{btxt:>22}{str(want):>21}{top:>26}{acc:>7.4f}{met:>7.3f}{rule:>7.3f}")
    print(f"{'all phases':<16}{'':>22}{'':>21}{'':>26}{'':>7}{all_met / n:>7.3f}"
          f"{all_rule / n:>7.3f}")

    # cascade vs always-full, point scope. "plan": the two-stage cascade with the plans fitted
    # at export (accuracy loss <= max_loss on validation); "climb T": the width climb on the
    # target-accuracy thresholds, for each exported target T
    full_model = edge_sdk.load(args.bundle, threads=1)
    full_model.policy.configs = points
    t_full, acc_full = [], []
    for xi, y in zip(xs, ys):
        pf = full_model.predict(xi, config_id=full.id)
        t_full.append(pf.latency_ms)
        acc_full.append(pf.label == y)
    print(f"\ncascade vs always {full.id} (mean invoke latency {np.mean(t_full):.4f} ms, "
          f"accuracy {np.mean(acc_full):.4f})")
    print(f"{'cascade':>12}{'mean ms':>9}{'saved':>8}{'accuracy':>10}{'change pt':>10}"
          f"{'answered by':>40}")
    variants = [("plan", 0.95, False)] + [(f"climb {t}", float(t), True)
                                         for t in sorted(full.thresholds, key=float)]
    for label, target, climb in variants:
        casc = edge_sdk.load(args.bundle, threads=1, policy="cascade", target_accuracy=target)
        casc.policy.configs = points  # point scope only
        if climb:
            casc._cascade = casc._climb
        elif not any(full.id in c.cascade for c in points):
            print(f"{label:>12}  (this bundle has no cascade plans: re-export it)")
            continue
        t_c, acc_c, who = [], [], []
        for xi, y in zip(xs, ys):
            pc = casc.predict(xi)
            t_c.append(pc.latency_ms)
            acc_c.append(pc.label == y)
            who.append(pc.width)
        saved = 1 - np.mean(t_c) / np.mean(t_full)
        mix = " ".join(f"{w:g}:{who.count(w) / len(who):.0%}" for w in sorted(set(who)))
        print(f"{label:>12}{np.mean(t_c):>9.4f}{saved:>8.1%}{np.mean(acc_c):>10.4f}"
              f"{100 * (np.mean(acc_c) - np.mean(acc_full)):>+10.2f}{mix:>40}")


if __name__ == "__main__":
    main()
