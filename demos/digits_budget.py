"""The whole product on scikit-learn's digits, offline, on the CPU: train, quantize, export, replay.

    edge-sdk demo [--method pwfn|sqs|none] [--out runs/demo] [--quick]

1. train the nested Bayesian network (BN³: Downhill ordering, Bayesian nested layers);
2. quantize it (PWFN by default, or SQS) so every width shares one small codebook;
3. export widths 0.25 ... 1.0 as TFLite point slices + manifest (the sampled scopes, ``head``
   and ``all``, add nothing measurable on this recipe: ``edge-sdk export --scope`` still makes
   them for an app that wants them);
4. load the bundle with the torch-free runtime and its device rules and replay a changing
   device (:func:`device_phases`): a battery drain and a thermal throttle (injected readings:
   the one place outside the unit tests where readings are simulated, and every table says
   so), real CPU contention (a busy process pinned to the model's core), memory pressure
   (injected), the device recovered (the control), the confidence cascade; then a latency
   budget no configuration can meet, on a ``strict=True`` model that refuses every call;
5. print what answered per phase and what drove it, and write ``trace.json``, a Markdown
   report and its figures; then ``summary.md``: the README's demo section, generated from
   ``trace.json`` alone (:func:`summary_markdown`; ``--summary-of TRACE`` prints it again).

The contention target is set from the latencies this process measures in a warm-up, so the
phase means the same on a fast laptop and a slow CI runner. A phase the platform cannot run (no
``os.sched_setaffinity``: no pinned contention) is skipped with one line saying why.
Wall time on this 2-core machine, installed: 38-48 s for ``make demo`` (five runs
in one session), 24 s with ``--quick``; each run's ``summary.md`` states its own and the load.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from demos.device_phases import (BATTERY_PT, CONTENTION_X, KEEP_FREE_MB, QUANTILE,
                                 TARGET_X_P95, SimulatedDevice, Unsupported, device_phases,
                                 heat_within_pt, shared_core)
from demos.summary import phase_table, refusal_line, skipped_line, summary_markdown, write_summary

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


# --------------------------------------------------------------------------- the replay
STRICT_PHASE = "below every configuration (strict)"
WARM_CALLS = 200  # per configuration; the first 20 of each are not measured


def _warm(model, xs: np.ndarray, samples: dict | None = None) -> None:
    for c in model.manifest.configurations:
        for k in range(WARM_CALLS):
            pr = model.predict(xs[k % len(xs)], config_id=c.id)
            if samples is not None and k >= 20:
                samples.setdefault(c.id, []).append(pr.latency_ms)


def _macs(c, stages=None) -> int:
    """The MACs of a call answered by ``c``: its own; in a cascade (``stages``), every stage's
    up to the one that answered."""
    if stages is None:
        return int(c.macs) * int(c.invokes)
    ids = [s.config.id for s in stages]
    ran = stages[:ids.index(c.id) + 1] if c.id in ids else stages
    return sum(int(s.config.macs) * int(s.config.invokes) for s in ran)


# after the contention phase, calls until its rule lets go (a quiet core is told from a contended
# one only by going ~10 of the other task's slices without a stall: ~1-3 k digits calls)
ENDING_MAX_CALLS = 50_000


def _models(bundle: Path, xs: np.ndarray, threads: int, device: SimulatedDevice,
            heat_pt: float) -> tuple[dict, dict]:
    """The replay's models, warmed up: ``device`` with every rule (the simulated device's
    readings, and UnderContention with its target set from a warm-up of every configuration in
    this process: ``TARGET_X_P95`` x the full width's p95), ``cascade``; and the settings."""
    import edge_sdk

    probe = edge_sdk.load(bundle, threads=threads)
    samples: dict[str, list[float]] = {}
    _warm(probe, xs, samples)  # every configuration measured in this process
    full = probe.policy.candidates[0]  # what answers unconstrained: the full width
    p95 = _quantile(samples[full.id], 0.95)
    target = TARGET_X_P95 * p95
    models = {"cascade": edge_sdk.load(bundle, threads=threads, policy="cascade"),
              "device": edge_sdk.load(bundle, threads=threads, readers=device.readers(), rules=[
                  edge_sdk.OnBattery(below_percent=30, within_pt=BATTERY_PT),
                  edge_sdk.WhenHot(above_c=80, clock_below=0.8, within_pt=heat_pt),
                  edge_sdk.UnderMemoryPressure(below_mb=512, keep_free_mb=KEEP_FREE_MB),
                  edge_sdk.UnderContention(latency_ms=target, quantile=QUANTILE)])}
    _warm(models["device"], xs)
    _warm(models["cascade"], xs)
    models["contention"] = models["device"]  # one model: every rule stated once
    floor = 0.5 * min(_quantile(v, 0.5) for v in samples.values())
    return models, {"full": full.id, "p95_ms": p95, "target_ms": target, "quantile": QUANTILE,
                    "slower_than": 1.5, "heat_pt": heat_pt, "battery_pt": BATTERY_PT,
                    "keep_free_mb": KEEP_FREE_MB, "floor_ms": floor,
                    "contention_x": CONTENTION_X}


