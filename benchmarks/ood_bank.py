"""The bank screen (docs/uncertainty.md, "The bank screen (declared before looking)").

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ood_bank.py \
        --out benchmarks/results/ood_bank_screen.md --work /work/runs/i52/screen

Per bundle (cifar10_dev; Fashion-MNIST seeds 0, 1, 2) and width, features come from the width's
exported float **point slice** (materialised from the bundle's store, its sha256 checked against
the manifest), through the LiteRT interpreter on 1 thread (``exporters.uncertainty.run_outputs``:
logits, penultimate features). The splits are the exporter's (``exporters/export.py``: the
checkpoint's data config through ``trainer.data.load_data``); the OOD groups and their halves
are ``benchmarks.baselines.ood_sets``'s. Banks come from the whole training split only, z-norms
and the 95 % thresholds from validation only; test is the in-distribution side of every AUROC.

The 8 declared configurations (1 and 8 are references, not candidates) and two baselines:

  1. ``knn10@1000``         -(10th largest cosine), 1,000 stratified training rows, 8 bit
  2. ``energy``             -logsumexp(z), T = 1
  3. ``proto1``             -(largest cosine) to the renormalised class means, 8 bit
  4. ``proto4``             ... to 4 spherical-k-means prototypes per class, 8 bit
  5. ``proto16/4b``         ... to 16 per class, 4 bit
  6. ``energy+proto4``      z(energy) + z(proto4)
  7. ``energy+proto16/4b``  z(energy) + z(proto16/4b)
  8. ``energy+knn10@1000``  z(energy) + z(knn10@1000)
  baselines: ``entropy``, ``msp`` at the slice's exported temperature.

Every bank is int8 codes on a per-row grid (``exporters.ood_bank.row_codes``), scored through
``decode_bank`` (what the device holds). ``knn10@1000/127`` (today's ``round(127 u)`` codes) is a
check only. Order of work: the first halves are scored, tabled and saved (the rule's pick)
before any second-half score is computed.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one core: the machine is shared

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge_sdk.answers import metrics as M
from edge_sdk.answers import ood as O
from edge_sdk.answers.uncertainty import decode_bank
from edge_sdk.bundle import width_key
from edge_sdk.bundle.reading import read_manifest
from edge_sdk.store import (
    Store,
    compress_store,
    decode_store,
    encode_store,
    materialize_file,
    pack_bits,
)
from edge_sdk.store.sources import read_store
from exporters.ood_bank import class_prototypes, row_codes
from exporters.uncertainty import bank_rows, run_outputs

DATA = Path("/work/shared/data")
RUNS = (  # (name, dataset, bundle, checkpoint the bundle was exported from)
    ("cifar", "cifar10_dev", "/work/runs/i51/cifar_bundle",
     "/work/runs/i50/cifar-sqs/checkpoint.pt"),
    *((f"fash{s}", "fashion_mnist", f"/work/runs/i50/fash{s}_bundle",
       f"/work/runs/i50/fash{s}-sqs/checkpoint.pt") for s in range(3)))
CONFIGS = ("knn10@1000", "energy", "proto1", "proto4", "proto16/4b", "energy+proto4",
           "energy+proto16/4b", "energy+knn10@1000")
REFERENCES = ("knn10@1000", "energy+knn10@1000")  # 1,000-row banks: references only
BASELINES = ("entropy", "msp")
CHECK = "knn10@1000/127"
BANK = {"knn10@1000": "knn1000", "energy": None, "proto1": "proto1", "proto4": "proto4",
        "proto16/4b": "proto16", "energy+proto4": "proto4", "energy+proto16/4b": "proto16",
        "energy+knn10@1000": "knn1000"}
BUDGET = 1.15  # goal 2: a bundle with uncertainty.bin within 1.15x the bundle without it
REST = 4000  # assumed deflated bytes of uncertainty.bin beyond the banks (quantiles, index)
CLOSE = 0.005  # "within 0.5 pt, the fewer bytes"


def log(*a) -> None:
    print(*a, flush=True)


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ------------------------------------------------------------------------------ features
def _inputs(dataset: str, ckpt_path: str, max_eval) -> tuple[dict, dict]:
    """{set: NHWC inputs} and {set: labels}: the exporter's train / val / test splits of the
    checkpoint's data config, and the OOD groups' first and second halves."""
    import torch

    from benchmarks.baselines import DATASETS, ood_sets
    from trainer import checkpoint as ckpt_io
    from trainer.config import config_from_dict
    from trainer.data import load_data, nhwc_inputs

    torch.set_num_threads(1)
    ckpt = ckpt_io.load_checkpoint(ckpt_path)
    cfg = config_from_dict(ckpt["config"])
    spec = ckpt_io.input_spec(ckpt)
    data = load_data(cfg.data, spec)  # exporters/export.py: the identical splits
    xs, ys = {}, {}
    xs["train"], ys["train"] = nhwc_inputs(data.train)  # the exporter banks from data.train
    xs["val"], ys["val"] = nhwc_inputs(data.val, max_eval)
    xs["test"], ys["test"] = nhwc_inputs(data.test, max_eval)
    first, second = ood_sets(DATASETS[dataset], spec, DATA, lambda ds: ds)
    for tag, halves in (("first", first), ("second", second)):
        for g, ds in halves.items():
            xs[f"{tag}:{g}"] = nhwc_inputs(ds)[0]
    return xs, ys


def features(name: str, dataset: str, bundle: str, ckpt_path: str, cache: Path) -> dict:
    """{width key: {"cid", "T", "acc_manifest", "arrays" (npz dict)}}, cached per width."""
    man = read_manifest(bundle)
    if man.source["checkpoint_sha256"] != sha256(Path(ckpt_path).read_bytes()):
        sys.exit(f"{bundle} was not exported from {ckpt_path} (checkpoint sha256 differs)")
    points = {width_key(c.width): c for c in man.configurations
              if c.scope == "point" and c.id == f"w{width_key(c.width)}-point"}
    for c in points.values():  # the float slice, not -dyn / -int8
        assert c.weights not in ("hybrid", "int8"), c.id
    out, store, xs = {}, None, None
    for wk, c in sorted(points.items()):
        path = cache / f"{name}_w{wk}.npz"
        want = c.files[0].sha256
        if path.exists() and str(np.load(path)["sha256"]) == want:
            arrays = dict(np.load(path))
        else:
            if store is None:
                store = read_store(bundle, man)
                xs, ys = _inputs(dataset, ckpt_path, man.source.get("max_eval"))
            buf = materialize_file(store, man, c, 0)
            if sha256(buf) != want:
                sys.exit(f"{bundle} {c.id}: materialised bytes differ from the manifest's")
            t0 = time.time()
            arrays = {"sha256": np.array(want)}
            for s, x in xs.items():
                outs = run_outputs(buf, x)
                if len(outs) != 2:
                    sys.exit(f"{c.id}: no features output")
                arrays[f"{s}/logits"], arrays[f"{s}/features"] = outs
            for s, y in ys.items():
                arrays[f"{s}/y"] = y
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, **arrays)
            log(f"{name} {c.id}: features of {sum(len(x) for x in xs.values())} inputs in "
                f"{time.time() - t0:.0f} s -> {path}")
        out[wk] = {"cid": c.id, "T": float(c.temperature),
                   "acc_manifest": c.test["calibrated"]["accuracy"], "arrays": arrays}
    return out


# ------------------------------------------------------------------------------ banks, scores
def store_bytes(arrays: dict, index: dict | None = None) -> int:
    """Bytes of a store of ``arrays``, deflated when smaller (as exporters/uncertainty.py)."""
    plain = encode_store(Store(index or {}, arrays))
    return min(len(plain), len(compress_store(plain)))


def _proto_facts(u: np.ndarray, y: np.ndarray, protos: np.ndarray, per: int) -> dict:
    """Collapse checks: the smallest cluster (training rows of a class nearest each of its
    prototypes) and the largest cosine between two prototypes of one class."""
    sizes, close = [], -1.0
    for i, c in enumerate(np.unique(y)):
        p = protos[i * per:(i + 1) * per]
        sizes += np.bincount((u[y == c] @ p.T).argmax(1), minlength=len(p)).tolist()
        g = p @ p.T
        close = max(close, float((g - 2 * np.eye(len(p))).max()))
    return {"min_cluster": int(min(sizes)), "max_cos_within_class": close, "sizes": sizes}


def rest_v2(unc: Store) -> int:
    """Deflated bytes of uncertainty.bin's non-bank part were its quantiles one float32 array
    [keys, methods, alphas] (index version 2) instead of JSON lists: an estimate of what the
    next exporter writes beside the banks (its per-width entries aside)."""
    idx = dict(unc.index)
    table = {**idx.pop("configs", {}), **idx.pop("cascades", {})}
    q = np.array([[[np.inf if v is None else v for v in qs] for qs in ms.values()]
                  for ms in table.values()], np.float32)
    idx["quantile_keys"] = list(table)
    return store_bytes({"quantiles": q}, idx)


def small_prototypes(f: dict, A: dict, bank: str, sizes: list, groups: list,
                     s_test: np.ndarray, col: str, least: int = 5) -> dict | None:
    """Not declared, a diagnosis: prototypes serving fewer than ``least`` training rows (an
    outlier k-means++ seeded), the share of each OOD group's second half whose nearest
    prototype is one of them, and the AUROC with those rows dropped from the codes."""
    small = np.flatnonzero(np.asarray(sizes) < least)
    if not len(small):
        return None
    codes = np.delete(f["codes"][bank], small, axis=0)
    dec = decode_bank(codes)
    t = O.knn_score(A["test/features"], dec, 1)
    out = {"rows": small.tolist(), "sizes": [sizes[i] for i in small], "groups": {}}
    full = f["dec"][bank]
    for g in groups:
        feats = A[f"second:{g}/features"]
        near = (O.l2_normalise(feats) @ full.T).argmax(1)
        out["groups"][g] = {"share_nearest": float(np.isin(near, small).mean()),
                            "auroc": M.ood_auroc(s_test[col], O.knn_score(feats, full, 1)),
                            "auroc_without": M.ood_auroc(t, O.knn_score(feats, dec, 1))}
    return out


def fit(A: dict, T: float) -> dict:
    """Banks (codes and what decode_bank gives), z-norms and facts for one width."""
    u = O.l2_normalise(A["train/features"])
    y = A["train/y"]
    pick = bank_rows(y, 1000, seed=0)
    protos = {"proto1": class_prototypes(u, y, 1),
              "proto4": class_prototypes(u, y, 4, iters=25, seed=0),
              "proto16": class_prototypes(u, y, 16, iters=25, seed=0)}
    codes = {"knn1000": row_codes(u[pick], 8), "proto1": row_codes(protos["proto1"], 8),
             "proto4": row_codes(protos["proto4"], 8), "proto16": row_codes(protos["proto16"], 4),
             # today's exporter grid, for the check only
             "knn1000_127": np.round(u[pick] * 127.0).astype(np.int8)}
    f = {"T": T, "codes": codes, "dec": {k: decode_bank(v) for k, v in codes.items()}}
    f["norms"] = {}
    val = scores(f, A["val/logits"], A["val/features"], fused=False)
    f["norms"] = {k: O.fit_zscore(val[k]) for k in ("energy", "knn10@1000", "proto4",
                                                    "proto16/4b")}
    val = scores(f, A["val/logits"], A["val/features"])
    n = len(A["val/y"])
    f["threshold"] = {k: float(np.sort(s)[math.ceil(0.95 * n) - 1]) for k, s in val.items()}
    f["facts"] = {
        "dim": int(u.shape[1]), "n_train": len(y),
        "dead_columns": int((np.abs(A["train/features"]).max(0) == 0).sum()),
        "zero_rows": {s: int((np.abs(A[f"{s}/features"]).max(1) == 0).sum())
                      for s in ("train", "val", "test")},
        "test_accuracy": float((A["test/logits"].argmax(1) == A["test/y"]).mean()),
        "proto4": _proto_facts(u, y, protos["proto4"], 4),
        "proto16": _proto_facts(u, y, protos["proto16"], 16),
        "proto_rows": {k: len(v) for k, v in protos.items()}}
    return f


def scores(f: dict, z: np.ndarray, feats: np.ndarray, fused: bool = True) -> dict:
    """{score: [N]} of one set's logits and features (higher = more OOD)."""
    d = f["dec"]
    s = {"energy": O.energy_score(z),
         "knn10@1000": O.knn_score(feats, d["knn1000"], 10),
         "proto1": O.knn_score(feats, d["proto1"], 1),
         "proto4": O.knn_score(feats, d["proto4"], 1),
         "proto16/4b": O.knn_score(feats, d["proto16"], 1),
         CHECK: O.knn_score(feats, d["knn1000_127"], 10)}
    p = M.softmax(np.asarray(z, np.float64), temperature=f["T"])
    s["entropy"] = M.predictive_entropy(p[None])
    s["msp"] = -p.max(1)
    if fused:
        nz = f["norms"]
        for c in ("energy+proto4", "energy+proto16/4b", "energy+knn10@1000"):
            parts = c.split("+")
            s[c] = O.fused_score([s[q] for q in parts], [nz[q] for q in parts])
    return s


