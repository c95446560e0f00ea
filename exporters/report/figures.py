"""The report's figures (matplotlib, Agg, no pyplot state), each written atomically as PNG:

- ``reliability.png``: a reliability diagram per configuration (rows: scopes, columns: widths),
  after temperature scaling: accuracy per equal-width confidence bin against the diagonal, bins
  with few samples drawn pale;
- ``width.png``: test accuracy and ECE against width, one line per scope (ECE at T = 1 dashed),
  coinciding lines kept visible (each later scope thinner, on top);
- ``risk_coverage.png``: accuracy of the accepted predictions against coverage (the fraction
  accepted) when abstaining below a confidence, one panel per scope, one line per width, with
  the manifest's exported threshold for each target accuracy marked on its curve;
- ``trace.png`` (:func:`plot_trace`): latency per call against the latency budget or the device
  rule's target, the chosen width and samples, the memory the chosen configuration uses against
  the memory budget, the confidence per call and the device rules engaged (the state that drove
  each call; simulated readings hatched), with the trace's phases shaded and labelled.
"""
from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edge_sdk.answers import metrics as M
from edge_sdk.bundle import SCOPES, Manifest
from edge_sdk.answers.metrics import risk_coverage, selective_accuracy
from exporters.report.data import ConfigResult
from exporters.report.files import atomic_write
from exporters.report.trace import phases, validate_trace

__all__ = ["DPI", "FEW_BIN_SAMPLES", "plot_reliability", "plot_risk_coverage", "plot_trace",
           "plot_width"]

DPI = 110
_MARKERS = ("o", "s", "^", "D", "v", "P")
FEW_BIN_SAMPLES = 20  # reliability bins with fewer samples are drawn pale
# width plot, per scope in drawing order: each later line thinner with a smaller marker on top
_SCOPE_STYLE = ({"lw": 4.0, "marker": "o", "ms": 10, "mfc": "none", "mew": 2.0},
                {"lw": 2.0, "marker": "s", "ms": 6},
                {"lw": 1.0, "marker": "^", "ms": 4})


