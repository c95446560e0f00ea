"""What a replay's records say (split out of digits_budget.py, which runs the demo): per phase
what drove it (the device state and the rule it engaged, simulated readings marked), who
answered, the work (MACs) and latency per call and the quality (:func:`phase_stats`), as the
console table (:func:`phase_table`) and as ``summary.md``, the README's demo section, generated
from ``trace.json`` alone (:func:`summary_markdown`; ``edge-sdk demo --summary-of TRACE`` prints
it again). The README's block between :data:`SUMMARY_BEGIN` and :data:`SUMMARY_END` is this text
(tests/docs/test_demo_block.py). A trace written before the device rules (budget phases, no
``phases`` list) still reads: its budgets stand in for the target and what drove each phase.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

CONTROL = "(control)"  # a phase so labelled need not move the configuration (recovered)


def _target(r: dict) -> float | None:
    return r["target_ms"] if "target_ms" in r else r["budget_latency_ms"]


def phase_stats(records: list[dict], phases: list[dict] | None = None) -> list[dict]:
    """Per phase, in order: what drove it (``phases``: the demo's summary per phase, else the
    budgets), which configurations answered (the two most frequent, with their share of
    calls), the widest share of one width, mean MACs per call, mean end-to-end latency, mean
    invoke time and the SDK's own time per call (median of end-to-end minus invoke; None for
    traces without invoke times), accuracy, confidence, the target and the share of calls
    within it, abstained, and the rules engaged (share of calls, first call)."""
    meta = {p["phase"]: p for p in phases or []}
    out = []
    for name in dict.fromkeys(r["phase"] for r in records):
        rs = [r for r in records if r["phase"] == name]
        top = Counter(r["config_id"] for r in rs).most_common(2)
        timed = [r for r in rs if r.get("invoke_ms") is not None]
        target = _target(rs[0])
        engaged: dict[str, list[int]] = {}
        simulated: set[str] = set()  # the rules engaged on a simulated reading
        for i, r in enumerate(rs):
            for rule, reading in (r.get("rules") or {}).items():
                engaged.setdefault(rule, []).append(i)
                if "(simulated)" in reading:
                    simulated.add(rule)
        width, n_width = Counter(r["width"] for r in rs).most_common(1)[0]
        out.append({
            "invoke_ms": float(np.mean([r["invoke_ms"] for r in timed])) if timed else None,
            "sdk_ms": float(np.median([r["latency_ms"] - r["invoke_ms"] for r in timed]))
            if timed else None,
            "phase": name, "calls": len(rs), "budget_latency_ms": rs[0]["budget_latency_ms"],
            "budget_memory_mb": rs[0]["budget_memory_mb"], "target_ms": target,
            "answered_by": [(c, n / len(rs)) for c, n in top], "width": width,
            "width_share": n_width / len(rs),
            "macs": float(np.mean([r["macs"] for r in rs])) if all("macs" in r for r in rs)
            else None,
            "mean_ms": float(np.mean([r["latency_ms"] for r in rs])),
            "accuracy": float(np.mean([r["correct"] for r in rs])),
            "confidence": float(np.mean([r["confidence"] for r in rs])),
            "budget_met": float(np.mean([r["budget_met"] for r in rs])),
            "within": None if target is None else
            float(np.mean([r["latency_ms"] <= target for r in rs])),
            "abstained": float(np.mean([r["abstain"] for r in rs])),
            "simulated": float(np.mean([bool(r.get("simulated")) for r in rs])),
            "engaged": {k: (len(v) / len(rs), v[0], k in simulated)
                        for k, v in engaged.items()},
            "meta": meta.get(name), "widths": Counter(r["width"] for r in rs)})
    for a, b in zip([None] + out, out):
        b["moved"] = None if a is None else moved(a["widths"], b["widths"])
    return out


def moved(before: Counter, after: Counter) -> float:
    """The share of calls answered at another width than before (the total variation distance
    of the two phases' width mixes): 0 the same mix, 1 no width in common."""
    nb, na = sum(before.values()), sum(after.values())
    return 0.5 * sum(abs(before[w] / nb - after[w] / na) for w in set(before) | set(after))


def _who(answered_by: list) -> str:
    return ", ".join(f"{c} {share:.0%}" for c, share in answered_by)


def driven_by(p: dict) -> str:
    """What drove a phase: the demo's description, then the rules engaged (the phase's own
    first, with the call it engaged from; simulated readings marked)."""
    meta = p["meta"] or {}
    parts = [meta["drive"]] if meta.get("drive") else []
    if not meta:  # a budget trace
        if p["budget_latency_ms"] is not None:
            parts.append(f"latency budget {p['budget_latency_ms']:.3g} ms")
        if p["budget_memory_mb"] is not None:
            parts.append(f"memory budget {p['budget_memory_mb']:.3g} MB")
    own = meta.get("rule")
    rules = sorted(p["engaged"].items(), key=lambda kv: (kv[0] != own, kv[1][1]))
    for rule, (share, first, simulated) in rules:
        parts.append(f"{rule} engaged from call {first + 1} of {p['calls']} ({share:.0%} of "
                     f"calls{', on simulated readings' if simulated else ''})")
    if own is not None and own not in p["engaged"]:
        parts.append(f"{own} never engaged")
    elif meta.get("effect"):
        parts.append(f"its last decision: {meta['effect']}")
    if meta and not p["engaged"]:
        parts.append("no rule engaged")
    return "; ".join(parts) or "–"


MOVED = 0.5  # a phase moved when at least half its calls changed width (moved())


def moves(stats: list[dict]) -> str:
    """Whether each phase moved the configuration: at least :data:`MOVED` of its calls answered
    at another width than in the phase before (a phase labelled ``(control)`` need not)."""
    still = [f"*{b['phase']}* ({b['moved']:.0%} vs *{a['phase']}*)"
             for a, b in zip(stats, stats[1:]) if b["moved"] < MOVED
             and CONTROL not in b["phase"]]
    if len(stats) < 2:
        return ""
    return (f"Every phase moved at least {MOVED:.0%} of its calls to another width than the "
            f"phase before it, except the control." if not still else
            f"Not every phase moved {MOVED:.0%} of its calls to another width than the phase "
            f"before it: " + "; ".join(still) + ".")


def below_sdk(p: dict) -> bool:
    """Whether the phase's latency target (or budget) is below the SDK's own time per call: no
    configuration can meet it, however small."""
    return p["target_ms"] is not None and p["sdk_ms"] is not None \
        and p["target_ms"] < p["sdk_ms"]


def phase_table(records: list[dict], phases: list[dict] | None = None) -> str:
    fmt = lambda v, u: "-" if v is None else f"{v:.3g} {u}"  # noqa: E731
    stats = phase_stats(records, phases)
    lines = [f"{'phase':<22}{'calls':>6}  {'answered by':<40}{'MACs':>10}{'mean ms':>8}"
             f"{'invoke':>8}{'SDK':>8}{'acc':>7}{'conf':>7}{'target':>11}{'within':>8}"
             f"{'abstain':>8}{'moved':>7}"]
    for p in stats:
        lines.append(
            f"{p['phase']:<22}{p['calls']:>6}  {_who(p['answered_by']):<40}"
            f"{_num(p['macs'], ',.0f'):>10}{p['mean_ms']:>8.4f}{_num(p['invoke_ms'], '.4f'):>8}"
            f"{_num(p['sdk_ms'], '.4f'):>8}{p['accuracy']:>7.3f}{p['confidence']:>7.3f}"
            f"{fmt(p['target_ms'], 'ms'):>11}{_num(p['within'], '.1%'):>8}"
            f"{p['abstained']:>8.1%}{_num(p['moved'], '.0%'):>7}"
            + ("  (target below the SDK's own time)"
                                         if below_sdk(p) else ""))
    lines += [f"  {p['phase']}: {driven_by(p)}" for p in stats]
    lines.append("mean ms: the whole predict() call (what the app waits); invoke: the "
                 "interpreter's part; SDK: median of the difference; MACs: per call")
    lines.append(moves(stats))
    return "\n".join(lines)


# --------------------------------------------------------------------------- summary.md
SUMMARY_BEGIN = "<!-- begin: written by `edge-sdk demo` (summary.md, from trace.json) -->"
SUMMARY_END = "<!-- end: written by `edge-sdk demo` -->"
STAGES = ("train", "quantize", "export", "replay", "report")
CONFIG_HEADER = ("| configuration | acc | acc T | ece | ece T | T | MACs | KiB | ms | MB |\n"
                 "|---|---|---|---|---|---|---|---|---|---|")
PHASE_HEADER = ("| phase | driven by | answered by | moved | MACs / call | mean ms | invoke ms "
                "| SDK ms | accuracy | confidence | target | within target | abstained |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _num(v, spec: str, unit: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{unit}"


def _replay_sentence(trace: dict, stats: list[dict]) -> str:
    """Stage 4's sentence: the rules and targets of the run (a budget trace: its budgets)."""
    run, s = trace["run"], trace.get("setup") or {}
    shared = [p for p in stats if (p["meta"] or {}).get("rule") == "UnderContention"]
    missed = "" if not shared or shared[0]["within"] is None else \
        f" ({1 - shared[0]['within']:.1%} of that phase's calls missed the target)"
    where = f"`{run['trace']}`, figure `{run['figure']}`"
    if not s:
        return (f"Stage 4/5 replays the budget ({run['calls']} calls per phase; each latency "
                f"budget the tightest that the configuration the policy picks under it met on "
                f">= 99 % of its end-to-end warm-up calls; {where}).")
    return (
        f"Stage 4/5 replays a changing device ({run['calls']} calls per phase, the contention "
        f"phase {s.get('contention_x', 10)} x; {where}). One model carries the rules that read "
        f"the device: `OnBattery(below_percent=30, within_pt={s['battery_pt']:g})`, "
        f"`WhenHot(above_c=80, clock_below=0.8, within_pt={s['heat_pt']:g})` (the narrowest "
        f"width's accuracy gap, rounded up: a hot device accepts the slice a draining battery "
        f"does not) and `UnderMemoryPressure(below_mb=512, keep_free_mb="
        f"{s['keep_free_mb']:g})`; their battery, temperature, clock and memory readings are "
        f"injected (simulated: the one place outside the unit tests, marked so). The CPU "
        f"contention is real, a busy process pinned to the model's core, and runs on a second "
        f"model with `UnderContention(latency_ms={s['target_ms']:.3g}, quantile="
        f"{s['quantile']:g}, slower_than={s['slower_than']:g})` "
        f"({s['target_ms'] / s['p95_ms']:.3g} x {s['full']}'s "
        f"warm-up p95 of {s['p95_ms']:.3g} ms; loaded with the others, this runtime's re-judging "
        f"after every suspected stall disturbed every phase). A shared core time-slices in ~4 "
        f"ms slices: a call stalls with probability ~ its latency / 4 ms, ~0.5 % of these "
        f"calls{missed}, so no configuration keeps p{s['quantile'] * 100:g} and the rule "
        f"answers with the fastest; at p95 or p99 it rightly would not move.")


def summary_markdown(trace: dict) -> str:
    """The README's demo section for one run, from its ``trace.json`` contents alone: the
    command, host and wall times, the bundle's configurations (stage 3's table) and the
    replay per phase (stage 4's table)."""
    run, records = trace["run"], trace["records"]
    host, stages = run["host"], run["stages"]
    load = "" if host.get("load_average") is None else \
        f", load average {host['load_average']:g} when it started"
    label = {"train": "train", "quantize": f"quantize ({run['method']})",
             "export": f"export of {len(run['configurations'])} configurations",
             "replay": "device replay" if trace.get("setup") else "budget replay",
             "report": "report"}
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
    stats = phase_stats(records, trace.get("phases"))
    lines += [
        "",
        _replay_sentence(trace, stats) + " *driven by*: the device state, the rules it "
        "engaged (from which call) and the phase's rule's last decision; *moved*: the share "
        "of calls answered at another width than in the phase before (the total variation of "
        "the two width mixes); *MACs / call*: the work of the slices that ran; *mean ms* the whole "
        "`predict()` call, what the app waits; *invoke ms* its interpreter part; *SDK ms* the "
        "median of the difference; *within target*: the share of calls within the phase's "
        "latency target (in italics when below the SDK's own time, which no configuration "
        "can meet):",
        "",
        PHASE_HEADER,
    ]
    for p in stats:
        target = _num(p["target_ms"], ".3g", " ms")
        lines.append(
            f"| {p['phase']} | {driven_by(p)} | {_who(p['answered_by'])} | "
            f"{_num(p['moved'], '.0%')} | {_num(p['macs'], ',.0f')} | {p['mean_ms']:.3g} | "
            f"{_num(p['invoke_ms'], '.3g')} | "
            f"{_num(p['sdk_ms'], '.3g')} | {p['accuracy']:.3f} | {p['confidence']:.3f} | "
            f"{f'*{target}*' if below_sdk(p) else target} | {_num(p['within'], '.1%')} | "
            f"{p['abstained']:.1%} |")
    said = moves(stats)
    if said:
        lines += ["", said]
    for s in trace.get("skipped", []):
        lines += ["", skipped_line(s)]
    for r in trace.get("refusals", []):
        lines += ["", refusal_line(r)]
    lines.append(SUMMARY_END)
    return "\n".join(lines) + "\n"


def skipped_line(s: dict) -> str:
    """A phase the platform cannot run, in one line (summary.md and the console)."""
    return f"Phase *{s['phase']}* skipped: {s['why']}."


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
