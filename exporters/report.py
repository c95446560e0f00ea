"""``edge-sdk report``: a Markdown report with PNG figures for a bundle (workstation side).

``write_report(bundle_dir)`` writes ``report.md`` and these figures (matplotlib, Agg, no pyplot
state) into ``<bundle>/../<bundle name>-report/`` or ``out_dir``:

- ``reliability.png``: a reliability diagram per configuration (rows: scopes, columns: widths),
  after temperature scaling: accuracy per equal-width confidence bin against the diagonal, bins
  with few samples drawn pale;
- ``width.png``: test accuracy and ECE against width, one line per scope (ECE at T = 1 dashed),
  coinciding lines kept visible (each later scope thinner, on top);
- ``risk_coverage.png``: accuracy of the accepted predictions against coverage (the fraction
  accepted) when abstaining below a confidence, one panel per scope, one line per width, with
  the manifest's exported threshold for each target accuracy marked on its curve;
- ``trace.png`` (only with a budget trace from the demo, :func:`plot_trace`): latency per call
  against the latency budget, the chosen width and samples, the memory the chosen
  configuration uses against the memory budget and the confidence per call, with the trace's
  phases shaded and labelled.

The report's tables: every configuration as exported (the manifest's test metrics, MACs,
.tflite bytes, unique weight values, host latency and memory, temperature); the quality
numbers recomputed here (on the manifest's own data only those the first table lacks, with the
largest disagreement stated); what each exported threshold does on the evaluation data; the
trace per phase, budgets to 3 significant digits.

Per-sample numbers come from running each configuration's ``.tflite`` files in the LiteRT
interpreter on the evaluation data, exactly as the exporter measured them: logits / the
configuration's temperature, softmax, averaged over posterior samples. Evaluation data: an
explicit source, else the source the bundle was evaluated on (the checkpoint's test split,
rebuilt from the data config the exporter records in ``source.data``, capped at the recorded
``source.max_eval``); OOD data likewise.
"""
from __future__ import annotations

import io
import json
import math
import numbers
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_sdk import metrics as M
from edge_sdk.bundle import SCOPES, Configuration, Manifest, read_manifest, resolve_file
from edge_sdk.errors import BundleError, ConfigError, DataError, EdgeSdkError, InputError
from edge_sdk.policy import Policy

__all__ = [
    "ConfigResult",
    "EvalData",
    "RiskCoverage",
    "TraceError",
    "evaluate_configuration",
    "load_eval_data",
    "load_trace",
    "plot_trace",
    "risk_coverage",
    "selective_accuracy",
    "trace_summary",
    "validate_trace",
    "write_report",
]

REPORT_NAME = "report.md"
DPI = 110
_MARKERS = ("o", "s", "^", "D", "v", "P")
FEW_BIN_SAMPLES = 20  # reliability bins with fewer samples are drawn pale
# width plot, per scope in drawing order: each later line thinner with a smaller marker on top
_SCOPE_STYLE = ({"lw": 4.0, "marker": "o", "ms": 10, "mfc": "none", "mew": 2.0},
                {"lw": 2.0, "marker": "s", "ms": 6},
                {"lw": 1.0, "marker": "^", "ms": 4})


class TraceError(DataError):
    """A budget-trace file (or its records) is missing, malformed or inconsistent."""


# --------------------------------------------------------------------------- pure computations


@dataclass(frozen=True, eq=False)
class RiskCoverage:
    """Selective prediction when abstaining below a confidence threshold.

    Point ``k`` accepts every sample with confidence >= ``threshold[k]``; cuts fall only between
    distinct confidences (tied samples are all in or all out), so ``coverage`` is strictly
    increasing and ends at 1, where ``accuracy`` is the overall accuracy.
    """

    coverage: np.ndarray  # [K] fraction of samples accepted
    accuracy: np.ndarray  # [K] accuracy of the accepted samples (1 - selective risk)
    threshold: np.ndarray  # [K] the lowest accepted confidence, decreasing