def _figure(**kwargs):
    """A matplotlib Figure with an Agg canvas (no pyplot: no global state, no display)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("edge-sdk report needs matplotlib: pip install matplotlib") \
            from exc
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    atomic_write(path, buf.getvalue())
    return path


def _shade_phases(axes, records, steps) -> None:
    import textwrap

    for k, (phase, i, j) in enumerate(phases(records)):
        lo, hi = steps[i] - 0.5, steps[j] + 0.5
        for ax in axes:
            ax.axvspan(lo, hi, color="0.5" if k % 2 else "0.85", alpha=0.12, lw=0)
        # short phases side by side: wrapped, and every other one a row higher
        axes[0].text((lo + hi) / 2, 1.02 + 0.14 * (k % 2), textwrap.fill(phase, 13),
                     transform=axes[0].get_xaxis_transform(), ha="center", va="bottom",
                     fontsize=7)


def _rules_panel(ax, records, steps) -> None:
    """One row per device rule: a bar over the calls it was engaged on (what drove the
    configuration), hatched where its reading was simulated."""
    names = list(dict.fromkeys(n for r in records for n in r.get("rules") or {}))
    colors = ("tab:orange", "tab:red", "tab:brown", "tab:purple", "tab:olive")
    for row, name in enumerate(names):
        runs: list[list[float]] = []
        for r, x in zip(records, steps):
            text = (r.get("rules") or {}).get(name)
            if text is None:
                continue
            sim = "(simulated)" in text
            if runs and runs[-1][1] == x - 1 and runs[-1][2] == sim:
                runs[-1][1] = x
            else:
                runs.append([x, x, sim])
        for sim in (False, True):
            spans = [(a - 0.5, b - a + 1) for a, b, s in runs if s == sim]
            if spans:
                ax.broken_barh(spans, (row - 0.35, 0.7), color=colors[row % len(colors)],
                               alpha=0.6 if sim else 0.9, hatch="///" if sim else None,
                               lw=0)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(-0.6, max(len(names), 1) - 0.4)
    ax.set_ylabel("rule engaged")
    if not names:
        ax.text(0.5, 0.5, "no device rule engaged", transform=ax.transAxes, ha="center",
                va="center", color="0.4")
    else:
        ax.text(0.01, 0.95, "hatched: on simulated readings", transform=ax.transAxes,
                ha="left", va="top", color="0.3", fontsize=7)


def plot_trace(records: Sequence[Mapping[str, Any]], path: str | os.PathLike,
               memory_mb: Mapping[str, float] | None = None) -> Path:
    """The budget-trace figure, written to ``path`` (PNG); returns the path.

    Panels against the call step: latency per call (budget misses marked) with the latency
    budget, or the device rule's target (``target_ms``), as a step line; the chosen width (and
    posterior samples, right axis); the memory the chosen configuration uses (``memory_mb``:
    MB per configuration id, e.g. the manifest's) beside the memory budget; the confidence per
    call (correct / wrong / unlabelled); the device rules engaged per call (``rules``: the
    state that drove it, hatched where simulated). Phases are shaded and labelled along the
    top.
    """
    return _save(_trace_figure(records, memory_mb), Path(path))


def _trace_figure(records: Sequence[Mapping[str, Any]],
                  memory_mb: Mapping[str, float] | None = None):
    records = validate_trace(list(records))
    steps = np.array([r["step"] for r in records], dtype=float)

    def column(key: str) -> np.ndarray:
        return np.array([np.nan if r[key] is None else r[key] for r in records], dtype=float)

    fig = _figure(figsize=(11, 11), layout="constrained")
    axes = fig.subplots(5, 1, sharex=True, height_ratios=[3, 2, 1.5, 2, 1.3])
    lat, wid, mem, conf, state = axes
    latency = column("latency_ms")
    budgets = column("budget_latency_ms")
    targets = column("target_ms")
    over = np.isfinite(targets) & (latency > np.nan_to_num(targets, nan=np.inf))
    met = np.array([r["budget_met"] for r in records]) & ~over
    what = "budget" if not np.isfinite(targets).any() else "budget or target"
    lat.plot(steps, latency, color="tab:blue", lw=0.6, alpha=0.5)
    lat.scatter(steps[met], latency[met], s=8, color="tab:blue", label=f"latency ({what} met)")
    if (~met).any():
        lat.scatter(steps[~met], latency[~met], s=18, marker="x", color="tab:red",
                    label=f"latency ({what} missed)")
    if np.isfinite(budgets).any() or not np.isfinite(targets).any():
        lat.step(steps, budgets, where="mid", color="black", lw=1.5, label="latency budget")
    if np.isfinite(targets).any():
        lat.step(steps, targets, where="mid", color="black", lw=1.5, ls="--",
                 label="latency target (device rule)")
    values = np.concatenate([latency, budgets[np.isfinite(budgets)],
                             targets[np.isfinite(targets)]])
    if values.min() > 0 and values.max() / values.min() > 20:  # first-call spikes vs tiny budgets
        lat.set_yscale("log")
        lat.set_ylabel("latency per call (ms, log)")
    else:
        lat.set_ylim(bottom=0)
        lat.set_ylabel("latency per call (ms)")
    lat.legend(loc="upper right", fontsize=8)

    wid.step(steps, column("width"), where="mid", color="tab:green", lw=1.5, label="width")
    wid.set_ylabel("chosen width")
    wid.set_ylim(0, 1.05)
    twin = wid.twinx()
    twin.step(steps, column("samples"), where="mid", color="tab:purple", lw=1, ls=":",
              label="posterior samples")
    twin.set_ylabel("samples", color="tab:purple")
    twin.set_ylim(0, max(r["samples"] for r in records) + 1)
    handles = wid.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    wid.legend(handles=handles, loc="best", fontsize=8)

    memory = column("budget_memory_mb")
    used = np.array([np.nan if memory_mb is None or memory_mb.get(r["config_id"]) is None
                     else float(memory_mb[r["config_id"]]) for r in records])
    if np.isfinite(used).any():
        mem.step(steps, used, where="mid", color="tab:brown", lw=1.5,
                 label="memory used (chosen configuration)")
    if np.isfinite(memory).any():
        mem.step(steps, memory, where="mid", color="tab:orange", lw=1.5, ls="--",
                 label="memory budget")
    elif np.isfinite(used).any():
        mem.text(0.01, 0.95, "no memory budget set", transform=mem.transAxes, ha="left",
                 va="top", color="0.4", fontsize=8)
    if np.isfinite(memory).any() or np.isfinite(used).any():
        mem.set_ylim(bottom=0, top=1.15 * np.nanmax(np.concatenate([memory, used])))
        mem.legend(loc="best", fontsize=8)
    else:
        mem.text(0.5, 0.5, "no memory budget set", transform=mem.transAxes, ha="center",
                 va="center", color="0.4")
        mem.set_yticks([])
    mem.set_ylabel("memory (MB)")

    confidence = column("confidence")
    correct = [r["correct"] for r in records]
    for value, color, label in ((True, "tab:green", "correct"), (False, "tab:red", "wrong"),
                                (None, "0.5", "no label")):
        pick = np.array([c is value for c in correct])
        if pick.any():
            conf.scatter(steps[pick], confidence[pick], s=8, color=color, label=label)
    conf.set_ylim(0, 1.05)
    conf.set_ylabel("confidence")
    conf.legend(loc="lower right", fontsize=8)

    _rules_panel(state, records, steps)
    state.set_xlabel("call (step)")
    _shade_phases(axes, records, steps)
    fig.suptitle("Replay trace: the configuration chosen per call as the budget or the device "
                 "changes")
    return fig


def _grid(manifest: Manifest) -> tuple[list[str], list[float]]:
    scopes = [s for s in SCOPES if any(c.scope == s for c in manifest.configurations)]
    widths = sorted({c.width for c in manifest.configurations})
    return scopes, widths


def _reliability_cell(ax, bins: M.ReliabilityBins) -> None:
    """One reliability diagram: accuracy per confidence bin against the diagonal, the gap to
    the bin's mean confidence in red, the samples per bin as numbers. A bin with fewer than
    :data:`FEW_BIN_SAMPLES` samples is drawn pale and hatched: its accuracy is noise (standard
    error above ~0.1)."""
    filled = np.nonzero(bins.counts)[0]
    for k in filled:
        few = bins.counts[k] < FEW_BIN_SAMPLES
        left, width = bins.edges[k], bins.edges[k + 1] - bins.edges[k]
        acc, conf = bins.accuracy[k], bins.confidence[k]
        ax.bar(left, acc, width=width, align="edge", color="C0", alpha=0.25 if few else 1.0,
               edgecolor="0.5" if few else "black", hatch="///" if few else None,
               label=f"accuracy (< {FEW_BIN_SAMPLES} samples: pale)" if few else "accuracy")
        ax.bar(left, conf - acc, bottom=acc, width=width, align="edge", color="red",
               alpha=0.08 if few else 0.3, edgecolor="red", label="gap to confidence")
        ax.text(left + width / 2, 0.02, str(bins.counts[k]), ha="center", va="bottom",
                fontsize=6, rotation=90, color="0.45" if few else "black")
    ax.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="gray", label="perfect calibration")
    ax.set(xlim=(0.0, 1.0), ylim=(0.0, 1.0), xlabel="confidence", ylabel="accuracy")


def plot_reliability(manifest: Manifest, results: Mapping[str, ConfigResult], labels: np.ndarray,
                     path: Path) -> Path:
    """Reliability diagrams (15 bins, after temperature scaling): rows scopes, columns widths."""
    scopes, widths = _grid(manifest)
    fig = _figure(figsize=(2.8 * len(widths) + 0.5, 2.9 * len(scopes) + 0.4), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(scopes), len(widths), squeeze=False))
    by_cell = {(c.scope, c.width): c for c in manifest.configurations}
    handles: dict[str, Any] = {}
    for i, scope in enumerate(scopes):
        for j, width in enumerate(widths):
            ax = axes[i, j]
            config = by_cell.get((scope, width))
            if config is None:
                ax.axis("off")
                continue
            bins = M.reliability_bins(results[config.id].probs, labels)
            _reliability_cell(ax, bins)
            ax.set_title(f"{config.id}  ECE {bins.ece:.3f}", fontsize=9)
            for h, name in zip(*ax.get_legend_handles_labels()):  # one entry per kind
                handles.setdefault(name, h)
            if j:
                ax.set_ylabel("")
            if i < len(scopes) - 1:
                ax.set_xlabel("")
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncols=min(len(handles), max(2, len(widths))), fontsize=8)
    fig.suptitle("Reliability after temperature scaling\n(accuracy per confidence bin; numbers: "
                 f"samples in the bin; pale: fewer than {FEW_BIN_SAMPLES})", fontsize=10)
    return _save(fig, path)


def plot_width(manifest: Manifest, results: Mapping[str, ConfigResult], path: Path) -> Path:
    """Accuracy and ECE against width, one line per scope (ECE at temperature 1 dashed)."""
    return _save(_width_figure(manifest, results), path)


def _width_figure(manifest: Manifest, results: Mapping[str, ConfigResult]):
    """Scopes often score alike (the point and head slices share every layer but the last), so
    their lines coincide: each scope drawn later is thinner, with a smaller marker, on top of
    the earlier ones, which stay visible around it (the point line as a wide band with hollow
    markers)."""
    scopes, _ = _grid(manifest)
    fig = _figure(figsize=(10, 4), layout="constrained")
    acc_ax, ece_ax = fig.subplots(1, 2)
    for k, scope in enumerate(scopes):
        cs = sorted((c for c in manifest.configurations if c.scope == scope),
                    key=lambda c: c.width)
        w = [c.width for c in cs]
        style = {"color": f"C{k}", "zorder": 2 + k, **_SCOPE_STYLE[k % len(_SCOPE_STYLE)]}
        name = scope if scope == "point" else f"{scope} (S={cs[0].samples})"
        acc_ax.plot(w, [results[c.id].metrics["accuracy"] for c in cs], label=name, **style)
        ece_ax.plot(w, [results[c.id].metrics["ece"] for c in cs],
                    label=f"{name}, calibrated", **style)
        ece_ax.plot(w, [results[c.id].raw_metrics["ece"] for c in cs], ls="--", alpha=0.6,
                    label=f"{name}, T = 1", **style)
    acc_ax.set(xlabel="width", ylabel="test accuracy", title="Accuracy against width")
    ece_ax.set(xlabel="width", ylabel="ECE (15 bins)", title="ECE against width")
    ece_ax.set_ylim(bottom=0)
    acc_ax.legend(fontsize=8)
    ece_ax.legend(fontsize=7)
    for ax in (acc_ax, ece_ax):
        ax.grid(alpha=0.3)
    return fig


def plot_risk_coverage(manifest: Manifest, results: Mapping[str, ConfigResult],
                       labels: np.ndarray, path: Path) -> Path:
    """Accuracy of accepted predictions against coverage, one panel per scope, one line per
    width; each exported threshold (fitted on validation for a target accuracy) is marked
    where it lands on the evaluation data, the target as a dotted line."""
    scopes, widths = _grid(manifest)
    fig = _figure(figsize=(4.6 * len(scopes), 4.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(scopes), squeeze=False)[0])
    colors = {w: _colormap()(0.1 + 0.8 * i / max(len(widths) - 1, 1))
              for i, w in enumerate(widths)}
    targets = sorted({t for c in manifest.configurations for t in c.thresholds},
                     key=float)
    markers = {t: _MARKERS[i % len(_MARKERS)] for i, t in enumerate(targets)}
    sizes = {t: 11 - 7 * i / max(len(targets) - 1, 1) for i, t in enumerate(targets)}
    lowest = min([1.0] + [float(t) for t in targets])
    left = 1.0  # the x axis starts a little before the first curve drops below accuracy 1
    for ax, scope in zip(axes, scopes):
        for c in sorted((c for c in manifest.configurations if c.scope == scope),
                        key=lambda c: c.width):
            res = results[c.id]
            conf, ok = res.confidence, res.correct(labels)
            rc = risk_coverage(conf, ok)
            ax.plot(rc.coverage, rc.accuracy, color=colors[c.width], lw=1.5,
                    label=f"width {c.width:g}")
            lowest = min(lowest, float(rc.accuracy[-1]))
            below = np.nonzero(rc.accuracy < 1)[0]
            left = min(left, float(rc.coverage[below[0] - 1]) if len(below) and below[0] else 0.0)
            for target in targets:  # largest marker first: equal thresholds stay visible
                thr = c.thresholds.get(target)
                if thr is None:
                    continue
                cov, acc = selective_accuracy(conf, ok, thr)
                if cov > 0:
                    ax.plot([cov], [acc], marker=markers[target], color=colors[c.width],
                            mec="black", ms=sizes[target], ls="none")
        for target in targets:
            ax.axhline(float(target), color="0.4", ls=":", lw=0.8)
            ax.text(0.01, float(target), f"target {target}", fontsize=7, color="0.3",
                    va="bottom", transform=ax.get_yaxis_transform())
        ax.set(xlabel="coverage (fraction of predictions accepted)", title=f"scope {scope}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy of accepted predictions")
    left = max(0.0, math.floor((left - 0.02) * 20) / 20)
    for ax in axes:
        ax.set_ylim(max(0.0, lowest - 0.02), 1.005)
        ax.set_xlim(left, 1.005)
    handles, names = axes[0].get_legend_handles_labels()
    from matplotlib.lines import Line2D

    handles += [Line2D([], [], marker=markers[t], color="0.5", mec="black", ls="none",
                       ms=sizes[t]) for t in targets]
    names += [f"exported threshold, target {t}" for t in targets]
    fig.legend(handles, names, fontsize=8, loc="outside lower center", ncols=4)
    fig.suptitle("Risk–coverage: abstaining below a confidence threshold"
                 + (f" (coverage from {left:g})" if left > 0 else ""))
    return _save(fig, path)


def _colormap():
    from matplotlib import colormaps

    return colormaps["viridis"]
