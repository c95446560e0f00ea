"""The report's uncertainty section: per width, the OOD score on the evaluation data
(and the OOD data, when there is some) and the conformal sets' coverage against their size.

Everything is recomputed through the bundle's own slices (their features output) and its own
``uncertainty.bin`` (:class:`edge_sdk.answers.uncertainty.Uncertainty`), so the figures are what the
runtime answers; the probabilities are the report's recomputed ones (``ConfigResult.probs``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from edge_sdk.answers import metrics as M
from edge_sdk.bundle import Manifest
from edge_sdk.answers.uncertainty import ALPHAS, Uncertainty

REPORT_ALPHAS = (0.05, 0.1, 0.2)


@dataclass
class WidthUncertainty:
    config: str
    threshold: float
    test_scores: np.ndarray
    ood_scores: np.ndarray | None
    # alpha -> (coverage, mean set size, worst class coverage), LAC, every grid alpha
    sets: dict[float, tuple[float, float, float]] = field(default_factory=dict)


def _slice_source(bundle: Path, manifest: Manifest):
    from edge_sdk.store.sources import open_slices

    return open_slices(bundle, manifest)


def evaluate_uncertainty(bundle: Path, manifest: Manifest, data, results: Mapping
                         ) -> dict[str, WidthUncertainty] | None:
    """Per width key, the point configuration's scores and sets; None without statistics."""
    if manifest.uncertainty is None:
        return None
    from edge_sdk.bundle.slices import read_verified
    from exporters.uncertainty import run_outputs

    unc = Uncertainty.from_bytes(read_verified(bundle, manifest.uncertainty))
    source = _slice_source(bundle, manifest)
    out = {}
    for c in sorted((c for c in manifest.configurations if c.scope == "point"),
                    key=lambda c: c.width):
        wk = f"{c.width:.2f}"
        blob = source[c.files[0].name]
        test = unc.score(wk, run_outputs(blob, data.x)[1])
        ood = None if data.ood_x is None else unc.score(wk, run_outputs(blob, data.ood_x)[1])
        w = WidthUncertainty(c.id, unc.widths[wk].threshold, test, ood)
        probs, y = results[c.id].probs, data.y
        for a in ALPHAS:
            q = unc.qhat(c.id, "lac", a)
            mask = unc.set_mask(probs, math.inf if q is None else q, "lac")
            hit = mask[np.arange(len(y)), y]
            w.sets[a] = (float(hit.mean()), float(mask.sum(1).mean()),
                         float(min(hit[y == k].mean() for k in np.unique(y))))
        out[wk] = w
    return out


def plot_uncertainty(ws: Mapping[str, WidthUncertainty], path: Path) -> Path:
    """Left: the OOD score's histogram per width (evaluation data, OOD data) with the
    threshold; right: conformal coverage against mean set size over the alpha grid."""
    from exporters.report.figures import _colormap, _figure, _save

    keys = list(ws)
    fig = _figure(figsize=(4.2 * len(keys) + 4.6, 4.2), layout="constrained")
    axes = fig.subplots(1, len(keys) + 1, squeeze=False)[0]
    for ax, wk in zip(axes, keys):
        w = ws[wk]
        lo = min(w.test_scores.min(), w.ood_scores.min() if w.ood_scores is not None else 0)
        hi = max(w.test_scores.max(), w.ood_scores.max() if w.ood_scores is not None else -1)
        bins = np.linspace(lo, hi, 40)
        ax.hist(w.test_scores, bins, alpha=0.6, density=True, label="evaluation data")
        if w.ood_scores is not None:
            ax.hist(w.ood_scores, bins, alpha=0.6, density=True, label="OOD data")
        ax.axvline(w.threshold, color="black", ls="--", lw=1, label="threshold (95 % of val)")
        ax.set(title=f"width {wk}: ood_score", xlabel="ood_score (higher = less familiar)")
        ax.legend(fontsize=7)
    ax = axes[-1]
    for i, wk in enumerate(keys):
        pts = sorted(ws[wk].sets.items())
        ax.plot([s[1] for _, s in pts], [s[0] for _, s in pts], marker="o", ms=3,
                color=_colormap()(0.1 + 0.8 * i / max(len(keys) - 1, 1)), label=f"width {wk}")
    for a in REPORT_ALPHAS:
        ax.axhline(1 - a, color="0.5", ls=":", lw=0.8)
    ax.set(title="LAC sets: coverage vs size (alpha grid)", xlabel="mean set size",
           ylabel="coverage on the evaluation data")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def uncertainty_lines(ws: Mapping[str, WidthUncertainty] | None) -> list[str]:
    """The report's markdown section."""
    if ws is None:
        return ["## Uncertainty", "", "This bundle has no `uncertainty.bin` (schema version "
                "< 5, or exported with `--no-uncertainty`): answers carry no OOD score and no "
                "prediction set.", ""]
    ood = any(w.ood_scores is not None for w in ws.values())
    head = ["width", "configuration", "evaluation data in distribution"]
    if ood:
        head += ["OOD AUROC", "FPR95", "AUPR", "OOD accepted"]
    head += [f"LAC α={a:g}: coverage / size / worst class" for a in REPORT_ALPHAS]
    rows = []
    for wk, w in ws.items():
        r = [wk, w.config, f"{(w.test_scores <= w.threshold).mean():.3f}"]
        if ood:
            if w.ood_scores is None:
                r += ["–"] * 4
            else:
                r += [f"{M.ood_auroc(w.test_scores, w.ood_scores):.3f}",
                      f"{M.ood_fpr_at_tpr(w.test_scores, w.ood_scores):.3f}",
                      f"{M.ood_aupr(w.test_scores, w.ood_scores):.3f}",
                      f"{(w.ood_scores <= w.threshold).mean():.3f}"]
        r += ["{:.3f} / {:.2f} / {:.3f}".format(*w.sets[a]) for a in REPORT_ALPHAS]
        rows.append(r)
    return ["## Uncertainty", "",
            "Per width, the point slice's `ood_score` (KNN on its features, docs/uncertainty.md) "
            "and its LAC conformal sets, recomputed through the slices and `uncertainty.bin`. "
            "In distribution: score at or below the threshold fitted to accept 95 % of "
            "validation images. OOD = the positive class for AUROC, FPR at 95 % TPR and AUPR. "
            "Coverage: the share of sets holding the true class (the promise: ≥ 1 − α over "
            "exchangeable data).", "",
            "![OOD score histograms and conformal coverage](uncertainty.png)", "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(r) + " |" for r in rows), ""]