# ------------------------------------------------------------------------------ tables
ROWS = CONFIGS + BASELINES + (CHECK,)


def fmt_bytes(n: float) -> str:
    return f"{n:,.0f}"


def select(res: dict, runs: list, byte: dict, eligible: dict) -> dict:
    """The declared rule on first-half AUROCs: per data set the mean over its checkpoints of
    the mean over widths and groups, then the mean over data sets; among shippable
    configurations the largest, within 0.5 pt the fewer bytes."""
    per_run = {r: {c: float(np.mean([res[r][wk][c][g] for wk in res[r] for g in res[r][wk][c]]))
                   for c in ROWS} for r in res}
    datasets = sorted({d for _, d, *_ in runs})
    per_ds = {d: {c: float(np.mean([per_run[r][c] for r, dd, *_ in runs if dd == d]))
                  for c in ROWS} for d in datasets}
    overall = {c: float(np.mean([per_ds[d][c] for d in datasets])) for c in ROWS}

    def rule(pool):
        best = max(overall[c] for c in pool)
        close = [c for c in pool if overall[c] >= best - CLOSE]
        return min(close, key=lambda c: (byte[c], -overall[c]))
    pool = [c for c in CONFIGS if c not in REFERENCES and eligible[c]]
    pick = rule(pool)
    runner = rule([c for c in pool if c != pick]) if len(pool) > 1 else None
    return {"per_run": per_run, "per_dataset": per_ds, "overall": overall, "pick": pick,
            "runner_up": runner, "candidates": pool,
            "best_any": max(CONFIGS, key=lambda c: overall[c])}


