"""``edge-sdk report``: a Markdown report with PNG figures for a bundle (workstation side).

``write_report(bundle_dir)`` writes ``report.md`` and its figures into
``<bundle>/../<bundle name>-report/`` or ``out_dir``. One module per job:

- :mod:`exporters.report.data`: the evaluation data rebuilt (the bundle's own test split, or
  an explicit source) and every configuration run on it in the LiteRT interpreter;
- :mod:`exporters.report.trace`: the budget-trace format the demo writes (validation, summary);
- :mod:`exporters.report.figures`: reliability, width, risk–coverage and trace figures;
- :mod:`exporters.report.markdown`: the tables and text of ``report.md``;
- :mod:`exporters.report.uncertainty`: the OOD score and conformal sets per width.

The maths they share with the exporter and the runtime (temperature-averaged probabilities,
risk–coverage, reliability bins) lives in :mod:`edge_sdk.answers.metrics`; ``risk_coverage``,
``selective_accuracy`` and ``RiskCoverage`` are re-exported here.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edge_sdk.bundle import read_manifest
from edge_sdk.errors import ConfigError
from edge_sdk.answers.metrics import RiskCoverage, risk_coverage, selective_accuracy
from edge_sdk.policy.policy import Policy
from exporters.report.data import ConfigResult, EvalData, evaluate_configuration, load_eval_data
from exporters.report.figures import (  # noqa: F401  (the helpers tests draw with, too)
    DPI, FEW_BIN_SAMPLES, _figure, _reliability_cell, _trace_figure, _width_figure,
    plot_reliability, plot_risk_coverage, plot_trace, plot_width)
from exporters.report.files import atomic_write
from exporters.report.markdown import REPORT_NAME, render_report
from exporters.report.trace import TraceError, load_trace, trace_summary, validate_trace
from exporters.report.uncertainty import evaluate_uncertainty, plot_uncertainty, uncertainty_lines

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
    unc = evaluate_uncertainty(bundle, manifest, data, results)
    if unc:
        figures["uncertainty"] = plot_uncertainty(unc, out / "uncertainty.png")
    if records is not None:
        figures["trace"] = plot_trace(records, out / "trace.png", memory_mb={
            c.id: Policy.memory_need_mb(c) for c in manifest.configurations})
    for fig in figures.values():
        log(str(fig))

    path = out / REPORT_NAME
    text = render_report(bundle, manifest, data, results, records, uncertainty_lines(unc))
    atomic_write(path, text.encode("utf-8"))
    log(str(path))
    return path