def _selective_inputs(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    conf = np.asarray(confidence, dtype=np.float64)
    ok = np.asarray(correct)
    if conf.ndim != 1 or conf.size == 0:
        raise InputError(f"confidence must be a non-empty 1-D array, got shape {conf.shape}")
    if ok.shape != conf.shape:
        raise InputError(f"correct must have the shape of confidence {conf.shape}, got {ok.shape}")
    if not np.all(np.isfinite(conf)):
        raise InputError("confidence must contain only finite values; found NaN or inf")
    if ok.dtype.kind != "b":
        if ok.dtype.kind not in "iuf" or not np.all((ok == 0) | (ok == 1)):
            raise InputError(f"correct must be booleans (or 0/1), got dtype {ok.dtype}")
        ok = ok.astype(bool)
    return conf, ok


def risk_coverage(confidence: Any, correct: Any) -> RiskCoverage:
    """The risk–coverage curve of per-sample ``confidence`` [N] and ``correct`` [N] (bool)."""
    conf, ok = _selective_inputs(confidence, correct)
    order = np.argsort(-conf, kind="stable")
    conf, ok = conf[order], ok[order]
    accepted = np.arange(1, conf.size + 1)
    cum_acc = np.cumsum(ok) / accepted
    last_of_value = np.r_[conf[1:] != conf[:-1], True]
    return RiskCoverage(coverage=accepted[last_of_value] / conf.size,
                        accuracy=cum_acc[last_of_value], threshold=conf[last_of_value])


def selective_accuracy(confidence: Any, correct: Any, threshold: float) -> tuple[float, float]:
    """(coverage, accuracy of the accepted) when accepting confidence >= ``threshold``;
    accuracy is NaN when nothing is accepted."""
    conf, ok = _selective_inputs(confidence, correct)
    accepted = conf >= threshold
    coverage = float(accepted.mean())
    return coverage, float(ok[accepted].mean()) if accepted.any() else math.nan


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True, eq=False)
class EvalData:
    """NHWC model inputs (already normalised) and labels of the evaluation (and OOD) data."""

    x: np.ndarray  # [N, H, W, C] float32
    y: np.ndarray  # [N] class indices
    description: str
    same_as_manifest: bool  # the data (and cap) the manifest's test metrics were measured on
    ood_x: np.ndarray | None = None
    ood_description: str | None = None


@dataclass(frozen=True, eq=False)
class ConfigResult:
    """One configuration run on :class:`EvalData`."""

    probs: np.ndarray  # [N, C] mean over samples of softmax(logits / temperature)
    metrics: dict[str, float]  # accuracy, nll, brier, ece, mutual_info[, ood_auroc]; calibrated
    raw_metrics: dict[str, float]  # the same at temperature 1

    @property
    def confidence(self) -> np.ndarray:
        return self.probs.max(axis=1)

    def correct(self, labels: np.ndarray) -> np.ndarray:
        return self.probs.argmax(axis=1) == labels