def bytes_table(B: dict, runs: list) -> list[str]:
    names = [r for r, *_ in runs]
    lines = ["| configuration | bank per width | " + " | ".join(
        f"{r}: banks B (sum over widths) / x with +{REST // 1000} kB" for r in names)
        + " | shippable |", "|---" * (len(names) + 3) + "|"]
    for c in CONFIGS:
        b = BANK[c]
        cells = []
        for r in names:
            n = B[r]["banks"][b]["sum"] if b else 0
            cells.append(f"{fmt_bytes(n)} / {(B[r]['base'] + n + REST) / B[r]['base']:.3f}x")
        ship = "reference" if c in REFERENCES else ("yes" if B["eligible"][c] else "no")
        lines.append(f"| {c} | {B['rows'][c]} | " + " | ".join(cells) + f" | {ship} |")
    lines += ["", ("| bundle | store.bin + manifest.yaml (without uncertainty.bin) | 1.15x budget "
              "for uncertainty.bin | banks' budget (minus the assumed 4 kB) | current "
              "uncertainty.bin | its non-bank part, deflated (v1 index) | the same as a v2 index "
              "(float32 quantiles), estimate |"), "|---" * 7 + "|"]
    for r in names:
        x = B[r]
        lines.append(f"| {r} | {fmt_bytes(x['base'])} | {fmt_bytes((BUDGET - 1) * x['base'])} | "
                     f"{fmt_bytes((BUDGET - 1) * x['base'] - REST)} | {fmt_bytes(x['current'])} "
                     f"| {fmt_bytes(x['current_rest'])} | {fmt_bytes(x['rest_v2'])} |")
    return lines


