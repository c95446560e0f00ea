"""Issue 33's screen: post-hoc OOD scores per width on a trained checkpoint's penultimate features.

For one checkpoint (torch side: posterior mean, BN re-collected per width exactly as
``benchmarks/baselines.width_logits`` does, on the same 1024-image training calibration subset),
per width, the raw logits and the **penultimate features** (the input of the final linear
classifier) are extracted for the training split (the subset the checkpoint was trained on,
augmentation off), validation, test and both halves of every OOD group. What the penultimate
features are per built-in model:

- ``nested_cnn_small`` (Fashion-MNIST recipe): the hidden dense layer's output (``fc``: linear +
  BN + ReLU, 128 units at full width). The last convolution's features, average-pooled over their
  3x3 map (64 channels), are scored too (rows marked ``conv``; not among the configurations).
- ``nested_allconv`` (cifar10_dev recipe) and every ``nest(...)`` model with global average
  pooling before one linear layer: the pooled last convolution (128 channels at full width), so
  "penultimate" and "pooled last conv" are the same features there.
- ``nested_vgg``: the hidden dense layer's output (or, with ``hidden=0``, the last conv).

Inactive (all-zero on the training split) feature columns of a narrow width are dropped.

Scores (every one grows with "OOD"; ``edge_sdk.answers.ood`` / ``edge_sdk.answers.metrics``, the numpy the device
runs): max-softmax and predictive entropy at the temperature fitted on validation NLL; energy
(T = 1); KNN (cosine, k-th neighbour, bank = L2-normalised training features; bank sizes 1000,
4000 and the whole training subset at k = 1 and 10 in the bank table); Mahalanobis and relative
Mahalanobis (class means + Ledoit-Wolf shared covariance, global Gaussian for the relative
score, all fitted on the training split only); fusions = sums of scores z-normalised with
in-distribution *validation* means and standard deviations. Nothing is fitted on test or OOD data.

Reported (OOD = positive class), per width and OOD group, on the **second half** of each group
against the whole test split: AUROC, FPR at 95 % TPR (share of OOD accepted when 95 % of test
in-distribution images are) and AUPR. Also: the in-distribution threshold fitted on validation
(95 % accepted) and the share of test / OOD images it accepts.

**The 8 configurations** (declared before any OOD number was looked at); the first halves pick
one, by the mean AUROC over widths and groups (per dataset, and across datasets for the bundle
default):

  1. ``entropy``   predictive entropy at T (today's shipped score)
  2. ``msp``       minus max-softmax at T
  3. ``energy``    energy at T = 1
  4. ``knn10``     KNN, k = 10, whole training subset as the bank
  5. ``maha``      Mahalanobis, shared Ledoit-Wolf covariance
  6. ``rmaha``     relative Mahalanobis
  7. ``fuse_ek``   z(energy) + z(knn10)
  8. ``fuse_ekr``  z(energy) + z(knn10) + z(rmaha)

Across datasets (the bundle's default score): each dataset's first-half mean over its full-scale
checkpoints, then the mean over datasets (``--summary``; this aggregation rule was written down
after the first two widths of one run had printed their first-half numbers).

Usage (reads ``../shared/data``; one thread, evaluation only, no training)::

    python benchmarks/ood_scores.py --dataset fashion_mnist \
        --checkpoint runs/screen/fashion/checkpoint.pt --max-train 18000 \
        --out benchmarks/results/ood_scores_fashion_mnist.md
    python benchmarks/ood_scores.py --summary A.json B.json ... --out SUMMARY.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from baselines import DATASETS, DEFAULT_DATA, WIDTHS, _subset, ood_sets  # noqa: E402
from edge_sdk.answers import metrics as M  # noqa: E402
from edge_sdk.answers import conformal as CF  # noqa: E402
from edge_sdk.answers import ood as O  # noqa: E402
from exporters.calibrate import fit_temperature  # noqa: E402
from trainer import checkpoint as ckpt_io  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.data import load_data, subset  # noqa: E402
from trainer.evaluate import batches, recollect_bn  # noqa: E402

ALPHAS = (0.05, 0.1, 0.2)
CONFIGS = ("entropy", "msp", "energy", "knn10", "maha", "rmaha", "fuse_ek", "fuse_ekr")
BANKS = (1000, 4000, None)  # None = the whole training subset


def log(*a) -> None:
    print(*a, flush=True)


def _classifier(model) -> torch.nn.Module:
    """The final linear layer (the last linear module in definition order)."""
    lin = [m for m in model.modules() if "Linear" in type(m).__name__]
    if not lin:
        raise SystemExit(f"{type(model).__name__} has no linear layer")
    return lin[-1]


@torch.no_grad()
def extract(model, sets: dict, width: float) -> dict:
    """{set: (logits [N, C], penultimate [N, D], conv-pooled [N, D'] or None)} at ``width``."""
    cls = _classifier(model)
    conv = getattr(model, "features", None) if hasattr(model, "fc") else None
    grab: dict = {}
    hooks = [cls.register_forward_pre_hook(lambda m, a: grab.__setitem__("pen", a[0].detach()))]
    if conv is not None:
        hooks.append(conv.register_forward_hook(
            lambda m, a, out: grab.__setitem__("conv", out.detach().float().mean((2, 3)))))
    out = {}
    model.eval()
    try:
        with model.width(width, True), model.weight_mode("mean"):
            for name, bs in sets.items():
                lg, pen, cv = [], [], []
                for x, *_ in bs:
                    lg.append(model(x).double())
                    pen.append(grab["pen"].double().flatten(1))
                    if conv is not None:
                        cv.append(grab["conv"].double())
                out[name] = (torch.cat(lg).numpy(), torch.cat(pen).numpy(),
                             torch.cat(cv).numpy() if cv else None)
    finally:
        for h in hooks:
            h.remove()
    return out


def _softmax(z: np.ndarray, T: float) -> np.ndarray:
    return M.softmax(z, -1, T).astype(np.float64)


def scores_of(feats: dict, y_train: np.ndarray, y_val: np.ndarray, num_classes: int,
              rng: np.random.Generator) -> tuple[dict, dict]:
    """{score: {set: [N]}} for every score, and facts (T, dims, shrinkage, bytes)."""
    z_val = feats["val"][0]
    T = fit_temperature(z_val[None], y_val)
    facts = {"T": T}
    S: dict = {}

    def put(name, fn):  # every set but the training split (the statistics' own data)
        S[name] = {k: fn(k) for k in feats if k != "train"}

    put("entropy", lambda k: M.predictive_entropy(_softmax(feats[k][0], T)[None]))
    put("msp", lambda k: -_softmax(feats[k][0], T).max(-1))
    put("energy", lambda k: O.energy_score(feats[k][0]))
    for tag, idx in (("", 1), ("conv_", 2)):
        if feats["train"][idx] is None:
            continue
        ftr = feats["train"][idx]
        keep = np.flatnonzero(np.abs(ftr).max(0) > 0)  # a narrow width's inactive columns
        F = {k: v[idx][:, keep] for k, v in feats.items()}
        facts[f"{tag}dim"] = len(keep)
        bank = O.l2_normalise(F["train"])
        order = rng.permutation(len(bank))
        for size in BANKS:
            b = bank if size is None else bank[np.sort(order[:size])]
            for k in (1, 10):
                name = f"{tag}knn{k}" + ("" if size is None else f"@{size}")
                put(name, lambda s, b=b, k=k: O.knn_score(F[s], b, k))
        g = O.fit_gaussian(F["train"], y_train, num_classes)
        put(f"{tag}maha", lambda s: O.mahalanobis_score(F[s], g))
        put(f"{tag}rmaha", lambda s: O.relative_mahalanobis_score(F[s], g))
        d = len(keep)
        facts[f"{tag}bytes_knn_full_f16"] = bank.size * 2
        facts[f"{tag}bytes_gauss_f32"] = (num_classes * d + d + 2 * d * d) * 4
    norms = {n: O.fit_zscore(S[n]["val"]) for n in ("energy", "knn10", "rmaha")}
    for name, parts in (("fuse_ek", ("energy", "knn10")), ("fuse_ekr", ("energy", "knn10", "rmaha"))):
        put(name, lambda k, parts=parts: O.fused_score([S[p][k] for p in parts],
                                                       [norms[p] for p in parts]))
    return S, facts


def conformal_rows(p_val, y_val, p_test, y_test, variants=None) -> dict:
    """{method: {alpha: (test coverage, mean set size, worst class coverage, 95 % interval)}}:
    split conformal calibrated on validation (the temperature is fitted on that split too).
    ``variants``: {name: (method, randomised)}; default the deterministic three."""
    out = {}
    n = len(y_test)
    variants = variants or {m: (m, False) for m in CF.METHODS}
    for name, (method, randomised) in variants.items():
        out[name] = {}
        for a in ALPHAS:
            rng = np.random.default_rng(0) if randomised else None
            q = CF.calibrate(p_val, y_val, a, method, rng=rng)
            sets = CF.prediction_sets(p_test, q, method, rng=rng)
            hit = sets[np.arange(n), y_test]
            lo, hi = (1 - a) - 1.96 * np.sqrt(a * (1 - a) / n), (1 - a) + 1.96 * np.sqrt(a * (1 - a) / n)
            out[name][str(a)] = dict(coverage=float(hit.mean()), size=float(sets.sum(1).mean()),
                                       class_min=float(min(hit[y_test == c].mean() for c in np.unique(y_test))),
                                       inside=bool(lo <= hit.mean() <= hi))
    return out


def evaluate(S: dict, groups: list[str], val_thr_q: float = 0.95) -> dict:
    """{score: {group: {select_auroc, auroc, fpr95, aupr, id_accept, ood_accept}}}."""
    res = {}
    for name, s in S.items():
        thr = np.sort(s["val"])[int(np.ceil(val_thr_q * len(s["val"]))) - 1]
        r = {}
        for g in groups:
            out = s[f"ood:{g}"]
            r[g] = {"select_auroc": M.ood_auroc(s["test"], s[f"select:{g}"]),
                    "auroc": M.ood_auroc(s["test"], out),
                    "fpr95": M.ood_fpr_at_tpr(s["test"], out),
                    "aupr": M.ood_aupr(s["test"], out),
                    "id_accept": float(np.mean(s["test"] <= thr)),
                    "ood_accept": float(np.mean(out <= thr))}
        res[name] = r
    return res


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def report(run: dict) -> str:
    groups, widths, res = run["groups"], run["widths"], run["results"]
    lines = [f"### {run['dataset']}: `{run['checkpoint']}`", "",
             f"model {run['model']}; {run['n_train']} training images (features, statistics), "
             f"{run['n_val']} validation, {run['n_test']} test; OOD reported on second halves: "
             + ", ".join(f"{g} {run['n_ood'][g]}" for g in groups)
             + f"; {run['seconds']:.0f} s on {torch.get_num_threads()} thread(s)", ""]
    lines += ["| width | accuracy | NLL +TS | T | feature dim | " + " | ".join(
        f"first-half mean AUROC: {c}" for c in ("entropy", "energy", "knn10", "rmaha")) + " |",
              "|---" * 9 + "|"]
    for w in widths:
        r, f = res[str(w)], run["facts"][str(w)]
        sel = lambda c: np.mean([r[c][g]["select_auroc"] for g in groups])  # noqa: E731
        lines.append(f"| {w:.2f} | {f['accuracy']:.4f} | {f['nll']:.4f} | {f['T']:.2f} | {f['dim']} | "
                     + " | ".join(f"{sel(c):.3f}" for c in ("entropy", "energy", "knn10", "rmaha")) + " |")
    lines += ["", "**Selection (first halves, mean AUROC over widths and groups), the 8 declared "
              "configurations:** " + ", ".join(f"{c} {run['select'][c]:.4f}" for c in CONFIGS)
              + f" -> picked **{run['picked']}**", ""]
    # the main table: every score, second halves
    names = [n for n in res[str(widths[0])]]
    for g in groups:
        lines += [f"#### {g}: AUROC / FPR95 / AUPR (second half; test split as in-distribution)", "",
                  "| score | " + " | ".join(f"w {w:.2f}" for w in widths) + " | mean AUROC |",
                  "|---" * (len(widths) + 2) + "|"]
        for n in names:
            cells = [res[str(w)][n][g] for w in widths]
            mark = " (cfg)" if n in CONFIGS else ""
            lines.append(f"| {n}{mark} | " + " | ".join(
                f"{c['auroc']:.3f} / {c['fpr95']:.3f} / {c['aupr']:.3f}" for c in cells)
                + f" | {np.mean([c['auroc'] for c in cells]):.3f} |")
        lines.append("")
    p = run["picked"]
    lines += [f"#### the picked score ({p}) with its validation threshold (accepts 95 % of "
              "validation): share of test / OOD (second half) accepted", "",
              "| width | test accepted | " + " | ".join(f"{g} accepted" for g in groups) + " |",
              "|---" * (len(groups) + 2) + "|"]
    for w in widths:
        r = res[str(w)][p]
        lines.append(f"| {w:.2f} | {r[groups[0]]['id_accept']:.3f} | "
                     + " | ".join(f"{r[g]['ood_accept']:.3f}" for g in groups) + " |")
    lines += ["", "#### split-conformal sets (calibrated on validation at T; test split): coverage / "
              "mean set size / worst class coverage; * = outside the binomial 95 % interval around 1 - alpha",
              "", "| method | alpha | " + " | ".join(f"w {w:.2f}" for w in widths) + " |",
              "|---" * (len(widths) + 2) + "|"]
    for m in CF.METHODS:
        for a in ALPHAS:
            cells = [run["facts"][str(w)]["conformal"][m][str(a)] for w in widths]
            lines.append(f"| {m} | {a} | " + " | ".join(
                f"{c['coverage']:.3f}{'' if c['inside'] else '*'} / {c['size']:.2f} / {c['class_min']:.3f}"
                for c in cells) + " |")
    lines += ["", "statistics per width (bytes): " + "; ".join(
        f"w {w:.2f}: KNN bank (whole; at float16, a quality not measured here) "
        f"{run['facts'][str(w)]['bytes_knn_full_f16']:,}, "
        f"Gaussian (float32) {run['facts'][str(w)]['bytes_gauss_f32']:,}" for w in widths), ""]
    return "\n".join(lines)


# the references (benchmarks/results/baselines_samerun_final.md, _fashion_mnist_3seeds.md)
ENSEMBLE = {"cifar10_dev": {"far": 0.802, "near": 0.824}, "fashion_mnist": {"notmnist": 0.918}}


def summary(paths: list[str], out: Path) -> None:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    by_ds: dict = {}
    for r in runs:
        by_ds.setdefault(r["dataset"], []).append(r["select"])
    per_ds = {d: {c: float(np.mean([s[c] for s in ss])) for c in CONFIGS} for d, ss in by_ds.items()}
    overall = {c: float(np.mean([per_ds[d][c] for d in per_ds])) for c in CONFIGS}
    pick = max(overall, key=overall.get)
    lines = ["Command: `python benchmarks/ood_scores.py --summary " + " ".join(paths) + "`", "",
             "First halves, mean AUROC over widths and groups (the 8 declared configurations):", "",
             "| configuration | " + " | ".join(per_ds) + " | mean |", "|---" * (len(per_ds) + 2) + "|"]
    for c in CONFIGS:
        lines.append(f"| {c} | " + " | ".join(f"{per_ds[d][c]:.4f}" for d in per_ds)
                     + f" | {overall[c]:.4f} |")
    lines += ["", f"Picked across datasets: **{pick}**; per dataset: "
              + ", ".join(f"{d} {max(v, key=v.get)}" for d, v in per_ds.items()), ""]
    for r in runs:
        ens = ENSEMBLE.get(r["dataset"], {})
        g = r["groups"]
        lines += [f"#### {r['dataset']} `{r['checkpoint']}` (second halves; AUROC / FPR95 / AUPR)", "",
                  "| width | accuracy | " + " | ".join(
                      f"{x} {grp}" for grp in g for x in ("entropy", pick, "ensemble x3 AUROC")) + " |",
                  "|---" * (2 + 3 * len(g)) + "|"]
        for w in r["widths"]:
            res = r["results"][str(w)]
            cell = lambda c, grp: (f"{res[c][grp]['auroc']:.3f} / {res[c][grp]['fpr95']:.3f} / "  # noqa: E731
                                   f"{res[c][grp]['aupr']:.3f}")
            lines.append(f"| {w:.2f} | {r['facts'][str(w)]['accuracy']:.4f} | " + " | ".join(
                f"{cell('entropy', grp)} | {cell(pick, grp)} | {ens.get(grp, float('nan')):.3f}"
                for grp in g) + " |")
        lines.append("")
    _atomic_write(out, "\n".join(lines) + "\n")
    print("\n".join(lines))


def cost(run_json: str, out: Path, calls: int = 3000, bundle: str | None = None) -> None:
    """Median host time of scoring ONE input (numpy, this process's single thread) per width at
    the run's feature sizes: what the runtime would add to ``predict`` (no slice involved).
    ``bundle``: also the median ``predict`` of its point configurations (1 thread, uint8 or
    float input as the bundle declares), in the same process, for the ratio."""
    r = json.loads(Path(run_json).read_text())
    slice_us = {}
    if bundle:
        import edge_sdk

        rt = edge_sdk.load(bundle, profile=None, threads=1)
        dtype = np.uint8 if "uint8" in str(rt.manifest.input.dtype) else np.float32
        x = np.random.default_rng(0).integers(0, 256, tuple(rt.manifest.input.shape[1:])).astype(dtype)
        for c in rt.manifest.configurations:
            if c.scope != "point":
                continue
            for _ in range(50):
                rt.predict(x, config_id=c.id)
            t = []
            for _ in range(calls):
                t0 = time.perf_counter()
                rt.predict(x, config_id=c.id)
                t.append(time.perf_counter() - t0)
            slice_us[float(c.width)] = 1e6 * float(np.median(t))
    rng = np.random.default_rng(0)
    C = 10
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ)
    lines = [f"Command: `{env} python benchmarks/ood_scores.py {' '.join(sys.argv[1:])}`", "",
             f"{r['dataset']}: median us per single-input score over {calls} calls (host, 1 thread, "
             "shared machine: ratios in one run, not absolute figures)", "",
             "| width | dim | energy | maha | rmaha | knn10 bank 1000 | knn10 bank 4000 | "
             f"knn10 bank {r['n_train']} | fuse_ek (full bank) | predict (point slice) |", "|---" * 10 + "|"]
    for w in r["widths"]:
        d = r["facts"][str(w)]["dim"]
        feats = rng.normal(size=(r["n_train"], d))
        g = O.fit_gaussian(feats, rng.integers(0, C, len(feats)), C)
        banks = {n: O.l2_normalise(feats[:n]).astype(np.float32) for n in (1000, 4000, r["n_train"])}
        x, z = rng.normal(size=(1, d)), rng.normal(size=(1, C))

        def med(fn):
            t = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                t.append(time.perf_counter() - t0)
            return 1e6 * float(np.median(t))
        norms = [(0.0, 1.0), (0.0, 1.0)]
        cells = [med(lambda: O.energy_score(z)), med(lambda: O.mahalanobis_score(x, g)),
                 med(lambda: O.relative_mahalanobis_score(x, g))]
        cells += [med(lambda b=b: O.knn_score(x, b, 10)) for b in banks.values()]
        cells.append(med(lambda: O.fused_score([O.energy_score(z), O.knn_score(x, banks[r["n_train"]], 10)], norms)))
        cells.append(slice_us.get(float(w), float("nan")))
        lines.append(f"| {w:.2f} | {d} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    _atomic_write(out, "\n".join(lines) + "\n")
    print("\n".join(lines))


def conformal_only(args, cfg, data, train_ds, state) -> None:
    sets = {"val": batches(data.val), "test": batches(data.test)}
    y = {k: np.concatenate([b[1].numpy() for b in sets[k]]) for k in sets}
    calib = batches(train_ds, min(cfg.data.calib_samples, len(train_ds)), cfg.seed, batch=256)
    model = ckpt_io.model_from_checkpoint(state)
    variants = {"lac": ("lac", False), "aps": ("aps", False), "aps rand": ("aps", True),
                "raps rand": ("raps", True)}
    widths = [float(w) for w in args.widths.split(",")]
    rows = {}
    for w in widths:
        recollect_bn(model, calib, w)
        f = extract(model, sets, w)
        zv, zt = f["val"][0], f["test"][0]
        T = fit_temperature(zv[None], y["val"])
        pv, pt = (M.softmax(z, -1, T).astype(np.float64) for z in (zv, zt))
        r = conformal_rows(pv, y["val"], pt, y["test"], variants)
        even, odd = np.arange(0, len(zv), 2), np.arange(1, len(zv), 2)
        T2 = fit_temperature(zv[even][None], y["val"][even])
        r["lac (T even / q odd)"] = conformal_rows(M.softmax(zv[odd], -1, T2).astype(np.float64),
                                                  y["val"][odd], M.softmax(zt, -1, T2).astype(np.float64),
                                                  y["test"], {"lac": ("lac", False)})["lac"]
        rows[str(w)] = dict(conformal=r, val_acc=M.accuracy(pv, y["val"]), test_acc=M.accuracy(pt, y["test"]), T=T)
        log(f"width {w}: val acc {rows[str(w)]['val_acc']:.4f}, test acc {rows[str(w)]['test_acc']:.4f}")
    lines = [f"Command: `python benchmarks/ood_scores.py {' '.join(sys.argv[1:])}`", "",
             f"### {args.dataset} `{args.checkpoint}`: split-conformal sets, calibrated on validation "
             f"({len(y['val'])}), measured on test ({len(y['test'])})", "",
             "accuracy validation / test: " + ", ".join(
                 f"w {w:.2f} {rows[str(w)]['val_acc']:.4f} / {rows[str(w)]['test_acc']:.4f}" for w in widths), "",
             "coverage / mean set size / worst class coverage; * = outside the binomial 95 % interval "
             "around 1 - alpha (test sampling only; the calibration draw adds about as much again)", "",
             "| method | alpha | " + " | ".join(f"w {w:.2f}" for w in widths) + " |",
             "|---" * (len(widths) + 2) + "|"]
    for name in rows[str(widths[0])]["conformal"]:
        for a in ALPHAS:
            cells = [rows[str(w)]["conformal"][name][str(a)] for w in widths]
            lines.append(f"| {name} | {a} | " + " | ".join(
                f"{c['coverage']:.3f}{'' if c['inside'] else '*'} / {c['size']:.2f} / {c['class_min']:.3f}"
                for c in cells) + " |")
    out = Path(args.out)
    _atomic_write(out.with_suffix(".json"), json.dumps(rows, indent=1))
    _atomic_write(out, "\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--cost":
        cost(sys.argv[2], Path(sys.argv[sys.argv.index("--out") + 1]),
             bundle=sys.argv[sys.argv.index("--bundle") + 1] if "--bundle" in sys.argv else None)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--report":  # re-render a run's markdown
        run = json.loads(Path(sys.argv[2]).read_text())
        _atomic_write(Path(sys.argv[3]), run.get("command", "") + report(run) + "\n")
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--summary":
        ap = argparse.ArgumentParser()
        ap.add_argument("--summary", nargs="+", required=True)
        ap.add_argument("--out", required=True)
        a = ap.parse_args()
        summary(a.summary, Path(a.out))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", required=True, choices=sorted(DATASETS))
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--max-train", type=int, default=None,
                    help="the training subset the checkpoint was trained on (baselines._subset)")
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    ap.add_argument("--out", required=True, help="markdown file (a .json beside it)")
    ap.add_argument("--conformal-only", action="store_true",
                    help="only the conformal sets (validation + test logits): deterministic and "
                         "randomised APS / RAPS, and LAC with T fitted on even validation images and "
                         "the quantile on odd ones")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    setting = DATASETS[args.dataset]
    data_dir = Path(args.data)
    if not (data_dir / f"{args.dataset}.npz").exists():
        sys.exit(f"{data_dir / (args.dataset + '.npz')} is missing (see ../shared/data/README.md)")
    state = ckpt_io.load_checkpoint(args.checkpoint)
    cfg = load_config(setting.config, [f"name={args.dataset}",
                                       f"data.source=npz:{data_dir / (args.dataset + '.npz')}",
                                       *setting.overrides])
    if cfg.data.split_seed != state["split_seed"]:
        sys.exit(f"split seed {cfg.data.split_seed} != the checkpoint's {state['split_seed']}")
    data = load_data(cfg.data)
    train_ds = _subset(data.train, args.max_train)
    select, rep = ood_sets(setting, data.spec, data_dir, lambda ds: ds)
    groups = sorted(rep)
    if args.conformal_only:
        return conformal_only(args, cfg, data, train_ds, state)
    sets = {"train": batches(subset(train_ds, np.arange(len(train_ds)), augment="none")),
            "val": batches(data.val), "test": batches(data.test),
            **{f"ood:{g}": batches(ds) for g, ds in rep.items()},
            **{f"select:{g}": batches(ds) for g, ds in select.items()}}
    y = {k: np.concatenate([b[1].numpy() for b in sets[k]]) for k in ("train", "val", "test")}
    calib = batches(train_ds, min(cfg.data.calib_samples, len(train_ds)), cfg.seed, batch=256)
    model = ckpt_io.model_from_checkpoint(state)
    widths = [float(w) for w in args.widths.split(",")]
    results, facts = {}, {}
    for w in widths:
        tw = time.time()
        recollect_bn(model, calib, w)
        feats = extract(model, sets, w)
        S, f = scores_of(feats, y["train"], y["val"], data.num_classes, np.random.default_rng(0))
        p = M.softmax(feats["test"][0], -1, f["T"]).astype(np.float64)
        f.update(accuracy=M.accuracy(p, y["test"]), nll=M.nll(p, y["test"]))
        f["conformal"] = conformal_rows(M.softmax(feats["val"][0], -1, f["T"]).astype(np.float64),
                                        y["val"], p, y["test"])
        results[str(w)], facts[str(w)] = evaluate(S, groups), f
        log(f"width {w}: acc {f['accuracy']:.4f}, dim {f['dim']}, {time.time() - tw:.0f} s; "
            + ", ".join(f"{c} {np.mean([results[str(w)][c][g]['select_auroc'] for g in groups]):.3f}"
                        for c in CONFIGS))
    select_mean = {c: float(np.mean([results[str(w)][c][g]["select_auroc"]
                                     for w in widths for g in groups])) for c in CONFIGS}
    run = {"dataset": args.dataset, "checkpoint": args.checkpoint, "model": cfg.model.name
           if state.get("config") is None else state["config"]["model"]["name"],
           "n_train": len(y["train"]), "n_val": len(y["val"]), "n_test": len(y["test"]),
           "n_ood": {g: len(ds) for g, ds in rep.items()}, "groups": groups, "widths": widths,
           "results": results, "facts": facts, "select": select_mean,
           "picked": max(select_mean, key=select_mean.get), "seconds": time.time() - t0,
           "command": f"Command: `python benchmarks/ood_scores.py {' '.join(sys.argv[1:])}`\n\n"}
    out = Path(args.out)
    text = report(run)
    _atomic_write(out.with_suffix(".json"), json.dumps(run, indent=1))
    _atomic_write(out, run["command"] + text + "\n")
    print(text)


if __name__ == "__main__":
    main()
