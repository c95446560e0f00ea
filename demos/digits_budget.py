"""The whole product on scikit-learn's digits, offline, on the CPU: train, quantize, export, replay.

    edge-sdk demo [--method pwfn|sqs|none] [--out runs/demo] [--quick]

1. train the nested Bayesian network (BN³: Downhill ordering, Bayesian nested layers);
2. quantize it (PWFN by default, or SQS) so every width shares one small codebook;
3. export widths 0.25 ... 1.0 as TFLite point slices + manifest (the sampled scopes, ``head``
   and ``all``, add nothing measurable on this recipe: ``edge-sdk export --scope`` still makes
   them for an app that wants them);
4. load the bundle with the torch-free runtime and replay a changing budget: the latency budget
   drops (battery saver), drops further (a second model shares the CPU), recovers, then memory
   is squeezed (``Budget(memory_mb=...)``), and finally the confidence cascade runs;
5. print what was chosen per phase and write ``trace.json``, a Markdown report and its figures;
   then ``summary.md``: the README's demo section, generated from ``trace.json`` alone
   (:func:`summary_markdown`; ``--summary-of TRACE`` prints it again for an existing trace).

Budgets are set from the latencies this process measures for each configuration in a short
warm-up, so every phase means the same thing on a fast laptop and a slow CI runner: each
latency budget is one the configuration the policy picks under it met on >= 99 % of its
warm-up calls (at 98 % the tightest phase met its budget on 94.3-95.7 % of replayed
calls in three runs on this host, whose speed drifts between the warm-up and the replay); a
budget no configuration can meet is its own phase, on a ``strict=True`` model that refuses
every call with ``BudgetNotMetError``.
Wall time on this 2-core machine, installed: 38-48 s for ``make demo`` (five runs
in one session), 24 s with ``--quick``; each run's ``summary.md`` states its own and the load.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from demos.summary import phase_table, refusal_line, summary_markdown, write_summary

QUICK = {  # CI: the same pipeline with every stage cut to seconds
    "train": ["train.epochs=3", "train.eval_every=100", "data.calib_samples=128"],
    "pwfn": ["quantize.pwfn.epochs_per_round=0"],
    "sqs": ["quantize.sqs.epochs=1"],
}


def _stage(title: str) -> float:
    print(f"\n== {title}", flush=True)
    return time.perf_counter()


def _done(t0: float) -> float:
    seconds = time.perf_counter() - t0
    print(f"   ({seconds:.1f} s)", flush=True)
    return round(seconds, 1)


def _quantile(v: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(v), q))


def latency_budgets(model, samples: dict[str, list[float]], met: float = 0.99
                    ) -> tuple[float | None, float | None, float]:
    """(battery saver, CPU shared, below every configuration) latency budgets in ms, chosen
    from the end-to-end latencies ``samples`` this process measured per configuration in the
    warm-up, so each phase's budget is one the policy can meet.

    A budget ``B`` is *met-able* when the configuration the policy would pick under it (the
    best-ranked whose predicted latency fits) ran within ``B`` on at least ``met`` of its
    warm-up calls. Candidates are each configuration's 90th, 97th and 99th percentiles times
    1, 1.1, 1.25 and 1.5; "CPU
    shared" is the tightest met-able one, "battery saver" the tightest met-able one whose pick
    is wider than CPU shared's and narrower than the unconstrained choice (None when there is
    no such budget: then it gets CPU shared's). The third figure is half the
    fastest configuration's median: no configuration can meet it, the strict-mode phase."""
    import edge_sdk

    pol = model.policy
    order = pol.candidates  # what may answer, each network once (its fastest precision)
    pred = {c.id: pol.predicted_latency_ms(c) for c in order}

    def pick(b: float):
        return next((c for c in order if pred[c.id] <= b), None)

    cands = sorted({f * _quantile(v, q) for v in samples.values() for q in (0.9, 0.97, 0.99)
                    for f in (1.0, 1.1, 1.25, 1.5)})
    ok = []
    for b in cands:
        c = pick(b)
        if c is not None and np.mean(np.asarray(samples[c.id]) <= b) >= met:
            ok.append((b, c))
    best, _ = pol.choose(edge_sdk.Budget())
    rank = {c.id: i for i, c in enumerate(order)}
    shared = ok[0] if ok else None
    saver = next((b for b, c in ok if shared is not None and rank[c.id] < rank[shared[1].id]
                  and rank[c.id] > rank[best.id]), None)
    floor = 0.5 * min(_quantile(v, 0.5) for v in samples.values())
    return saver, None if shared is None else shared[0], floor