def first_tables(sel: dict, res: dict, runs: list, B: dict) -> list[str]:
    names = [r for r, *_ in runs]
    ds = list(sel["per_dataset"])
    lines = ["| configuration | " + " | ".join(names) + " | " + " | ".join(
        f"{d} mean" for d in ds) + " | overall | bank bytes (cifar + Fashion mean) | role |",
        "|---" * (len(names) + len(ds) + 4) + "|"]
    for c in ROWS:
        role = ("reference" if c in REFERENCES else "baseline" if c in BASELINES else "check"
                if c == CHECK else "candidate" if c in sel["candidates"] else "over budget")
        mark = (" **(pick)**" if c == sel["pick"] else
                " (runner-up)" if c == sel["runner_up"] else "")
        lines.append(f"| {c}{mark} | " + " | ".join(f"{sel['per_run'][r][c]:.4f}" for r in names)
                     + " | " + " | ".join(f"{sel['per_dataset'][d][c]:.4f}" for d in ds)
                     + f" | {sel['overall'][c]:.4f} | "
                     + (fmt_bytes(B["rule_bytes"][c]) if c in CONFIGS else "-") + f" | {role} |")
    lines += ["", "Per width and group (first halves; Fashion-MNIST: mean over seeds 0, 1, 2):", ""]
    cols = [(r, wk, g) for r in ("cifar", "fash") for wk in res["cifar"]
            for g in (res["cifar"][wk]["energy"] if r == "cifar" else res["fash0"][wk]["energy"])]
    lines += ["| configuration | " + " | ".join(f"{'cifar' if r == 'cifar' else 'fashion'} "
                                                f"w{wk} {g}" for r, wk, g in cols) + " |",
              "|---" * (len(cols) + 1) + "|"]
    for c in ROWS:
        cells = []
        for r, wk, g in cols:
            rs = ["cifar"] if r == "cifar" else [n for n in names if n.startswith("fash")]
            cells.append(f"{np.mean([res[n][wk][c][g] for n in rs]):.3f}")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def second_tables(res2: dict, runs: list, pick: str) -> list[str]:
    names = [r for r, *_ in runs]
    lines = []
    for title, rs in (("cifar10_dev", ["cifar"]),
                      ("Fashion-MNIST (mean over seeds 0, 1, 2)",
                       [n for n in names if n != "cifar"])):
        wks = list(res2[rs[0]])
        groups = list(res2[rs[0]][wks[0]]["energy"])
        cols = [(wk, g) for g in groups for wk in wks]
        lines += [f"#### {title}: AUROC / FPR95 (second halves; test split as in-distribution)",
                  "", "| score | " + " | ".join(f"{g} w{wk}" for wk, g in cols) + " | mean AUROC |",
                  "|---" * (len(cols) + 2) + "|"]
        for c in ROWS:
            cell = [(np.mean([res2[r][wk][c][g]["auroc"] for r in rs]),
                     np.mean([res2[r][wk][c][g]["fpr95"] for r in rs])) for wk, g in cols]
            mark = " **(pick)**" if c == pick else ""
            lines.append(f"| {c}{mark} | " + " | ".join(f"{a:.3f} / {b:.3f}" for a, b in cell)
                         + f" | {np.mean([a for a, _ in cell]):.4f} |")
        lines.append("")
    lines += [(f"#### The pick ({pick}) vs entropy vs knn10@1000, per bundle (second halves: "
              "AUROC / FPR95; share of OOD accepted at the validation 95 % threshold)"), "",
              "| bundle | width | group | " + f"{pick} | entropy | knn10@1000" + " |",
              "|---" * 6 + "|"]
    for r in names:
        for wk in res2[r]:
            for g in res2[r][wk]["energy"]:
                lines.append(f"| {r} | {wk} | {g} | " + " | ".join(
                    f"{x['auroc']:.3f} / {x['fpr95']:.3f} / {x['accepted']:.3f}"
                    for x in (res2[r][wk][c][g] for c in (pick, "entropy", "knn10@1000"))) + " |")
    return lines


