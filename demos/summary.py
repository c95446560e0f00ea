"""What a budget replay's records say (split out of digits_budget.py, which runs the demo):
per phase its budgets, who answered, the latencies and the quality (:func:`phase_stats`), as
the console table (:func:`phase_table`) and as ``summary.md``, the README's demo section,
generated from ``trace.json`` alone (:func:`summary_markdown`; ``edge-sdk demo --summary-of
TRACE`` prints it again). The README's block between :data:`SUMMARY_BEGIN` and
:data:`SUMMARY_END` is this text (tests/docs/test_demo_block.py).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

def phase_stats(records: list[dict]) -> list[dict]:
    """Per phase, in order: its budgets, which configurations answered (the two most frequent,
    with their share of calls), mean end-to-end latency, mean invoke time and the SDK's own
    time per call (median of end-to-end minus invoke; None for traces without invoke times),
    accuracy, confidence, budget met and abstained."""
    out = []
    for name in dict.fromkeys(r["phase"] for r in records):
        rs = [r for r in records if r["phase"] == name]
        top = Counter(r["config_id"] for r in rs).most_common(2)
        timed = [r for r in rs if r.get("invoke_ms") is not None]
        out.append({
            "invoke_ms": float(np.mean([r["invoke_ms"] for r in timed])) if timed else None,
            "sdk_ms": float(np.median([r["latency_ms"] - r["invoke_ms"] for r in timed]))
            if timed else None,
            "phase": name, "calls": len(rs), "budget_latency_ms": rs[0]["budget_latency_ms"],
            "budget_memory_mb": rs[0]["budget_memory_mb"],
            "answered_by": [(c, n / len(rs)) for c, n in top],
            "mean_ms": float(np.mean([r["latency_ms"] for r in rs])),
            "accuracy": float(np.mean([r["correct"] for r in rs])),
            "confidence": float(np.mean([r["confidence"] for r in rs])),
            "budget_met": float(np.mean([r["budget_met"] for r in rs])),
            "abstained": float(np.mean([r["abstain"] for r in rs]))})
    return out


def _who(answered_by: list) -> str:
    return ", ".join(f"{c} {share:.0%}" for c, share in answered_by)


def below_sdk(p: dict) -> bool:
    """Whether the phase's latency budget is below the SDK's own time per call: no
    configuration can meet it, however small."""
    return p["budget_latency_ms"] is not None and p["sdk_ms"] is not None \
        and p["budget_latency_ms"] < p["sdk_ms"]


def phase_table(records: list[dict]) -> str:
    fmt = lambda v, u: "-" if v is None else f"{v:.3g} {u}"  # noqa: E731
    lines = [f"{'phase':<16}{'latency budget':>15}{'memory budget':>14}  {'answered by':<34}"
             f"{'mean ms':>8}{'invoke':>8}{'SDK':>8}{'acc':>7}{'conf':>7}{'met':>7}"
             f"{'abstain':>8}"]
    for p in phase_stats(records):
        lines.append(
            f"{p['phase']:<16}{fmt(p['budget_latency_ms'], 'ms'):>15}"
            f"{fmt(p['budget_memory_mb'], 'MB'):>14}  {_who(p['answered_by']):<34}"
            f"{p['mean_ms']:>8.4f}{_num(p['invoke_ms'], '.4f'):>8}{_num(p['sdk_ms'], '.4f'):>8}"
            f"{p['accuracy']:>7.3f}{p['confidence']:>7.3f}"
            f"{p['budget_met']:>7.1%}{p['abstained']:>8.1%}"
            + ("  (budget below the SDK's own time)" if below_sdk(p) else ""))
    lines.append("mean ms: the whole predict() call (what the app waits and the budget judges); "
                 "invoke: the interpreter's part; SDK: median of the difference")
    return "\n".join(lines)


# --------------------------------------------------------------------------- summary.md
SUMMARY_BEGIN = "<!-- begin: written by `edge-sdk demo` (summary.md, from trace.json) -->"
SUMMARY_END = "<!-- end: written by `edge-sdk demo` -->"
STAGES = ("train", "quantize", "export", "replay", "report")
CONFIG_HEADER = ("| configuration | acc | acc T | ece | ece T | T | MACs | KiB | ms | MB |\n"
                 "|---|---|---|---|---|---|---|---|---|---|")
PHASE_HEADER = ("| phase | latency budget | memory budget | answered by | mean ms | invoke ms "
                "| SDK ms | accuracy | confidence | budget met | abstained |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|")


def _num(v, spec: str, unit: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{unit}"


def summary_markdown(trace: dict) -> str:
    """The README's demo section for one run, from its ``trace.json`` contents alone: the
    command, host and wall times, the bundle's configurations (stage 3's table) and the
    budget replay per phase (stage 4's table)."""
    run, records = trace["run"], trace["records"]
    host, stages = run["host"], run["stages"]
    load = "" if host.get("load_average") is None else \
        f", load average {host['load_average']:g} when it started"
    label = {"train": "train", "quantize": f"quantize ({run['method']})",
             "export": f"export of {len(run['configurations'])} configurations",
             "replay": "budget replay", "report": "report"}
    times = ", ".join(f"{label[k]} {stages[k]:.1f} s" for k in STAGES if k in stages)
    data = run["data"]
    lines = [
        SUMMARY_BEGIN,
        f"`{run['command']}` on {host['cpus']} CPUs ({host['system']}, Python {host['python']}, "
        f"backend `{run['backend']}`{load}): **{run['total_s']:.1f} s** wall in all — {times}. "
        f"Digits: {data['train']} training, {data['val']} validation, {data['test']} test "
        f"samples; {run['epochs']} epochs, quantizer `{run['method']}`, "
        + (f"{run['samples']} posterior samples per sampled configuration."
           if any(not str(c["id"]).endswith("-point") for c in run["configurations"])
           else "point slices only (sampled scopes add nothing measurable: "
                "docs/uncertainty.md)."),
        "",
        f"Stage 3/5 prints the bundle's configurations (`{run['bundle']}/manifest.yaml`; test "
        f"split, {run['evaluated']} samples; ms and MB measured on this host):",
        "",
        CONFIG_HEADER,
    ]
    for c in run["configurations"]:
        lines.append(
            f"| {c['id']} | {c['acc']:.4f} | {c['acc_T']:.4f} | {c['ece']:.4f} | "
            f"{c['ece_T']:.4f} | {c['T']:.2f} | {c['macs']} | {c['kib']:.1f} | "
            f"{_num(c['latency_ms'], '.3f')} | {_num(c['memory_mb'], '.1f')} |")
    lines += [
        "",
        f"Stage 4/5 replays the budget ({run['calls']} calls per phase; each latency budget "
        f"the tightest that the configuration the policy picks under it met on >= 99 % of its "
        f"end-to-end warm-up calls; `{run['trace']}`, figure "
        f"`{run['figure']}`). *mean ms* is the whole `predict()` call, what the app waits and "
        f"what the budget is judged on; *invoke ms* its interpreter part; *SDK ms* the median "
        f"of the difference (input checks, normalisation, the policy, the answer's maths); a "
        f"latency budget in italics is below the SDK's own time, so no configuration can meet "
        f"it:",
        "",
        PHASE_HEADER,
    ]
    for p in phase_stats(records):
        budget = _num(p['budget_latency_ms'], '.3g', ' ms')
        lines.append(
            f"| {p['phase']} | {f'*{budget}*' if below_sdk(p) else budget} | "
            f"{_num(p['budget_memory_mb'], '.3g', ' MB')} | {_who(p['answered_by'])} | "
            f"{p['mean_ms']:.3g} | {_num(p['invoke_ms'], '.3g')} | {_num(p['sdk_ms'], '.3g')} | "
            f"{p['accuracy']:.3f} | {p['confidence']:.3f} | "
            f"{p['budget_met']:.1%} | {p['abstained']:.1%} |")
    for r in trace.get("refusals", []):
        lines += ["", refusal_line(r)]
    lines.append(SUMMARY_END)
    return "\n".join(lines) + "\n"


def refusal_line(r: dict) -> str:
    """The strict-mode phase in one sentence (summary.md and the console)."""
    return (f"Phase *{r['phase']}*: latency budget {r['budget_latency_ms']:.3g} ms, half the "
            f"fastest configuration's median, which no configuration can meet; a model loaded "
            f"with `strict=True` refused {r['refused']} of {r['calls']} calls with "
            f"`BudgetNotMetError`" + (f" (\"{r['message']}\")" if r.get("message") else "")
            + (f", answered {r['answered']}" if r.get("answered") else "") + ".")


def write_summary(trace_path: Path, out: Path | None = None) -> Path:
    """``summary.md`` next to ``trace_path`` (or at ``out``), generated from the trace file."""
    out = Path(out) if out is not None else Path(trace_path).with_name("summary.md")
    out.write_text(summary_markdown(json.loads(Path(trace_path).read_text())))
    return out
