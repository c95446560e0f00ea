"""Conformal prediction sets before and after the non-empty rule (issue 51), through the runtime.

    python benchmarks/conformal_sets.py                      # runs/demo/bundle, digits test split
    python benchmarks/conformal_sets.py /work/runs/i50/cifar_bundle --configs w1.00-point

Per point configuration of float precision (or ``--configs``) and alpha (0.05 / 0.1 / 0.2), on
the bundle's own test split (the data config the manifest records in ``source.data``, rebuilt
with ``trainer.data.load_data``: the same source and split seed, i.e. the identical samples the
exporter measured; for the demo bundle, scikit-learn's digits split as ``demos/`` trains it; for
a cifar10_dev bundle, the npz's 5,000 test images), every answer from ``predict_batch`` of the
torch-free runtime (``edge_sdk.load``):

- AFTER: the runtime's ``prediction_sets`` (the non-empty rule: every set holds the answer);
- BEFORE: the plain set at the same quantile (``Uncertainty.set_mask(..., nonempty=False)``),
  what the runtime answered before issue 51.

Columns: coverage before / after; two lower bounds a correct 1 - alpha procedure clears with
probability 0.99: ``bin`` = the 1 % quantile of Binomial(n, 1 - alpha) / n (treats the test hits
as independent draws at exactly 1 - alpha, ignoring the calibration set's own randomness) and
``β-bin`` = the 1 % quantile of the split-conformal law of the plain set's coverage given n_cal
calibration samples, Beta-Binomial(n, n_cal + 1 - l, l) / n with l = floor((n_cal + 1) alpha)
(Vovk 2012; exact for continuous scores, the wider of the two; ``(below!)`` marks a
coverage under it); mean set size before / after;
the share and number of empty plain sets, and of those answers: accuracy, mean confidence and
how many did *not* abstain and how accurate those were (the answers an "empty set = abstain"
reading would have thrown away); ``q̂`` the quantile used (``Uncertainty.qhat``).
AFTER has no empty set by construction (checked: the script stops if one appears, or if AFTER is
not BEFORE plus each answer's label).

The test split is read with ``trainer.data`` (torch); the answers come from the runtime alone.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import edge_sdk

ALPHAS = (0.05, 0.1, 0.2)


def _log_binom(n: int, k: np.ndarray) -> np.ndarray:
    lg = np.vectorize(math.lgamma)
    return lg(n + 1) - lg(k + 1) - lg(n - k + 1)


def _lower(log_pmf: np.ndarray, n: int, q: float = 0.01) -> float:
    """The q-quantile / n of a distribution on 0..n given its log pmf."""
    cdf = np.cumsum(np.exp(log_pmf - log_pmf.max()))
    cdf /= cdf[-1]
    return int(np.searchsorted(cdf, q)) / n


def binomial_lower(n: int, cover: float, q: float = 0.01) -> float:
    k = np.arange(n + 1)
    return _lower(_log_binom(n, k) + k * math.log(cover) + (n - k) * math.log1p(-cover), n, q)


def beta_binomial_lower(n: int, n_cal: int, alpha: float, q: float = 0.01) -> float:
    """The split-conformal law: given the calibration set, the plain set covers with
    probability Beta(n_cal + 1 - l, l); n test hits are then Beta-Binomial."""
    l_ = math.floor((n_cal + 1) * alpha)
    if l_ < 1:  # the quantile is beyond the calibration set: every class, coverage 1
        return 1.0
    a, b = n_cal + 1 - l_, l_
    k = np.arange(n + 1)
    lbeta = np.vectorize(lambda x, y: math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y))
    return _lower(_log_binom(n, k) + lbeta(k + a, n - k + b) - lbeta(a, b), n, q)


def test_split(manifest, max_eval: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    """(raw NHWC test samples, labels, validation samples the quantiles were fitted on) of the
    data the manifest records."""
    from trainer.config import config_from_dict
    from trainer.data import load_data

    data = manifest.source.get("data")
    if not isinstance(data, dict):
        raise SystemExit("the manifest records no source.data: pass a bundle exported with it")
    src = str(data.get("source", ""))
    if src.startswith("npz:") and not Path(src[4:]).is_file():
        raise SystemExit(f"{src[4:]} is missing (../shared/data: see its README)")
    splits = load_data(config_from_dict({"data": dict(data)}).data)
    cap = manifest.source.get("max_eval")
    n_cal = len(splits.val.y) if not isinstance(cap, int) else min(cap, len(splits.val.y))
    x, y = np.asarray(splits.test.raw), splits.test.y.numpy()
    if max_eval is not None:
        x, y = x[:max_eval], y[:max_eval]
    dtype = np.uint8 if manifest.input.dtype == "uint8" else np.float32
    return x.astype(dtype), y, n_cal


def measure(model, cid: str, x: np.ndarray, y: np.ndarray, alpha: float, n_cal: int) -> dict:
    unc = model.uncertainty
    outs = [model.predict_batch(x[i:i + 256], config_id=cid, alpha=alpha)
            for i in range(0, len(x), 256)]
    probs = np.concatenate([o.probs for o in outs])
    labels = np.concatenate([o.labels for o in outs])
    conf = np.concatenate([o.confidence for o in outs])
    abstain = np.concatenate([o.abstain for o in outs])
    after = np.concatenate([o.prediction_sets for o in outs])
    q = unc.qhat(cid, model.conformal, alpha)
    before = unc.set_mask(probs, math.inf if q is None else q, model.conformal, nonempty=False)
    expect = before.copy()
    expect[np.arange(len(y)), labels] = True
    if not np.array_equal(after, expect) or (after.sum(1) == 0).any():
        raise SystemExit(f"{cid} alpha {alpha}: the runtime's sets are not the plain sets plus "
                         f"each answer's label")
    n = len(y)
    idx = np.arange(n)
    empty = before.sum(1) == 0
    right = labels == y
    return {"n": n, "cov_before": before[idx, y].mean(), "cov_after": after[idx, y].mean(),
            "bin": binomial_lower(n, 1 - alpha), "betabin": beta_binomial_lower(n, n_cal, alpha),
            "size_before": before.sum(1).mean(), "size_after": after.sum(1).mean(),
            "empty_share": empty.mean(), "empty": int(empty.sum()),
            "empty_acc": right[empty].mean() if empty.any() else math.nan,
            "empty_conf": conf[empty].mean() if empty.any() else math.nan,
            "empty_kept": int((empty & ~abstain).sum()),
            "kept_acc": right[empty & ~abstain].mean() if (empty & ~abstain).any() else math.nan,
            "accuracy": right.mean(), "qhat": q}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", nargs="?", default="runs/demo/bundle")
    ap.add_argument("--configs", nargs="+", default=None,
                    help="configuration ids (default: every point configuration, float weights)")
    ap.add_argument("--alphas", nargs="+", type=float, default=list(ALPHAS))
    ap.add_argument("--conformal", default="lac", choices=["lac", "aps", "raps"])
    ap.add_argument("--max-eval", type=int, default=None, help="first N test samples only")
    args = ap.parse_args(argv)
    model = edge_sdk.load(args.bundle, profile=None, conformal=args.conformal)
    if model.uncertainty is None:
        raise SystemExit(f"{args.bundle}: no uncertainty.bin (schema version <= 4, or exported "
                         f"--no-uncertainty): no prediction sets")
    x, y, n_cal = test_split(model.manifest, args.max_eval)
    cids = args.configs or [c.id for c in model.manifest.configurations
                            if c.scope == "point" and c.precision == "float"]
    print(f"{args.bundle}: {model.manifest.source.get('data', {}).get('source')} test split, "
          f"n = {len(y)}; quantiles fitted on n_cal = {n_cal} validation samples; "
          f"{args.conformal.upper()}")
    print()
    print("| config | acc | α | q̂ | coverage before → after | 1 % lower bound: bin / β-bin | "
          "mean size before → after | empty before: share (n) → after | of those: acc / mean "
          "conf / not abstaining (their acc) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cid in cids:
        for a in args.alphas:
            r = measure(model, cid, x, y, a, n_cal)
            flag = "" if r["cov_after"] >= r["betabin"] else " (below!)"
            tail = ("–" if not r["empty"] else
                    f"{r['empty_acc']:.3f} / {r['empty_conf']:.3f} / {r['empty_kept']}"
                    + (f" ({r['kept_acc']:.3f})" if r["empty_kept"] else ""))
            q = "every class" if r["qhat"] is None else f"{r['qhat']:.6g}"
            print(f"| {cid} | {r['accuracy']:.3f} | {a:g} | {q} | {r['cov_before']:.4f} → "
                  f"{r['cov_after']:.4f}{flag} | {r['bin']:.4f} / {r['betabin']:.4f} | "
                  f"{r['size_before']:.3f} → {r['size_after']:.3f} | "
                  f"{r['empty_share']:.3f} ({r['empty']}) → 0 | {tail} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