def facts_table(F: dict, names: list) -> list[str]:
    lines = [("| bundle | width | dim | dead columns (train) | zero feature rows train/val/test | "
             "test acc (slice / manifest) | proto4 min cluster / max cos | proto16 min cluster /"
             " max cos | val thr knn10@1000/127 vs bundle | bank codes == bundle's |"),
             "|---" * 10 + "|"]
    for r in names:
        for wk, x in F[r].items():
            z = x["zero_rows"]
            lines.append(
                f"| {r} | {wk} | {x['dim']} | {x['dead_columns']} | {z['train']}/{z['val']}/"
                f"{z['test']} | {x['test_accuracy']:.4f} / {x['acc_manifest']:.4f} | "
                f"{x['proto4']['min_cluster']} / {x['proto4']['max_cos_within_class']:.3f} | "
                f"{x['proto16']['min_cluster']} / {x['proto16']['max_cos_within_class']:.3f} | "
                f"{x['threshold_check']:.5f} vs {x['bundle_threshold']:.5f} | "
                f"{x['codes_equal']} |")
    return lines


def write(out: Path, work: Path, command: str, sections: list[list[str]], js: dict) -> None:
    text = "\n".join([f"Command: `{command}`", ""] + [ln for s in sections for ln in s + [""]])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    (work / "screen.json").write_text(json.dumps(js, indent=1))
    print(text, flush=True)