def _nhwc(ds, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    x, y = ds.x, ds.y  # normalised NCHW tensors and labels (trainer.data.ArrayDataset)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    return x.permute(0, 2, 3, 1).contiguous().numpy(), y.numpy()


def _input_spec(manifest: Manifest):
    from trainer.data import InputSpec

    d = manifest.input.to_dict()
    return InputSpec(shape=d["shape"], layout=d["layout"], dtype=d["dtype"],
                     value_range=d["value_range"], mean=d["mean"], std=d["std"],
                     classes=tuple(manifest.labels))


def _close(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(u, v, rel_tol=1e-6, abs_tol=1e-9)
                                    for u, v in zip(a, b))


def load_eval_data(manifest: Manifest, eval_data: str | None = None,
                   ood_data: str | None = None, max_eval: int | None = None,
                   log=print) -> EvalData:
    """The evaluation data for ``manifest``'s bundle.

    ``eval_data`` (a trainer.data source, loaded like ``edge-sdk export --eval-data``) or else
    the data the manifest was measured on: the ``--eval-data`` source recorded in
    ``source.eval_data``, or the checkpoint's test split rebuilt from ``source.data`` with
    ``trainer.data.load_data`` (same source and split seed: the identical samples). Without an
    explicit ``max_eval`` the recorded cap is applied to the recorded data. ``ood_data`` else
    ``source.ood_data`` (skipped with a warning when that recorded source no longer loads).
    """
    from trainer.config import config_from_dict
    from trainer.data import load_data, load_ood

    if max_eval is not None and (isinstance(max_eval, bool) or not isinstance(max_eval, int)
                                 or max_eval < 1):
        raise ConfigError(f"max_eval must be an integer >= 1 (samples per data set), "
                          f"got {max_eval!r}")
    src = manifest.source
    spec = _input_spec(manifest)
    recorded = src.get("eval_data", "test split")
    recorded = recorded if isinstance(recorded, str) and recorded != "test split" else None
    same = eval_data is None or eval_data == recorded
    if same and max_eval is None:
        max_eval = src.get("max_eval") if isinstance(src.get("max_eval"), int) else None
    cap = "" if max_eval is None else f", first {max_eval} samples"
    source = eval_data if eval_data is not None else recorded
    if source is not None:
        ds = load_ood(source, spec, labels=True)  # evaluation needs labels; OOD data does not
        description = f"`{source}`{cap}"
    else:
        data_cfg = src.get("data")
        if not isinstance(data_cfg, Mapping):
            raise BundleError(
                "the manifest does not record the data the bundle was evaluated on (source.data "
                "is missing: a bundle exported before `edge-sdk report` existed); pass the "
                "evaluation data explicitly, e.g. --eval-data digits")
        try:
            cfg = config_from_dict({"data": dict(data_cfg)}).data
        except ConfigError as exc:
            raise BundleError(f"manifest source.data is not a valid data config: {exc}") from None
        splits = load_data(cfg)
        if not (_close(splits.spec.mean, spec.mean) and _close(splits.spec.std, spec.std)):
            log(f"warning: the training split of {cfg.source!r} no longer has the normalisation "
                "statistics the bundle was exported with; the data changed since the export, so "
                "the recomputed numbers are not on the exported test split")
            same = False
        ds = splits.test
        description = f"test split of `{cfg.source}` (split seed {cfg.split_seed}){cap}"
    x, y = _nhwc(ds, max_eval)
    if y.min() < 0 or y.max() >= len(manifest.labels):
        raise DataError(f"evaluation data {description}: labels must be class indices in "
                        f"[0, {len(manifest.labels)}) (the bundle's labels), got values in "
                        f"[{y.min()}, {y.max()}]")
    ood_x = ood_desc = None
    ood_source = ood_data if ood_data is not None else src.get("ood_data")
    if ood_source is not None:
        try:
            ood_x, _ = _nhwc(load_ood(str(ood_source), spec), max_eval)
            ood_desc = f"`{ood_source}`{cap}"
        except (EdgeSdkError, OSError) as exc:
            if ood_data is not None:
                raise
            log(f"warning: skipping the OOD data recorded in the manifest ({ood_source!r}): "
                f"{exc}")
    return EvalData(x=x, y=y, description=description, same_as_manifest=same,
                    ood_x=ood_x, ood_description=ood_desc)


def _config_logits(bundle_dir: Path, config: Configuration, xs: np.ndarray) -> np.ndarray:
    """[S, N, C] logits of ``config`` on NHWC inputs, through the interpreter."""
    from exporters.export import slice_logits

    bufs = [resolve_file(bundle_dir, f.name).read_bytes() for f in config.files]
    return slice_logits(bufs, config.scope, xs)


def evaluate_configuration(bundle_dir: str | os.PathLike, config: Configuration,
                           data: EvalData) -> ConfigResult:
    """Run ``config``'s files on ``data`` (and its OOD inputs in the same interpreter pass)."""
    from exporters.export import quality

    xs = data.x if data.ood_x is None else np.concatenate([data.x, data.ood_x])
    logits = _config_logits(Path(bundle_dir), config, xs)
    n = len(data.x)
    ood = None if data.ood_x is None else logits[:, n:]
    probs, cal = quality(logits[:, :n], data.y, config.temperature, ood)
    _, raw = quality(logits[:, :n], data.y, 1.0, ood)
    return ConfigResult(probs=probs, metrics=cal, raw_metrics=raw)


# --------------------------------------------------------------------------- budget trace

_TRACE_FIELDS = ("step", "phase", "budget_latency_ms", "budget_memory_mb", "config_id", "width",
                 "samples", "latency_ms", "budget_met", "correct", "confidence")


def _trace_fail(path: str, message: str):
    raise TraceError(f"{path}: {message}")


def _trace_number(value: Any, path: str, *, lo: float, hi: float = math.inf,
                  lo_open: bool = False, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(float(value)):
        what = "a finite number or null" if optional else "a finite number"
        _trace_fail(path, f"expected {what}, got {value!r}")
    v = float(value)
    if v < lo or (lo_open and v == lo) or v > hi:
        bound = f"{'>' if lo_open else '>='} {lo:g}" + ("" if hi == math.inf else f" and <= {hi:g}")
        _trace_fail(path, f"expected a number {bound}, got {v!r}")
    return v


def validate_trace(records: Any, where: str = "trace") -> list[dict[str, Any]]:
    """Checked copies of budget-trace ``records`` (the demo's format), sorted by step.

    Each record: ``step`` int, ``phase`` str, ``budget_latency_ms`` / ``budget_memory_mb``
    number > 0 or null, ``config_id`` str, ``width`` in (0, 1], ``samples`` int >= 1,
    ``latency_ms`` >= 0, ``budget_met`` bool, ``correct`` bool or null, ``confidence`` in
    [0, 1]. Extra keys are ignored. Raises :class:`TraceError` naming the first problem.
    """
    if not isinstance(records, (list, tuple)):
        _trace_fail(f"{where}.records", f"expected a list of records, got {type(records).__name__}")
    if not records:
        _trace_fail(f"{where}.records", "expected at least one record, got an empty list")
    out = []
    for i, rec in enumerate(records):
        p = f"{where}.records[{i}]"
        if not isinstance(rec, Mapping):
            _trace_fail(p, f"expected a mapping, got {type(rec).__name__}")
        missing = [k for k in _TRACE_FIELDS if k not in rec]
        if missing:
            _trace_fail(p, f"missing key(s) {', '.join(missing)}")
        step = rec["step"]
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            _trace_fail(f"{p}.step", f"expected an integer, got {step!r}")
        for key in ("phase", "config_id"):
            if not isinstance(rec[key], str) or not rec[key]:
                _trace_fail(f"{p}.{key}", f"expected a non-empty string, got {rec[key]!r}")
        samples = rec["samples"]
        if isinstance(samples, bool) or not isinstance(samples, numbers.Integral) or samples < 1:
            _trace_fail(f"{p}.samples", f"expected an integer >= 1, got {samples!r}")
        if not isinstance(rec["budget_met"], bool):
            _trace_fail(f"{p}.budget_met", f"expected true or false, got {rec['budget_met']!r}")
        if rec["correct"] is not None and not isinstance(rec["correct"], bool):
            _trace_fail(f"{p}.correct", f"expected true, false or null, got {rec['correct']!r}")
        out.append({
            "step": int(step), "phase": rec["phase"], "config_id": rec["config_id"],
            "budget_latency_ms": _trace_number(rec["budget_latency_ms"], f"{p}.budget_latency_ms",
                                               lo=0.0, lo_open=True, optional=True),
            "budget_memory_mb": _trace_number(rec["budget_memory_mb"], f"{p}.budget_memory_mb",
                                              lo=0.0, lo_open=True, optional=True),
            "width": _trace_number(rec["width"], f"{p}.width", lo=0.0, hi=1.0, lo_open=True),
            "samples": int(samples),
            "latency_ms": _trace_number(rec["latency_ms"], f"{p}.latency_ms", lo=0.0),
            "budget_met": rec["budget_met"], "correct": rec["correct"],
            "confidence": _trace_number(rec["confidence"], f"{p}.confidence", lo=0.0, hi=1.0),
        })
    return sorted(out, key=lambda r: r["step"])


def load_trace(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read and validate a budget-trace JSON file ``{"records": [...]}`` (see validate_trace)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace file {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg}") from None
    if not isinstance(data, Mapping) or "records" not in data:
        raise TraceError(f"{path}: expected a JSON object with a \"records\" list, got "
                         f"{type(data).__name__}" + (" without \"records\""
                                                     if isinstance(data, Mapping) else ""))
    return validate_trace(data["records"], str(path))


def _phases(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, int]]:
    """Contiguous runs of one phase: (phase, first index, last index)."""
    runs: list[tuple[str, int, int]] = []
    for i, r in enumerate(records):
        if runs and runs[-1][0] == r["phase"]:
            runs[-1] = (r["phase"], runs[-1][1], i)
        else:
            runs.append((r["phase"], i, i))
    return runs


def trace_summary(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per phase (in order of first appearance): calls, widths used, median latency, fraction
    of calls meeting the budget, accuracy over calls with a known label, mean confidence."""
    records = validate_trace(list(records))
    out = []
    for phase in dict.fromkeys(r["phase"] for r in records):
        rs = [r for r in records if r["phase"] == phase]
        known = [r["correct"] for r in rs if r["correct"] is not None]
        budgets = sorted({r["budget_latency_ms"] for r in rs if r["budget_latency_ms"] is not None})
        memory = sorted({r["budget_memory_mb"] for r in rs if r["budget_memory_mb"] is not None})
        out.append({
            "phase": phase, "calls": len(rs),
            "latency_budgets_ms": budgets, "memory_budgets_mb": memory,
            "widths": sorted({r["width"] for r in rs}),
            "mean_width": float(np.mean([r["width"] for r in rs])),
            "median_latency_ms": float(np.median([r["latency_ms"] for r in rs])),
            "budget_met": float(np.mean([r["budget_met"] for r in rs])),
            "accuracy": float(np.mean(known)) if known else None,
            "mean_confidence": float(np.mean([r["confidence"] for r in rs])),
        })
    return out


# --------------------------------------------------------------------------- figures


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
    _atomic_write(path, buf.getvalue())
    return path


def _shade_phases(axes, records, steps) -> None:
    for k, (phase, i, j) in enumerate(_phases(records)):
        lo, hi = steps[i] - 0.5, steps[j] + 0.5
        for ax in axes:
            ax.axvspan(lo, hi, color="0.5" if k % 2 else "0.85", alpha=0.12, lw=0)
        axes[0].text((lo + hi) / 2, 1.02, phase, transform=axes[0].get_xaxis_transform(),
                     ha="center", va="bottom", fontsize=8)


def plot_trace(records: Sequence[Mapping[str, Any]], path: str | os.PathLike,
               memory_mb: Mapping[str, float] | None = None) -> Path:
    """The budget-trace figure, written to ``path`` (PNG); returns the path.

    Panels against the call step: latency per call (budget misses marked) with the latency
    budget as a step line; the chosen width (and posterior samples, right axis); the memory
    the chosen configuration uses (``memory_mb``: MB per configuration id, e.g. the manifest's)
    beside the memory budget; the confidence per call (correct / wrong / unlabelled). Phases
    are shaded and labelled along the top.
    """
    return _save(_trace_figure(records, memory_mb), Path(path))


def _trace_figure(records: Sequence[Mapping[str, Any]],
                  memory_mb: Mapping[str, float] | None = None):
    records = validate_trace(list(records))
    steps = np.array([r["step"] for r in records], dtype=float)

    def column(key: str) -> np.ndarray:
        return np.array([np.nan if r[key] is None else r[key] for r in records], dtype=float)

    fig = _figure(figsize=(11, 9), layout="constrained")
    axes = fig.subplots(4, 1, sharex=True, height_ratios=[3, 2, 1.5, 2])
    lat, wid, mem, conf = axes
    met = np.array([r["budget_met"] for r in records])
    latency = column("latency_ms")
    budgets = column("budget_latency_ms")
    lat.plot(steps, latency, color="tab:blue", lw=0.6, alpha=0.5)
    lat.scatter(steps[met], latency[met], s=8, color="tab:blue", label="latency (budget met)")
    if (~met).any():
        lat.scatter(steps[~met], latency[~met], s=18, marker="x", color="tab:red",
                    label="latency (budget missed)")
    lat.step(steps, budgets, where="mid", color="black", lw=1.5,
             label="latency budget")
    values = np.concatenate([latency, budgets[np.isfinite(budgets)]])
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
    conf.set_xlabel("call (step)")
    conf.legend(loc="lower right", fontsize=8)

    _shade_phases(axes, records, steps)
    fig.suptitle("Budget trace: width chosen per call under a changing budget")
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


# --------------------------------------------------------------------------- report


def _fmt(value: Any, spec: str = ".4f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    return out + ["| " + " | ".join(row) + " |" for row in rows]


def _manifest_table(manifest: Manifest) -> list[str]:
    header = ["configuration", "width", "scope", "samples", "accuracy", "NLL", "ECE", "Brier",
              "OOD AUROC", "MACs", ".tflite bytes", "unique values", "latency ms", "memory MB",
              "temperature"]
    rows = []
    for c in manifest.configurations:
        t = c.test.get("calibrated", {})
        rows.append([f"`{c.id}`", f"{c.width:g}", c.scope, str(c.samples),
                     _fmt(t.get("accuracy")), _fmt(t.get("nll")), _fmt(t.get("ece")),
                     _fmt(t.get("brier")), _fmt(t.get("ood_auroc")), f"{c.macs:,}",
                     f"{sum(f.bytes for f in c.files):,}",
                     "–" if c.unique_values is None else str(c.unique_values),
                     _fmt(c.latency_ms, ".3f"), _fmt(c.memory_mb, ".1f"),
                     f"{c.temperature:.3f}"])
    return _table(header, rows)


_SHARED_METRICS = {"accuracy": "accuracy", "nll": "NLL", "ece": "ECE", "brier": "Brier",
                   "ood_auroc": "OOD AUROC"}  # the manifest table's quality columns


def _largest_differences(manifest: Manifest, results: Mapping[str, ConfigResult]
                         ) -> dict[str, float]:
    """Per shared metric, the largest |recomputed - manifest| over the configurations."""
    out: dict[str, float] = {}
    for c in manifest.configurations:
        exported = c.test.get("calibrated", {})
        for key in _SHARED_METRICS:
            a, b = results[c.id].metrics.get(key), exported.get(key)
            if a is not None and b is not None:
                out[key] = max(out.get(key, 0.0), abs(a - b))
    return out


def _recomputed_table(manifest: Manifest, results: Mapping[str, ConfigResult],
                      data: EvalData) -> list[str]:
    """On the manifest's own data the quality columns would repeat the manifest table, so
    only what it lacks is listed (their agreement is stated in the text); on other data,
    every number is new."""
    has_ood = data.ood_x is not None
    full = not data.same_as_manifest
    header = ["configuration"] + (["accuracy", "NLL", "ECE"] if full else []) \
        + ["ECE (T = 1)"] + (["Brier"] if full else []) + ["mean MI (nats)"] \
        + (["OOD AUROC"] if has_ood and full else [])
    rows = []
    for c in manifest.configurations:
        m = results[c.id].metrics
        row = [f"`{c.id}`"] + ([_fmt(m["accuracy"]), _fmt(m["nll"]), _fmt(m["ece"])] if full
                               else []) + [_fmt(results[c.id].raw_metrics["ece"])] \
            + ([_fmt(m["brier"])] if full else []) + [_fmt(m["mutual_info"])]
        if has_ood and full:
            row.append(_fmt(m.get("ood_auroc")))
        rows.append(row)
    return _table(header, rows)


def _agreement_line(manifest: Manifest, results: Mapping[str, ConfigResult]) -> str:
    diffs = _largest_differences(manifest, results)
    if not diffs:
        return ""
    worst = ", ".join(f"{_SHARED_METRICS[k]} {v:.1e}" if v else f"{_SHARED_METRICS[k]} 0"
                      for k, v in diffs.items())
    return (" On the same samples the manifest was measured on, the interpreter reproduces the "
            f"table above (largest difference over the configurations: {worst}), so only the "
            "numbers it lacks are listed.")


def _budget(value: float) -> str:
    """A budget as a person would set it: 3 significant digits (0.0107, not 0.0107421875)."""
    return f"{value:.3g}"


def _threshold_table(manifest: Manifest, results: Mapping[str, ConfigResult],
                     labels: np.ndarray) -> list[str]:
    """Per configuration and target accuracy: the exported threshold, the fraction of the
    evaluation data it keeps and their accuracy (✗ when below the target)."""
    targets = sorted({t for c in manifest.configurations for t in c.thresholds}, key=float)
    rows = []
    for c in manifest.configurations:
        res = results[c.id]
        conf, ok = res.confidence, res.correct(labels)
        row = [f"`{c.id}`"]
        for target in targets:
            thr = c.thresholds.get(target)
            if thr is None:
                row.append("not reachable on validation")
                continue
            cov, acc = selective_accuracy(conf, ok, thr)
            miss = "" if math.isnan(acc) or acc >= float(target) else " ✗"
            row.append(f"≥ {thr:.3f}: keeps {100 * cov:.1f}%, accuracy {_fmt(acc)}{miss}")
        rows.append(row)
    return _table(["configuration"] + [f"target {t}" for t in targets], rows)


def _trace_table(records: Sequence[Mapping[str, Any]]) -> list[str]:
    header = ["phase", "calls", "latency budget ms", "memory budget MB", "widths used",
              "median latency ms", "budget met", "accuracy", "mean confidence"]
    rows = []
    for s in trace_summary(records):
        rows.append([s["phase"], str(s["calls"]),
                     ", ".join(map(_budget, s["latency_budgets_ms"])) or "none",
                     ", ".join(map(_budget, s["memory_budgets_mb"])) or "none",
                     ", ".join(f"{w:g}" for w in s["widths"]), f"{s['median_latency_ms']:.3f}",
                     f"{100 * s['budget_met']:.0f}%", _fmt(s["accuracy"], ".3f"),
                     f"{s['mean_confidence']:.3f}"])
    return _table(header, rows)


def _source_line(src: Mapping[str, Any]) -> str:
    parts = [f"{k} `{src[k]}`" for k in ("checkpoint", "posterior", "architecture") if k in src]
    comp = src.get("compression")
    if isinstance(comp, Mapping):
        parts += [f"{k.replace('_', ' ')} {v:g}" if isinstance(v, float) else
                  f"{k.replace('_', ' ')} {v}" for k, v in comp.items() if v is not None]
    return ", ".join(parts)


def write_report(bundle_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
                 eval_data: str | None = None, ood_data: str | None = None,
                 trace: str | os.PathLike | Sequence[Mapping[str, Any]] | None = None,
                 max_eval: int | None = None, log=print) -> Path:
    """Write ``report.md`` and its figures for the bundle at ``bundle_dir``; return the
    report's path. ``trace`` is a budget-trace JSON file or its list of records. Prints (via
    ``log``) each figure's path, then the report's path last."""
    bundle = Path(bundle_dir)
    manifest = read_manifest(bundle)  # validates the schema and every file's sha256
    records = None
    if trace is not None:  # checked first: a bad trace should not cost an evaluation
        records = load_trace(trace) if isinstance(trace, (str, os.PathLike)) \
            else validate_trace(list(trace))
    out = Path(out_dir) if out_dir is not None else \
        bundle.resolve().parent / f"{bundle.resolve().name}-report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the report directory {out}: {exc}") from None

    data = load_eval_data(manifest, eval_data, ood_data, max_eval, log)
    log(f"evaluating {len(manifest.configurations)} configurations on {len(data.y)} samples"
        + ("" if data.ood_x is None else f" (+{len(data.ood_x)} OOD)"))
    results = {c.id: evaluate_configuration(bundle, c, data) for c in manifest.configurations}

    figures = {"reliability": plot_reliability(manifest, results, data.y, out / "reliability.png"),
               "width": plot_width(manifest, results, out / "width.png"),
               "risk_coverage": plot_risk_coverage(manifest, results, data.y,
                                                   out / "risk_coverage.png")}
    if records is not None:
        figures["trace"] = plot_trace(records, out / "trace.png", memory_mb={
            c.id: Policy.memory_need_mb(c) for c in manifest.configurations})
    for fig in figures.values():
        log(str(fig))

    src = manifest.source
    lines = [f"# Report: bundle `{bundle.resolve().name}`", "",
             f"- bundle: `{bundle.resolve()}` ({len(manifest.configurations)} configurations, "
             f"{len(manifest.labels)} classes, input {list(manifest.input.shape)} "
             f"{manifest.input.dtype})",
             f"- source: {_source_line(src)}",
             f"- evaluation data: {data.description}, {len(data.y)} samples",
             f"- OOD data: {data.ood_description or 'none'}"
             + ("" if data.ood_x is None else f", {len(data.ood_x)} samples"), "",
             "## Configurations as exported", "",
             "Test metrics from the manifest, after temperature scaling (temperature and "
             f"thresholds fitted on the validation split; measured on {src.get('eval_data', '?')}"
             "). Bytes: the configuration's `.tflite` files; unique values: distinct weight "
             "values of the point slice before BN folding; latency and memory: measured on "
             "the exporting host (– when exported with `--no-measure`).", "",
             *_manifest_table(manifest), "",
             "## Recomputed on the evaluation data", "",
             "Every configuration's `.tflite` files run in the LiteRT interpreter on the "
             "evaluation data: softmax(logits / temperature) averaged over posterior samples. "
             "ECE: 15 equal-width confidence bins; OOD AUROC: predictive entropy as the score; "
             "MI: mutual information between prediction and posterior sample."
             + (_agreement_line(manifest, results) if data.same_as_manifest else ""), "",
             *_recomputed_table(manifest, results, data), "",
             "## Calibration", "",
             "Reliability diagram per configuration: accuracy in each confidence bin against "
             "the diagonal (perfect calibration); red: the gap to the bin's mean confidence; "
             f"pale hatched bars: bins with fewer than {FEW_BIN_SAMPLES} samples, whose "
             "accuracy is mostly noise.", "",
             "![reliability diagrams](reliability.png)", "",
             "## Accuracy and ECE against width", "",
             "![accuracy and ECE against width](width.png)", "",
             "## Risk–coverage", "",
             "Accuracy of the predictions kept when abstaining below a confidence threshold, "
             "against the fraction kept. Markers: the manifest's threshold for each target "
             "accuracy (fitted on validation) applied to the evaluation data. Table: the "
             "threshold, the share of the evaluation data it keeps and their accuracy "
             "(✗: below the target).", "",
             "![risk-coverage curves](risk_coverage.png)", "",
             *_threshold_table(manifest, results, data.y), ""]
    if records is not None:
        lines += ["## Budget trace", "",
                  f"{len(records)} calls; the configuration chosen per call under the trace's "
                  "budgets (latency per call against the latency budget, chosen width and "
                  "samples, memory the chosen configuration uses against the memory budget, "
                  "confidence).", "",
                  "![budget trace](trace.png)", "", *_trace_table(records), ""]
    path = out / REPORT_NAME
    _atomic_write(path, "\n".join(lines).encode("utf-8"))
    log(str(path))
    return path