def replay(bundle: Path, xs: np.ndarray, ys: np.ndarray, calls: int, threads: int = 1,
           refusals: list | None = None, skipped: list | None = None,
           phases: list | None = None, setup: dict | None = None) -> list[dict]:
    """Every phase of :func:`device_phases` answers ``calls`` test samples (the contention
    phase ``CONTENTION_X`` times as many); one record per call (the report's format, plus the
    target, the engaged rules with their readings, whether those were simulated, the MACs
    run). When given, ``phases`` gets per phase what drove it, from which call its rule engaged
    and what it decided; ``skipped`` the phases the platform cannot run (one line each, also
    printed); ``setup`` the rules' settings; ``refusals`` the strict-mode phase (a budget no
    configuration can meet, every call refused with :class:`BudgetNotMetError`: never a
    record, nothing was answered)."""
    import edge_sdk
    from edge_sdk.bundle import read_manifest

    device, configs = SimulatedDevice(), read_manifest(bundle).configurations
    models, settings = _models(bundle, xs, threads, device, heat_within_pt(configs))
    if setup is not None:
        setup.update(settings)
    by_id = {c.id: c for c in configs}
    monitor = models["device"]._monitor  # poll(): a new reading is seen by the next call
    records: list[dict] = []
    for ph in device_phases(settings["heat_pt"], settings["target_ms"]):
        m, n, engaged_at, effect = models[ph.model], calls * ph.calls_x, None, None
        try:
            with shared_core() if ph.contention else contextlib.nullcontext() as core:
                drive = (ph.start(device, models["device"]) if ph.start else "") or ph.drive
                if core is not None:
                    drive = drive.replace("model's core", f"model's core (CPU {core})")
                monitor.poll()  # the phase's first readings, seen by its first call
                stages = m.policy.preview(edge_sdk.Budget()).stages \
                    if ph.model == "cascade" else None
                for i in range(n):
                    if ph.step is not None and ph.step(device, i / max(n - 1, 1)):
                        monitor.poll()
                    j = (len(records) + i) % len(xs)
                    pr = m.predict(xs[j])
                    rules = m.engaged_rules
                    if ph.rule in rules:
                        engaged_at = i if engaged_at is None else engaged_at
                        effect = m.policy.rules.effects.get(ph.rule, effect)
                    records.append({
                        "step": len(records), "phase": ph.name, "budget_latency_ms": None,
                        "budget_memory_mb": None, "target_ms":
                            settings["target_ms"] if ph.model == "contention" else None,
                        "config_id": pr.config_id, "width": pr.width, "samples": pr.samples,
                        "macs": _macs(by_id[pr.config_id], stages),
                        "latency_ms": pr.latency_ms, "invoke_ms": pr.invoke_ms,
                        "budget_met": pr.budget_met, "correct": bool(pr.label == ys[j]),
                        "confidence": pr.confidence, "abstain": pr.abstain, "rules": rules,
                        "simulated": any("(simulated)" in v for v in rules.values())})
            if ph.contention:  # the busy process has ended: how long until the rule lets go
                after = 0
                while ph.rule in m.engaged_rules and after < ENDING_MAX_CALLS:
                    m.predict(xs[after % len(xs)])
                    after += 1
                drive += (f"; after the busy process ended, the rule let go within {after} "
                          f"calls (not in the table)" if ph.rule not in m.engaged_rules else
                          f"; still engaged {after} calls after the busy process ended")
        except Unsupported as e:
            print(skipped_line({"phase": ph.name, "why": str(e)}))
            if skipped is not None:
                skipped.append({"phase": ph.name, "why": str(e)})
            continue
        if phases is not None:
            phases.append({"phase": ph.name, "drive": drive, "rule": ph.rule,
                           "simulated": ph.simulated, "calls": n, "engaged_at": engaged_at,
                           "effect": effect})
    models["device"].close()
    refused = _strict(bundle, xs, threads, calls, settings["floor_ms"])
    if refusals is not None:
        refusals.append(refused)
    return records


def _strict(bundle: Path, xs: np.ndarray, threads: int, calls: int, floor: float) -> dict:
    """The strict-mode phase: half the fastest configuration's median as the latency budget,
    which no configuration can meet, on a ``strict=True`` model."""
    import edge_sdk
    from edge_sdk.errors import BudgetNotMetError

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
    return {"phase": STRICT_PHASE, "budget_latency_ms": floor, "calls": calls,
            "refused": refused, "answered": answered, "message": message}


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

    t0 = _stage("4/5 replay a changing device with the torch-free runtime and its device rules")
    data = load_data(cfg.data)
    test = data.test
    xs, ys = test.raw, test.y.numpy()  # raw: NHWC numpy, what an app would pass
    refusals: list[dict] = []
    replayed = {"phases": [], "skipped": [], "setup": {}}
    records = replay(bundle, xs, ys, calls, refusals=refusals, **replayed)
    trace = out / "trace.json"
    trace.write_text(json.dumps({"records": records, "refusals": refusals, **replayed}))
    print(phase_table(records, replayed["phases"]))
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
    trace.write_text(json.dumps({"records": records, "refusals": refusals, **replayed,
                                 "run": run_info}))
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
    p.add_argument("--calls", type=int, default=300,
                   help=f"predictions per phase (the CPU contention phase: {CONTENTION_X} x)")
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