# ------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/ood_bank_screen.md")
    ap.add_argument("--work", default="/work/runs/i52/screen")
    a = ap.parse_args()
    command = ("OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ood_bank.py "
               + " ".join(sys.argv[1:]))
    work, out = Path(a.work), Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs = list(RUNS)
    names = [r for r, *_ in runs]
    fitted, res1, B, facts = {}, {}, {"rows": {}}, {}
    for name, dataset, bundle, ckpt in runs:
        W = features(name, dataset, bundle, ckpt, work / "features")
        unc = decode_store((Path(bundle) / "uncertainty.bin").read_bytes())
        fitted[name], res1[name], facts[name] = {}, {}, {}
        for wk, w in W.items():
            A = w["arrays"]
            f = fit(A, w["T"])
            fitted[name][wk] = (f, A)
            # checks against what the bundle ships: its bank and threshold (knn10, round(127u))
            f["facts"].update(
                acc_manifest=w["acc_manifest"],
                codes_equal=bool(np.array_equal(unc.arrays[f"{wk}/bank"],
                                                f["codes"]["knn1000_127"])),
                threshold_check=f["threshold"][CHECK],
                bundle_threshold=float(unc.index["widths"][wk]["threshold"]))
            facts[name][wk] = f["facts"]
            s_test = scores(f, A["test/logits"], A["test/features"])
            groups = sorted(k[len("first:"):-len("/logits")] for k in A
                            if k.startswith("first:") and k.endswith("/logits"))
            firsts = {g: scores(f, A[f"first:{g}/logits"], A[f"first:{g}/features"])
                      for g in groups}
            res1[name][wk] = {c: {g: M.ood_auroc(s_test[c], firsts[g][c]) for g in groups}
                              for c in ROWS}
            f["test_scores"] = s_test
            log(f"{name} w{wk}: first halves " + ", ".join(
                f"{c} {np.mean(list(res1[name][wk][c].values())):.3f}" for c in ROWS))
        # bytes: each width's bank codes as a deflated store, summed over widths
        bd = Path(bundle)
        base = (bd / "store.bin").stat().st_size + (bd / "manifest.yaml").stat().st_size
        B[name] = {"base": base,
                   "current": (bd / "uncertainty.bin").stat().st_size,
                   "current_rest": store_bytes({k: v for k, v in unc.arrays.items()
                                                if not k.endswith("/bank")}, unc.index),
                   "rest_v2": rest_v2(unc),
                   "banks": {}}
        for b in ("knn1000", "proto1", "proto4", "proto16", "knn1000_127"):
            per = {wk: store_bytes({"bank": fitted[name][wk][0]["codes"][b]}) for wk in W}
            B[name]["banks"][b] = {"per_width": per, "sum": int(sum(per.values())),
                                   "one_store": store_bytes({f"{wk}/bank":
                                                             fitted[name][wk][0]["codes"][b]
                                                             for wk in W}),
                                   "rows": {wk: len(fitted[name][wk][0]["codes"][b]) for wk in W}}
        # an aside: proto16/4b's codes nibble-packed before deflate (not the declared format)
        B[name]["proto16_packed"] = int(sum(store_bytes({"bank": np.frombuffer(pack_bits(
            (fitted[name][wk][0]["codes"]["proto16"].astype(np.int16) + 7).astype(np.uint8), 4),
            np.uint8)}) for wk in W))
    for c in CONFIGS:
        b = BANK[c]
        B["rows"][c] = "none" if b is None else "/".join(
            sorted({str(r) for n in names for r in B[n]["banks"][b]["rows"].values()}))
    B["eligible"] = {c: all(B[n]["base"] + (B[n]["banks"][BANK[c]]["sum"] if BANK[c] else 0) + REST
                            <= BUDGET * B[n]["base"] for n in names) for c in CONFIGS}
    fash = [n for n in names if n != "cifar"]
    B["rule_bytes"] = {c: 0.0 if BANK[c] is None else B["cifar"]["banks"][BANK[c]]["sum"]
                       + float(np.mean([B[n]["banks"][BANK[c]]["sum"] for n in fash]))
                       for c in CONFIGS}
    sel = select(res1, runs, B["rule_bytes"], B["eligible"])
    facts_flat = {n: {wk: facts[n][wk] for wk in facts[n]} for n in names}
    head = [
        "## The bank screen (docs/uncertainty.md): first halves", "",
        ("Features: each width's exported float point slice (materialised from the bundle's store, "
        "sha256 = the manifest's), LiteRT interpreter, 1 thread. Banks from the whole training "
        "split; z-norms and thresholds from validation; AUROC with the test split as "
        "in-distribution against each OOD group's **first half** "
        "(`benchmarks.baselines.ood_sets`). Every bank scored through `decode_bank` of its int8 "
        "codes (`exporters.ood_bank.row_codes`)."),
        "", (f"**Assumption**: the rest of `uncertainty.bin` (index, conformal quantiles) costs "
        f"{REST:,} B deflated; a configuration is shippable when store.bin + manifest.yaml + its "
        f"banks (each width's codes as a deflated store, summed over widths) + {REST:,} B is "
        f"within {BUDGET}x store.bin + manifest.yaml on **every** bundle (cifar10_dev and each "
        "Fashion-MNIST seed). 1 and 8 are references only. \"Fewer bytes\" compares the banks' "
        "bytes of cifar10_dev plus the Fashion-MNIST mean over seeds."), "",
        "### Bytes", ""] + bytes_table(B, runs) + [
        "", ("The current uncertainty.bin's non-bank part was measured with its version-1 index "
        "(quantiles as JSON); the version-2 index stores them as one float32 array (last "
        "column: that index with the same keys, banks and per-width entries aside)."), "",
        "Aside (not a declared format): proto16/4b's codes nibble-packed before deflate: "
        + ", ".join(f"{n} {fmt_bytes(B[n]['proto16_packed'])} B (vs "
                    f"{fmt_bytes(B[n]['banks']['proto16']['sum'])})" for n in names)
        + ". All widths in one store instead of one per width: "
        + "; ".join(f"{n} " + ", ".join(f"{b} {fmt_bytes(B[n]['banks'][b]['one_store'])}"
                                        for b in ("knn1000", "proto1", "proto4", "proto16"))
                    for n in names) + ".", "",
        "### First halves: mean AUROC over widths and groups", ""]
    first = first_tables(sel, res1, runs, B) + [
        "", (f"**The rule picks `{sel['pick']}`** (overall {sel['overall'][sel['pick']]:.4f}); "
        f"runner-up `{sel['runner_up']}` ({sel['overall'][sel['runner_up']]:.4f}). Candidates "
        f"(shippable, not references): {', '.join(sel['candidates'])}. Best of all 8 including "
        f"the references: `{sel['best_any']}` ({sel['overall'][sel['best_any']]:.4f})."), "",
        "### Facts per width", ""] + facts_table(facts_flat, names) + [
        "", ("(dead columns: zero on every training image; min cluster: training rows of a class "
        "nearest a prototype, smallest over prototypes; max cos: largest cosine between two "
        "prototypes of one class; the threshold check is knn10@1000 with round(127 u) codes, "
        "95 % of validation, vs the bundle's uncertainty.bin; codes == bundle's: today's "
        "round(127 u) codes of bank_rows(train_y, 1000, 0) equal the shipped bank)")]
    js = {"command": command, "runs": runs, "configs": CONFIGS, "references": REFERENCES,
          "assumed_rest_bytes": REST, "budget": BUDGET, "bytes": B, "first_auroc": res1,
          "selection": sel, "facts": facts_flat,
          "seconds_first": time.time() - t0}
    write(out, work, command, [head, first], js)  # (b) printed and saved before any second half

    # ---- (c) second halves, only now
    res2, diag = {}, []
    for name, *_ in runs:
        res2[name] = {}
        for wk, (f, A) in fitted[name].items():
            s_test = f["test_scores"]
            groups = sorted(k[len("second:"):-len("/logits")] for k in A
                            if k.startswith("second:") and k.endswith("/logits"))
            for bank, col in (("proto4", "proto4"), ("proto16", "proto16/4b")):
                d = small_prototypes(f, A, bank, f["facts"][bank]["sizes"], groups, s_test, col)
                if d is not None:
                    diag.append((name, wk, col, d))
            res2[name][wk] = {c: {} for c in ROWS}
            for g in groups:
                s = scores(f, A[f"second:{g}/logits"], A[f"second:{g}/features"])
                for c in ROWS:
                    res2[name][wk][c][g] = {
                        "auroc": M.ood_auroc(s_test[c], s[c]),
                        "fpr95": M.ood_fpr_at_tpr(s_test[c], s[c]),
                        "aupr": M.ood_aupr(s_test[c], s[c]),
                        "accepted": float(np.mean(s[c] <= f["threshold"][c])),
                        "test_accepted": float(np.mean(s_test[c] <= f["threshold"][c]))}
    check = max(abs(res2[n][wk][CHECK][g]["auroc"] - res2[n][wk]["knn10@1000"][g]["auroc"])
                for n in names for wk in res2[n] for g in res2[n][wk][CHECK])
    second = ["## Second halves (reported; nothing chosen on them)", ""] + second_tables(
        res2, runs, sel["pick"]) + [
        "", (f"Check: knn10@1000 with today's round(127 u) codes vs per-row 8-bit codes: largest "
        f"second-half AUROC difference {check:.4f}."), "",
        ("Diagnosis (not declared; nothing chosen on it): prototypes that serve fewer than 5 "
        "training rows of their class (an outlier that k-means++'s D^2 seeding picked and Lloyd "
        "kept), the share of each OOD second half nearest to one, and the AUROC with and "
        "without those rows in the bank:"), ""]
    second += [f"- {n} w{wk} {col}: rows {d['rows']} serve {d['sizes']} training rows; "
               + "; ".join(f"{g}: {x['share_nearest']:.3f} nearest, AUROC {x['auroc']:.3f} -> "
                           f"{x['auroc_without']:.3f} without" for g, x in d["groups"].items())
               for n, wk, col, d in diag] or ["- none"]
    js.update(second=res2, small_prototypes=[list(x) for x in diag], seconds=time.time() - t0)
    write(out, work, command, [head, first, second], js)


if __name__ == "__main__":
    main()
