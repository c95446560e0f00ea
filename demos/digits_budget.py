"""The whole product on scikit-learn's digits, offline, in a few minutes on 2 cores.

    edge-sdk demo [--method pwfn|sqs|none] [--out runs/demo] [--quick]

1. train the nested Bayesian network (BN³: Downhill ordering, Bayesian nested layers);
2. quantize it (PWFN by default, or SQS) so every width shares one small codebook;
3. export widths 0.25 ... 1.0 as TFLite slices (point, sampled head, fully sampled) + manifest;
4. load the bundle with the torch-free runtime and replay a changing budget: the latency budget
   drops (battery saver), drops further (a second model shares the CPU), recovers, then memory
   is squeezed (``Budget(memory_mb=...)``), and finally the confidence cascade runs;
5. print what was chosen per phase and write ``trace.json``, a Markdown report and its figures.

Budgets are set relative to the latencies this process measures for each configuration in a
short warm-up, so every phase means the same thing on a fast laptop and a slow CI runner.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

QUICK = {  # CI: the same pipeline with every stage cut to seconds
    "train": ["train.epochs=3", "train.eval_every=100", "data.calib_samples=128"],
    "pwfn": ["quantize.pwfn.epochs_per_round=0"],
    "sqs": ["quantize.sqs.epochs=1"],
}


def _stage(title: str) -> float:
    print(f"\n== {title}", flush=True)
    return time.perf_counter()


def _done(t0: float) -> None:
    print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)


def phases(model) -> list[tuple[str, object, str]]:
    """(name, Budget, policy) per phase, from the latencies ``model`` has measured (warm-up)
    and the manifest's memory figures."""
    import edge_sdk

    pol = model.policy
    configs = model.manifest.configurations
    lat = {c.id: pol.predicted_latency_ms(c) for c in configs}
    need = {c.id: pol.memory_need_mb(c) for c in configs}
    best, _ = pol.choose(edge_sdk.Budget())
    cheapest = min(lat.values())
    points = sorted(need[c.id] for c in configs if c.scope == "point")
    saver = max(0.5 * lat[best.id], 3 * cheapest)
    return [
        ("unconstrained", edge_sdk.Budget(), "best"),
        ("battery saver", edge_sdk.Budget(latency_ms=saver), "best"),
        ("CPU shared", edge_sdk.Budget(latency_ms=2 * cheapest), "best"),
        ("recovered", edge_sdk.Budget(), "best"),
        ("memory squeeze", edge_sdk.Budget(memory_mb=points[len(points) // 2]), "best"),
        ("cascade", edge_sdk.Budget(), "cascade"),
    ]


def replay(bundle: Path, xs: np.ndarray, ys: np.ndarray, calls: int, threads: int = 1
           ) -> list[dict]:
    """Every phase answers ``calls`` test samples; one record per call (the report's format)."""
    import edge_sdk

    models = {p: edge_sdk.load(bundle, threads=threads, policy=p) for p in ("best", "cascade")}
    for m in models.values():  # warm-up: every configuration measured in this process
        for c in m.manifest.configurations:
            for _ in range(20):
                m.predict(xs[0], config_id=c.id)
    records, step = [], 0
    for name, budget, policy in phases(models["best"]):
        for i in range(calls):
            j = (step + i) % len(xs)
            pr = models[policy].predict(xs[j], budget)
            records.append({
                "step": step + i, "phase": name, "budget_latency_ms": budget.latency_ms,
                "budget_memory_mb": budget.memory_mb, "config_id": pr.config_id,
                "width": pr.width, "samples": pr.samples, "latency_ms": pr.latency_ms,
                "budget_met": pr.budget_met, "correct": bool(pr.label == ys[j]),
                "confidence": pr.confidence, "abstain": pr.abstain})
        step += calls
    return records


def phase_table(records: list[dict]) -> str:
    fmt = lambda v, u: "-" if v is None else f"{v:.3g} {u}"  # noqa: E731
    lines = [f"{'phase':<16}{'latency budget':>15}{'memory budget':>14}  {'answered by':<34}"
             f"{'mean ms':>8}{'acc':>7}{'conf':>7}{'met':>7}{'abstain':>8}"]
    for name in dict.fromkeys(r["phase"] for r in records):
        rs = [r for r in records if r["phase"] == name]
        top = Counter(r["config_id"] for r in rs).most_common(2)
        who = ", ".join(f"{c} {n / len(rs):.0%}" for c, n in top)
        lines.append(
            f"{name:<16}{fmt(rs[0]['budget_latency_ms'], 'ms'):>15}"
            f"{fmt(rs[0]['budget_memory_mb'], 'MB'):>14}  {who:<34}"
            f"{np.mean([r['latency_ms'] for r in rs]):>8.4f}"
            f"{np.mean([r['correct'] for r in rs]):>7.3f}"
            f"{np.mean([r['confidence'] for r in rs]):>7.3f}"
            f"{np.mean([r['budget_met'] for r in rs]):>7.1%}"
            f"{np.mean([r['abstain'] for r in rs]):>8.1%}")
    return "\n".join(lines)


def run(out: Path, method: str = "pwfn", quick: bool = False, epochs: int | None = None,
        samples: int = 8, calls: int = 300, progress: bool = True) -> dict[str, Path]:
    from exporters.export import ExportOptions, export_bundle
    from exporters.report import write_report
    from trainer.config import load_config
    from trainer.data import load_data
    from trainer.quantize.run import quantize_checkpoint
    from trainer.train import train

    quiet = {"progress": progress}
    overrides = list(QUICK["train"]) if quick else []
    if epochs is not None:
        overrides.append(f"train.epochs={epochs}")
    cfg = load_config("digits", overrides)
    for sub in ("train", method, "bundle", "report"):  # the demo owns these; rerun = fresh
        shutil.rmtree(out / sub, ignore_errors=True)

    t0 = _stage(f"1/5 train {cfg.model.name} on digits ({cfg.train.epochs} epochs)")
    ckpt = train(cfg, out / "train", **quiet).checkpoint
    _done(t0)
    if method != "none":
        t0 = _stage(f"2/5 quantize ({method})")
        qcfg = load_config("digits", overrides + [f"quantize.method={method}"]
                           + (QUICK[method] if quick else []))
        ckpt = quantize_checkpoint(ckpt, qcfg, out / method, **quiet)
        _done(t0)
    t0 = _stage("3/5 export widths 0.25 ... 1.0 (point, sampled head, fully sampled)")
    bundle = export_bundle(ckpt, out / "bundle", ExportOptions(
        samples=samples, force=True, max_eval=200 if quick else None), **quiet)
    _done(t0)

    t0 = _stage("4/5 replay a changing budget with the torch-free runtime")
    test = load_data(cfg.data).test
    xs, ys = test.raw, test.y.numpy()  # raw: NHWC numpy, what an app would pass
    records = replay(bundle, xs, ys, calls)
    trace = out / "trace.json"
    trace.write_text(json.dumps({"records": records}))
    print(phase_table(records))
    _done(t0)

    t0 = _stage("5/5 report and figures")
    report = write_report(bundle, out / "report", trace=trace,
                          max_eval=200 if quick else None)
    _done(t0)
    paths = {"checkpoint": Path(ckpt), "bundle": Path(bundle), "trace": trace, "report": report}
    print("\n" + "\n".join(f"{k:<11}{v}" for k, v in paths.items()))
    print("figures    " + "\n           ".join(str(p) for p in sorted(report.parent.glob("*.png"))))
    return paths


def demo_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="edge-sdk demo", description=__doc__.splitlines()[0])
    p.add_argument("--method", choices=["pwfn", "sqs", "none"], default="pwfn",
                   help="quantizer between training and export (default pwfn)")
    p.add_argument("--out", default="runs/demo", help="run directory (its stages are replaced)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (config: 30)")
    p.add_argument("--samples", type=int, default=8, help="posterior samples per width")
    p.add_argument("--calls", type=int, default=300, help="predictions per budget phase")
    p.add_argument("--quick", action="store_true", help="seconds-long smoke run (CI)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    run(Path(args.out), args.method, args.quick, args.epochs, args.samples, args.calls,
        progress=not args.no_progress)
    return 0


if __name__ == "__main__":
    sys.exit(demo_main(sys.argv[1:]))
