"""The text of ``report.md``: the report's tables and prose, in Markdown.

Tables: every configuration as exported (the manifest's test metrics, MACs, .tflite bytes,
unique weight values, host latency and memory, temperature); the quality numbers recomputed on
the evaluation data (on the manifest's own data only those the first table lacks, with the
largest disagreement stated); what each exported threshold does on the evaluation data; the
trace per phase, budgets to 3 significant digits.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edge_sdk.bundle import Manifest
from edge_sdk.answers.metrics import selective_accuracy
from exporters.report.data import ConfigResult, EvalData
from exporters.report.figures import FEW_BIN_SAMPLES
from exporters.report.trace import trace_summary

__all__ = ["REPORT_NAME", "render_report"]

REPORT_NAME = "report.md"


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


def render_report(bundle: Path, manifest: Manifest, data: EvalData,
                  results: Mapping[str, ConfigResult],
                  records: Sequence[Mapping[str, Any]] | None,
                  uncertainty: Sequence[str] = ()) -> str:
    """The text of ``report.md``; the figures it links sit next to it (see
    :mod:`exporters.report.figures`)."""
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
             *_threshold_table(manifest, results, data.y), "", *uncertainty]
    if records is not None:
        lines += ["## Budget trace", "",
                  f"{len(records)} calls; the configuration chosen per call under the trace's "
                  "budgets (latency per call against the latency budget, chosen width and "
                  "samples, memory the chosen configuration uses against the memory budget, "
                  "confidence).", "",
                  "![budget trace](trace.png)", "", *_trace_table(records), ""]
    return "\n".join(lines)
