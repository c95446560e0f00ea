"""What a bundle's uncertainty fields deliver, through the runtime (issue 33's closing table).

    python benchmarks/uncertainty.py --dataset cifar10_dev --bundles runs/u33/cifar_A \
        --plain runs/u33/cifar_A_nounc --out benchmarks/results/uncertainty_cifar10_dev.md

Per bundle (one per seed) and width, the point configuration pinned, every figure from
``predict_batch`` / ``predict`` of the torch-free runtime (``edge_sdk.load``), i.e. what an app
gets:

- test split: accuracy, NLL, AURC of ``confidence`` (misclassification detection), the share
  ``in_distribution``;
- OOD, on the **second half** of each OOD group (the first halves only pick, per the issue,
  between entropy and max-softmax for the temperature-scaled softmax baseline): AUROC, FPR at
  95 % TPR and AUPR of ``ood_score`` (the bundle's default score) and of that baseline, with a
  bootstrap 95 % interval of the AUROC (test and OOD resampled, 1,000 draws);
- conformal sets (``prediction_set``) at alpha 0.05 / 0.1 / 0.2: test coverage (and whether it
  is inside the binomial 95 % interval around 1 - alpha), mean set size, worst class coverage;
  and the same under the cascade policy (``load(policy="cascade")``, no budget);
- cost: median ``predict`` latency over ``--calls`` calls (1 thread, pinned), with the fields
  on and off (``load(uncertainty=False)``) and against the bundle exported without them
  (``--plain``; its slices have no features output), interleaved in blocks so drift hits all
  alike; and the bundle's bytes against the plain bundle's.

Deep-ensemble and other baselines' AUROC come from their own runs (``--ensemble-json``,
``benchmarks/baselines.py`` results on the same splits) and are printed beside ours.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import edge_sdk  # noqa: E402
from edge_sdk.answers import metrics as M  # noqa: E402
from exporters.export import bundle_bytes  # noqa: E402
from exporters.report.data import load_eval_data  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data"
ALPHAS = (0.05, 0.1, 0.2)


def _ood_halves(dataset: str, manifest, data_dir: Path) -> tuple[dict, dict]:
    """{group: NHWC inputs} of the first (selection) and second (report) halves."""
    from benchmarks.baselines import DATASETS, ood_sets
    from edge_sdk.bundle import InputSpec
    from trainer.data import nhwc_inputs

    spec = InputSpec.from_dict({**manifest.input.to_dict(), "classes": list(manifest.labels)})
    select, report = ood_sets(DATASETS[dataset], spec, data_dir, lambda ds: ds)
    return ({g: nhwc_inputs(d)[0] for g, d in select.items()},
            {g: nhwc_inputs(d)[0] for g, d in report.items()})


def _raw(manifest, xn: np.ndarray) -> np.ndarray:
    """Normalised NHWC inputs back to the raw values the runtime takes."""
    mean = np.asarray(manifest.input.mean, np.float32)
    std = np.asarray(manifest.input.std, np.float32)
    raw = xn * std + mean
    if manifest.input.dtype == "uint8":
        return np.clip(np.rint(raw), 0, 255).astype(np.uint8)
    lo, hi = manifest.input.value_range
    return np.clip(raw, lo, hi).astype(np.float32)


def _batch(model, xs: np.ndarray, alpha: float = 0.1, **kw):
    """predict_batch over chunks of 256 (one decision per chunk), arrays concatenated."""
    outs = [model.predict_batch(xs[i:i + 256], alpha=alpha, **kw) for i in range(0, len(xs), 256)]
    def cat(f):  # a field the answering configuration lacks (all scope: no score) -> NaN
        parts = [getattr(o, f) for o in outs]
        return np.concatenate([np.full(len(o), np.nan) if p is None else p
                               for o, p in zip(outs, parts)])
    return {"probs": cat("probs"), "conf": cat("confidence"), "ood": cat("ood_score"),
            "inside": cat("in_distribution"), "sets": cat("prediction_sets"),
            "configs": [p.config_id for o in outs for p in o]}


def _aurc(conf: np.ndarray, correct: np.ndarray) -> float:
    """Area under the risk-coverage curve (selective risk integrated over coverage; lower is
    better misclassification detection)."""
    rc = M.risk_coverage(conf, correct)
    return float(np.sum((1 - rc.accuracy) * np.diff(rc.coverage, prepend=0.0)))


def _entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(np.clip(p, 1e-12, 1))).sum(1)


def _ood_row(s_in, s_out, rng, draws=1000) -> dict:
    auc = M.ood_auroc(s_in, s_out)
    boot = []
    for _ in range(draws):
        boot.append(M.ood_auroc(rng.choice(s_in, len(s_in)), rng.choice(s_out, len(s_out))))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"auroc": auc, "lo": float(lo), "hi": float(hi),
            "fpr95": M.ood_fpr_at_tpr(s_in, s_out), "aupr": M.ood_aupr(s_in, s_out)}


def _coverage(sets: np.ndarray, y: np.ndarray, alpha: float) -> dict:
    hit = sets[np.arange(len(y)), y]
    n = len(y)
    half = 1.96 * math.sqrt(alpha * (1 - alpha) / n)
    return {"coverage": float(hit.mean()), "size": float(sets.sum(1).mean()),
            "worst_class": float(min(hit[y == c].mean() for c in np.unique(y))),
            "inside": bool(abs(hit.mean() - (1 - alpha)) <= half)}


def _latency(models: dict, cid: str, x, calls: int, block: int = 500) -> dict:
    """Median predict() ms per variant, interleaved blocks of ``block`` calls."""
    times = {k: [] for k in models}
    for m in models.values():
        m.warm_up(config_ids=[cid])
        for _ in range(200):
            m.predict(x, config_id=cid)
    for _ in range(max(calls // block, 1)):
        for k, m in models.items():
            pc = time.perf_counter
            for _ in range(block):
                t0 = pc()
                m.predict(x, config_id=cid)
                times[k].append(pc() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def evaluate(bundle: Path, dataset: str, data_dir: Path, plain: Path | None, calls: int,
             log=print) -> dict:
    model = edge_sdk.load(bundle, profile=None, threads=1)
    man = model.manifest
    data = load_eval_data(man, log=log)
    x, y = _raw(man, data.x), data.y
    first, second = _ood_halves(dataset, man, data_dir)
    rng = np.random.default_rng(0)
    run: dict = {"bundle": str(bundle), "n_test": int(len(y)),
                 "groups": {g: int(len(v)) for g, v in second.items()}, "widths": {}}
    points = [c for c in man.configurations if c.scope == "point"]
    off = edge_sdk.load(bundle, profile=None, threads=1, uncertainty=False)
    flat = edge_sdk.load(plain, profile=None, threads=1) if plain else None
    for c in points:
        t = _batch(model, x, config_id=c.id)
        correct = t["probs"].argmax(1) == y
        row: dict = {"config": c.id, "accuracy": float(correct.mean()),
                     "nll": M.nll(t["probs"], y),
                     "aurc": _aurc(t["conf"], correct),
                     "test_in_distribution": float(t["inside"].mean()), "ood": {}}
        # the TS-softmax baseline: entropy or max-softmax, whichever the first halves prefer
        base = {"entropy": _entropy, "msp": lambda p: -p.max(1)}
        pick = max(base, key=lambda k: np.mean([M.ood_auroc(
            base[k](t["probs"]), base[k](_batch(model, _raw(man, v), config_id=c.id)["probs"]))
            for v in first.values()]))
        row["baseline"] = pick
        for g, v in second.items():
            o = _batch(model, _raw(man, v), config_id=c.id)
            row["ood"][g] = {"score": _ood_row(t["ood"], o["ood"], rng),
                             "softmax": _ood_row(base[pick](t["probs"]), base[pick](o["probs"]),
                                                 rng),
                             "accepted": float(o["inside"].mean())}
        row["conformal"] = {f"{a:g}": _coverage(_batch(model, x, alpha=a, config_id=c.id)
                                                ["sets"], y, a) for a in ALPHAS}
        variants = {"fields on": model, "fields off": off}
        if flat is not None:
            variants["plain bundle"] = flat
        row["latency_ms"] = _latency(variants, c.id, x[0], calls)
        run["widths"][f"{c.width:.2f}"] = row
        log(f"{bundle.name} {c.id}: acc {row['accuracy']:.4f}, "
            + ", ".join(f"{g} AUROC {r['score']['auroc']:.3f} (softmax {r['softmax']['auroc']:.3f})"
                        for g, r in row["ood"].items())
            + f", LAC@0.1 {row['conformal']['0.1']['coverage']:.3f} / "
              f"{row['conformal']['0.1']['size']:.2f}, ms " +
            ", ".join(f"{k} {v:.4f}" for k, v in row["latency_ms"].items()))
    casc = edge_sdk.load(bundle, profile=None, threads=1, policy="cascade")
    run["cascade"] = {}
    for a in ALPHAS:
        t = _batch(casc, x, alpha=a)
        run["cascade"][f"{a:g}"] = {**_coverage(t["sets"], y, a),
                                    "answered_by": {k: t["configs"].count(k)
                                                    for k in sorted(set(t["configs"]))}}
    run["bytes"] = bundle_bytes(bundle)
    run["plain_bytes"] = bundle_bytes(plain) if plain else None
    run["uncertainty_bytes"] = man.uncertainty.bytes if man.uncertainty else None
    return run


def render(runs: list[dict], dataset: str, ensemble: dict | None, command: str) -> str:
    lines = [f"Command: `{command}`", "", f"### {dataset}: the bundle's uncertainty fields "
             "through the runtime (test split; OOD = second halves)", ""]
    groups = list(runs[0]["groups"])
    ws = list(runs[0]["widths"])

    def mean(f):
        vals = [f(r) for r in runs]
        m = float(np.mean(vals))
        return f"{m:.4f}" if len(vals) == 1 else f"{m:.4f} ± {np.std(vals, ddof=1):.4f}"

    head = ["width", "accuracy", "NLL", "AURC", "test in-dist"]
    for g in groups:
        head += [f"{g}: ood_score AUROC [95 % CI] / FPR95 / AUPR", f"{g}: TS softmax AUROC"]
        if ensemble:
            head.append(f"{g}: ensemble x3 AUROC")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in ws:
        cells = [w, mean(lambda r: r["widths"][w]["accuracy"]),
                 mean(lambda r: r["widths"][w]["nll"]), mean(lambda r: r["widths"][w]["aurc"]),
                 mean(lambda r: r["widths"][w]["test_in_distribution"])]
        for g in groups:
            s = [r["widths"][w]["ood"][g]["score"] for r in runs]
            ci = "; ".join(f"[{x['lo']:.3f}, {x['hi']:.3f}]" for x in s)
            cells.append(f"{np.mean([x['auroc'] for x in s]):.3f} {ci} / "
                         f"{np.mean([x['fpr95'] for x in s]):.3f} / "
                         f"{np.mean([x['aupr'] for x in s]):.3f}")
            cells.append(f"{np.mean([r['widths'][w]['ood'][g]['softmax']['auroc'] for r in runs]):.3f}"
                         f" ({runs[0]['widths'][w]['baseline']})")
            if ensemble:
                cells.append(f"{ensemble.get(g, float('nan')):.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "#### conformal sets (LAC, calibrated on validation): coverage / mean size / "
              "worst class coverage; * = outside the binomial 95 % interval around 1 - alpha", "",
              "| width | " + " | ".join(f"alpha {a:g}" for a in ALPHAS) + " |",
              "|" + "---|" * (len(ALPHAS) + 1)]
    for w in ws + ["cascade"]:
        cells = [w]
        for a in ALPHAS:
            rs = [r["cascade"][f"{a:g}"] if w == "cascade" else r["widths"][w]["conformal"][f"{a:g}"]
                  for r in runs]
            cells.append("; ".join(f"{x['coverage']:.3f}{'' if x['inside'] else '*'} / "
                                   f"{x['size']:.2f} / {x['worst_class']:.3f}" for x in rs))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "cascade answers (alpha 0.1): " + "; ".join(
        json.dumps(r["cascade"]["0.1"]["answered_by"]) for r in runs), "",
        "#### cost: median predict() ms per call (1 thread, pinned, interleaved blocks), and bytes", "",
        "| width | fields on | fields off | plain bundle | on / plain | on - plain (us) |",
        "|---|---|---|---|---|---|"]
    for w in ws:
        lat = runs[0]["widths"][w]["latency_ms"]
        plain = lat.get("plain bundle")
        lines.append(f"| {w} | {lat['fields on']:.4f} | {lat['fields off']:.4f} | "
                     + (f"{plain:.4f} | {lat['fields on'] / plain:.3f} | "
                        f"{(lat['fields on'] - plain) * 1e3:.1f} |" if plain else "- | - | - |"))
    r0 = runs[0]
    if r0["plain_bytes"]:
        lines += ["", f"bundle bytes: {r0['bytes']:,} with uncertainty.bin "
                      f"({r0['uncertainty_bytes']:,} B) vs {r0['plain_bytes']:,} without: "
                      f"{r0['bytes'] / r0['plain_bytes']:.3f}x"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", required=True, choices=["cifar10_dev", "fashion_mnist"])
    ap.add_argument("--bundles", nargs="+", required=True, help="one bundle per seed")
    ap.add_argument("--plain", default=None, help="the first bundle exported --no-uncertainty")
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--ensemble-json", default=None,
                    help="JSON {group: AUROC} of a deep ensemble x3 on the same splits")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    runs = [evaluate(Path(b), a.dataset, Path(a.data), Path(a.plain) if a.plain and i == 0
                     else None, a.calls if i == 0 else 0) for i, b in enumerate(a.bundles)]
    ens = json.loads(Path(a.ensemble_json).read_text()) if a.ensemble_json else None
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(runs, indent=1))
    out.write_text(render(runs, a.dataset, ens, "python benchmarks/uncertainty.py " +
                          " ".join(sys.argv[1:])))
    print(out.read_text())


if __name__ == "__main__":
    main()