def phases(model, samples: dict[str, list[float]] | None = None
           ) -> list[tuple[str, object, str]]:
    """(name, Budget, policy) per phase. Latency budgets come from what this process measured
    per configuration in the warm-up (``samples``: end-to-end ms per configuration id;
    :func:`latency_budgets`); the memory squeeze from the manifest's memory figures."""
    import edge_sdk

    pol = model.policy
    configs = model.manifest.configurations
    if samples is None:  # one prediction per configuration: what the policy believes now
        samples = {c.id: [pol.predicted_latency_ms(c)] for c in configs}
    need = {c.id: pol.memory_need_mb(c) for c in configs}
    # a point network's need: its most demanding precision variant's (whichever of them the
    # policy answers with when the squeeze runs fits the squeeze)
    net: dict = {}
    for c in configs:
        if c.scope == "point":
            net[c.variant_of] = max(net.get(c.variant_of, 0.0), need[c.id])
    points = sorted(net.values())
    saver, shared, _ = latency_budgets(model, samples)
    if shared is None:  # nothing met-able (never seen): the slowest configuration's p99
        shared = max(_quantile(v, 0.99) for v in samples.values())
    saver = shared if saver is None else saver
    return [
        ("unconstrained", edge_sdk.Budget(), "best"),
        ("battery saver", edge_sdk.Budget(latency_ms=saver), "best"),
        ("CPU shared", edge_sdk.Budget(latency_ms=shared), "best"),
        ("recovered", edge_sdk.Budget(), "best"),
        ("memory squeeze", edge_sdk.Budget(memory_mb=points[len(points) // 2]), "best"),
        ("cascade", edge_sdk.Budget(), "cascade"),
    ]


STRICT_PHASE = "below every configuration (strict)"


def replay(bundle: Path, xs: np.ndarray, ys: np.ndarray, calls: int, threads: int = 1,
           refusals: list | None = None) -> list[dict]:
    """Every phase answers ``calls`` test samples; one record per call (the report's format).
    Then the strict-mode phase: a budget no configuration can meet, on a ``strict=True`` model,
    whose every call is refused with :class:`BudgetNotMetError`; its summary is appended to
    ``refusals`` (when given), never to the records (nothing was answered)."""
    import edge_sdk
    from edge_sdk.errors import BudgetNotMetError

    models = {p: edge_sdk.load(bundle, threads=threads, policy=p) for p in ("best", "cascade")}
    samples: dict[str, list[float]] = {}
    for m in models.values():  # warm-up: every configuration measured in this process
        for c in m.manifest.configurations:
            for k in range(200):
                pr = m.predict(xs[k % len(xs)], config_id=c.id)
                if m is models["best"] and k >= 20:
                    samples.setdefault(c.id, []).append(pr.latency_ms)
    records, step = [], 0
    for name, budget, policy in phases(models["best"], samples):
        for i in range(calls):
            j = (step + i) % len(xs)
            pr = models[policy].predict(xs[j], budget)
            records.append({
                "step": step + i, "phase": name, "budget_latency_ms": budget.latency_ms,
                "budget_memory_mb": budget.memory_mb, "config_id": pr.config_id,
                "width": pr.width, "samples": pr.samples, "latency_ms": pr.latency_ms,
                "invoke_ms": pr.invoke_ms, "budget_met": pr.budget_met,
                "correct": bool(pr.label == ys[j]),
                "confidence": pr.confidence, "abstain": pr.abstain})
        step += calls
    floor = latency_budgets(models["best"], samples)[2]
    strict = edge_sdk.load(bundle, threads=threads, strict=True)
    for c in strict.manifest.configurations:
        strict.warm_up(config_ids=[c.id])
        for k in range(20):
            strict.predict(xs[k % len(xs)], config_id=c.id)
    refused, message, answered = 0, None, 0
    for i in range(calls):
        try:
            strict.predict(xs[i % len(xs)], edge_sdk.Budget(latency_ms=floor))
            answered += 1
        except BudgetNotMetError as e:
            refused += 1
            message = message or str(e)
    if refusals is not None:
        refusals.append({"phase": STRICT_PHASE, "budget_latency_ms": floor, "calls": calls,
                         "refused": refused, "answered": answered, "message": message})
    return records


def command_line(out: Path, method: str, quick: bool, epochs: int | None, samples: int,
                 calls: int) -> str:
    """The ``edge-sdk demo`` command that runs ``run()`` with these arguments."""
    parts = ["edge-sdk demo"]
    if method != "pwfn":
        parts.append(f"--method {method}")
    if Path(out) != Path("runs/demo"):
        parts.append(f"--out {out}")
    if quick:
        parts.append("--quick")
    if epochs is not None:
        parts.append(f"--epochs {epochs}")
    if samples != 8:
        parts.append(f"--samples {samples}")
    if calls != 300:
        parts.append(f"--calls {calls}")
    return " ".join(parts)


def _host() -> dict:
    try:
        load = round(os.getloadavg()[0], 1)
    except (AttributeError, OSError):  # not on every platform
        load = None
    return {"cpus": os.cpu_count(), "system": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(), "load_average": load}


def _configurations(manifest) -> list[dict]:
    """What stage 3 prints per configuration (exporters.export.summary), from the manifest."""
    out = []
    for c in manifest.configurations:
        raw, cal = c.test["raw"], c.test["calibrated"]
        out.append({"id": c.id, "acc": raw["accuracy"], "acc_T": cal["accuracy"],
                    "ece": raw["ece"], "ece_T": cal["ece"], "T": c.temperature, "macs": c.macs,
                    "kib": sum(f.bytes for f in c.files) / 1024, "latency_ms": c.latency_ms,
                    "memory_mb": c.memory_mb})
    return out


def _shown(path) -> str:
    """``path`` relative to the working directory when it lies below it (as the README shows)."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def run(out: Path, method: str = "pwfn", quick: bool = False, epochs: int | None = None,
        samples: int = 8, calls: int = 300, progress: bool = True) -> dict[str, Path]:
    from ai_edge_litert.interpreter import Interpreter

    from edge_sdk.backends import interpreter_class, quiet_delegate_banner
    from edge_sdk.bundle import read_manifest
    from exporters.export import ExportOptions, export_bundle
    from exporters.report import write_report
    from trainer.config import load_config
    from trainer.data import load_data
    from trainer.quantize.run import quantize_checkpoint
    from trainer.train import train

    # the exporters run LiteRT directly (exporters.measure): spend its once-per-process XNNPACK
    # INFO line out of sight now, as the CLI commands do
    quiet_delegate_banner(Interpreter)
    start, host = time.perf_counter(), _host()
    quiet = {"progress": progress}
    overrides = list(QUICK["train"]) if quick else []
    if epochs is not None:
        overrides.append(f"train.epochs={epochs}")
    cfg = load_config("digits", overrides)
    for sub in ("train", method, "bundle", "report"):  # the demo owns these; rerun = fresh
        shutil.rmtree(out / sub, ignore_errors=True)
    stages: dict[str, float] = {}

    t0 = _stage(f"1/5 train {cfg.model.name} on digits ({cfg.train.epochs} epochs)")
    ckpt = train(cfg, out / "train", **quiet).checkpoint
    stages["train"] = _done(t0)
    if method != "none":
        t0 = _stage(f"2/5 quantize ({method})")
        qcfg = load_config("digits", overrides + [f"quantize.method={method}"]
                           + (QUICK[method] if quick else []))
        ckpt = quantize_checkpoint(ckpt, qcfg, out / method, **quiet)
        stages["quantize"] = _done(t0)
    t0 = _stage("3/5 export widths 0.25 ... 1.0 (point slices)")
    max_eval = 200 if quick else None
    bundle = export_bundle(ckpt, out / "bundle", ExportOptions(
        samples=samples, scopes=("point",), force=True, max_eval=max_eval), **quiet)
    stages["export"] = _done(t0)

    t0 = _stage("4/5 replay a changing budget with the torch-free runtime")
    data = load_data(cfg.data)
    test = data.test
    xs, ys = test.raw, test.y.numpy()  # raw: NHWC numpy, what an app would pass
    refusals: list[dict] = []
    records = replay(bundle, xs, ys, calls, refusals=refusals)
    trace = out / "trace.json"
    trace.write_text(json.dumps({"records": records, "refusals": refusals}))
    print(phase_table(records))
    for r in refusals:
        print(refusal_line(r))
    stages["replay"] = _done(t0)

    t0 = _stage("5/5 report and figures")
    report = write_report(bundle, out / "report", trace=trace, max_eval=max_eval)
    stages["report"] = _done(t0)

    # the run itself goes into the trace too, so summary.md is generated from trace.json alone
    manifest = read_manifest(bundle)
    n_test = len(test.y)
    run_info = {
        "command": command_line(out, method, quick, epochs, samples, calls),
        "method": method, "quick": quick, "epochs": cfg.train.epochs, "samples": samples,
        "calls": calls, "host": host, "backend": interpreter_class()[1],  # as load() picks
        "stages": stages, "total_s": round(time.perf_counter() - start, 1),
        "data": {"train": len(data.train.y), "val": len(data.val.y), "test": n_test},
        "evaluated": n_test if max_eval is None else min(n_test, max_eval),
        "bundle": _shown(bundle), "trace": _shown(trace),
        "figure": _shown(report.parent / "trace.png"),
        "configurations": _configurations(manifest)}
    trace.write_text(json.dumps({"records": records, "refusals": refusals, "run": run_info}))
    summary = write_summary(trace)
    paths = {"checkpoint": Path(ckpt), "bundle": Path(bundle), "trace": trace, "report": report,
             "summary": summary}
    print("\n" + "\n".join(f"{k:<11}{v}" for k, v in paths.items()))
    print("figures    " + "\n           ".join(str(p) for p in sorted(report.parent.glob("*.png"))))
    print(f"{run_info['total_s']:.1f} s in all")
    return paths


def demo_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="edge-sdk demo", description=__doc__.splitlines()[0],
        epilog="Writes <out>/{train,pwfn,bundle,report}/, trace.json and summary.md (the "
               "README's demo section, generated from trace.json). Wall time, measured on a "
               "2-core machine busy with other jobs (load average 3.4-5): the full run 7 min "
               "8 s to 12 min 43 s, --quick 1 min 23 s to 2 min 26 s; an idle machine is "
               "faster (README, Quick start).")
    p.add_argument("--method", choices=["pwfn", "sqs", "none"], default="pwfn",
                   help="quantizer between training and export (default pwfn)")
    p.add_argument("--out", default="runs/demo", help="run directory (its stages are replaced)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (config: 30)")
    p.add_argument("--samples", type=int, default=8, help="posterior samples per width")
    p.add_argument("--calls", type=int, default=300, help="predictions per budget phase")
    p.add_argument("--quick", action="store_true",
                   help="the same pipeline with every stage cut short (3 training epochs, no "
                        "retraining between PWFN rounds or 1 SQS epoch, 200 evaluation "
                        "samples): what CI runs")
    p.add_argument("--summary-of", metavar="TRACE", default=None,
                   help="print the summary.md of an existing trace.json and exit (runs nothing)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.summary_of is not None:
        from edge_sdk.errors import InputError

        path = Path(args.summary_of)
        try:
            trace = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"--summary-of {path}: cannot read a JSON trace ({e})") from e
        if not isinstance(trace, dict) or "run" not in trace or "records" not in trace:
            raise InputError(f"--summary-of {path}: not a trace written by this demo (expected "
                             "the keys 'records' and 'run')")
        print(summary_markdown(trace), end="")
        return 0
    run(Path(args.out), args.method, args.quick, args.epochs, args.samples, args.calls,
        progress=not args.no_progress)
    return 0


if __name__ == "__main__":
    sys.exit(demo_main(sys.argv[1:]))
