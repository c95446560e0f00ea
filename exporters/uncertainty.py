"""Fit a bundle's ``uncertainty.bin``: the out-of-distribution score's statistics and
the conformal quantiles, from in-distribution data only, through the exported slices.

Per width, through that width's exported point slice (its second output, the features):

- the bank: ``per_class`` class-balanced spherical-k-means prototypes of the L2-normalised
  features of the whole *training* split (never validation, test or OOD data;
  :func:`exporters.ood_bank.class_prototypes`), stored as int8 codes on a ``bits``-bit grid per
  row (:func:`exporters.ood_bank.row_codes`); the score is minus the cosine to the nearest
  prototype (``knn``, k = 1), or that z-normalised and added to the z-normalised energy
  (``energy+knn``; the z-statistics from *validation* scores). Which, and the bank's size:
  the screen of docs/uncertainty.md ("The bank screen"), on the first halves of the OOD sets;
- the threshold: the score below which 95 % of the *validation* images fall, computed by the
  very graph the runtime appends (:mod:`edge_sdk.answers.ood_graph`), through the interpreter.

Per configuration: split-conformal quantiles of its calibrated validation probabilities for
LAC, APS and RAPS at every alpha of :data:`edge_sdk.answers.uncertainty.ALPHAS`; per two-stage
cascade plan, the same for the plan's composite answer (the first configuration's
probabilities where it is confident enough, the second's elsewhere), so a cascade's sets are
calibrated for what the cascade answers. One float16 array (rounded up: sets only grow).

The test split and an OOD set (when the export has one) only *measure*: per point
configuration the share of test images accepted, the OOD AUROC / FPR95 / AUPR of the score,
and the conformal coverage, mean set size and worst class coverage at alpha 0.05, 0.1, 0.2
(``source.uncertainty`` in the manifest; ``edge-sdk report`` prints them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from edge_sdk.answers import metrics as M
from edge_sdk.answers.conformal import METHODS, add_top, calibrate, class_scores
from edge_sdk.errors import ConfigError
from edge_sdk.answers.graph import runtime_graph
from edge_sdk.answers.ood import energy_score, l2_normalise
from edge_sdk.answers.ood_graph import OodGraph
from edge_sdk.store import Store, compress_store, encode_store
from edge_sdk.answers.uncertainty import (ALPHAS, INDEX_VERSION, SCORES, cascade_key, decode_bank,
                                          fuse_weights, quantile_array)
from exporters.ood_bank import class_prototypes, row_codes

__all__ = ["OodBank", "REPORT_ALPHAS", "bank_rows", "fit_uncertainty", "run_outputs"]

REPORT_ALPHAS = (0.05, 0.1, 0.2)
RAPS = {"lam": 0.01, "k_reg": 5}  # Angelopoulos et al. 2021's defaults for ten-ish classes


@dataclass(frozen=True)
class OodBank:
    """The shipped score and bank (docs/uncertainty.md, "The bank screen")."""

    score: str = "knn"  # "knn": -(nearest prototype's cosine); "energy+knn": fused with energy
    per_class: int = 4  # prototypes per class
    bits: int = 8  # each row's grid: 2**(bits-1) - 1 levels either side of 0


def run_outputs(model: bytes, xs: np.ndarray, batch: int = 256) -> tuple[np.ndarray, ...]:
    """Every output of a slice (logits first, then the features) on NHWC inputs ``xs``, one
    batched invoke per ``batch`` samples (the slices' batch dimension is resizable)."""
    it = Interpreter(model_content=model, num_threads=1)
    inp = it.get_input_details()[0]["index"]
    outs = [d["index"] for d in it.get_output_details()]
    xs = np.asarray(xs, np.float32)
    parts: list[list[np.ndarray]] = [[] for _ in outs]
    size = None
    for i in range(0, len(xs), batch):
        chunk = xs[i:i + batch]
        if len(chunk) != size:
            it.resize_tensor_input(inp, list(chunk.shape))
            it.allocate_tensors()
            size = len(chunk)
        it.set_tensor(inp, chunk)
        it.invoke()
        for j, o in enumerate(outs):
            parts[j].append(it.get_tensor(o).reshape(len(chunk), -1).copy())
    return tuple(np.concatenate(p) for p in parts)


def bank_rows(labels: np.ndarray, rows: int, seed: int) -> np.ndarray:
    """``rows`` indices of ``labels``, stratified by class (each class its share, rounded,
    at least one), in a seeded random order; all of them when ``rows`` >= their number."""
    labels = np.asarray(labels)
    if rows >= len(labels):
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    want = np.maximum(1, np.floor(counts / counts.sum() * rows).astype(int))
    # hand the remainder to the largest classes, so the total is exactly ``rows``
    for i in np.argsort(-counts)[: max(rows - int(want.sum()), 0)]:
        want[i] += 1
    picked = [rng.choice(np.flatnonzero(labels == c), min(n, cnt), replace=False)
              for c, n, cnt in zip(classes, want, counts)]
    return np.sort(np.concatenate(picked))[:rows]


def _quantiles(probs: np.ndarray, labels: np.ndarray) -> dict[str, list[float | None]]:
    """qhat per method and alpha of the grid (None: beyond the calibration set, every class)."""
    out = {}
    for m in METHODS:
        qs = [calibrate(probs, labels, a, m, RAPS["lam"], RAPS["k_reg"]) for a in ALPHAS]
        out[m] = [None if math.isinf(q) else float(q) for q in qs]
    return out


def _coverage(probs: np.ndarray, labels: np.ndarray, q: float | None, method: str) -> dict:
    q = math.inf if q is None else q
    mask = class_scores(probs, method, RAPS["lam"], RAPS["k_reg"]) <= q
    add_top(mask, probs.argmax(1))  # the non-empty rule, as the runtime's sets
    hit = mask[np.arange(len(labels)), labels]
    per_class = [float(hit[labels == c].mean()) for c in np.unique(labels)]
    return {"coverage": float(f"{hit.mean():.4g}"), "mean_size": float(f"{mask.sum(1).mean():.4g}"),
            "worst_class": float(f"{min(per_class):.4g}")}


def _scores(buf: bytes, spec: OodGraph, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(logits, OOD scores) of ``xs`` through ``buf`` with the runtime's score ops appended:
    the scores the device computes, from the interpreter itself."""
    outs = run_outputs(runtime_graph(buf, None, None, ood=spec), xs)
    if len(outs) != 3:
        raise ConfigError("the slice could not take the OOD score's ops (features output?)")
    return outs[0], outs[2][:, 0]


def fit_uncertainty(records: Sequence[dict], val_probs: Mapping[str, np.ndarray],
                    points: Mapping[str, tuple[str, bytes]], train: tuple[np.ndarray, np.ndarray],
                    ev, *, bank: OodBank = OodBank(), accept: float = 0.95,
                    seed: int = 0, log=print) -> tuple[bytes, dict]:
    """``uncertainty.bin``'s bytes and the measured figures for ``source.uncertainty``.

    ``records``: the configuration records (after the cascade plans are fitted);
    ``val_probs``: their calibrated validation probabilities; ``points``: per width key the
    point configuration's id and the bytes of its slice (with the features output);
    ``train``: (NHWC inputs, labels) of the training split; ``ev``:
    :class:`exporters.configs.EvalSets`."""
    if bank.score not in SCORES or not isinstance(bank.per_class, int) or bank.per_class < 1 \
            or not isinstance(bank.bits, int) or not 2 <= bank.bits <= 8:
        raise ConfigError(f"the OOD bank needs a score in {SCORES}, per_class >= 1 and bits in "
                          f"2..8, got {bank}")
    if not points:
        raise ConfigError("uncertainty statistics need the point scope (its slices' features)")
    train_x, train_y = train
    index: dict = {"version": INDEX_VERSION, "score": bank.score, "k": 1, "accept": accept,
                   "alphas": list(ALPHAS), "raps": dict(RAPS),
                   "bank": {"from": "training split", "prototypes_per_class": bank.per_class,
                            "bits": bank.bits},
                   "widths": {}}
    arrays: dict[str, np.ndarray] = {}
    report: dict = {"score": bank.score, "prototypes_per_class": bank.per_class,
                    "bits": bank.bits, "accept": accept, "widths": {}}
    by_id = {r["id"]: r for r in records}
    for wk, (cid, buf) in points.items():
        outs = run_outputs(buf, train_x)
        if len(outs) != 2:
            raise ConfigError(f"{cid}: the slice has no features output (export it with "
                              f"features=True)")
        protos = class_prototypes(l2_normalise(outs[1]), train_y, bank.per_class, seed=seed)
        codes = row_codes(protos, bank.bits)
        arrays[f"{wk}/bank"] = codes
        spec = OodGraph(decode_bank(codes))
        entry: dict = {"dim": int(codes.shape[1]), "rows": int(codes.shape[0])}
        if bank.score == "energy+knn":  # z-statistics of validation scores
            val_logits, k = _scores(buf, spec, ev.val_x)  # the knn part, as the graph has it
            e = energy_score(val_logits)
            entry["fuse"] = {"energy": [float(e.mean()), float(e.std())],
                             "knn": [float(k.mean()), float(k.std())]}
            spec = OodGraph(spec.bank, fuse_weights(tuple(entry["fuse"]["energy"]),
                                                    tuple(entry["fuse"]["knn"])))
        # the threshold from the very scores the device computes (the appended graph)
        _, s_val = _scores(buf, spec, ev.val_x)
        n = len(s_val)
        threshold = float(np.sort(s_val)[min(math.ceil(accept * n), n) - 1])
        entry["threshold"] = threshold
        index["widths"][wk] = entry
        test_logits, s_test = _scores(buf, spec, ev.test_x)
        t = by_id[cid]["temperature"]
        test_p = M.softmax(test_logits.astype(np.float64), temperature=t)
        row: dict = {"config": cid, "dim": int(codes.shape[1]), "rows": int(codes.shape[0]),
                     "threshold": threshold, "bank_bytes": int(codes.nbytes),
                     "test_accepted": float(f"{(s_test <= threshold).mean():.4g}")}
        if ev.ood_x is not None:
            _, s_ood = _scores(buf, spec, ev.ood_x)
            row["ood"] = {"auroc": float(f"{M.ood_auroc(s_test, s_ood):.4g}"),
                          "fpr95": float(f"{M.ood_fpr_at_tpr(s_test, s_ood):.4g}"),
                          "aupr": float(f"{M.ood_aupr(s_test, s_ood):.4g}"),
                          "accepted": float(f"{(s_ood <= threshold).mean():.4g}")}
        q = _quantiles(val_probs[cid], ev.val_y)
        row["conformal"] = {f"{m}@{a:g}": _coverage(test_p, ev.test_y,
                                                    q[m][ALPHAS.index(a)], m)
                            for m in ("lac",) for a in REPORT_ALPHAS}
        report["widths"][wk] = row
        log(f"uncertainty w{wk}: {bank.score} over {codes.shape[0]} x {codes.shape[1]} "
            f"({bank.bits}-bit), threshold {threshold:.4f}, test accepted "
            f"{row['test_accepted']:.3f}"
            + (f", OOD AUROC {row['ood']['auroc']:.3f}" if "ood" in row else ""))
    table: dict[str, dict] = {}
    for r in records:
        table[r["id"]] = _quantiles(val_probs[r["id"]], ev.val_y)
        for wider, plan in r.get("cascade", {}).items():
            p1, p2 = val_probs[r["id"]], val_probs[wider]
            # the plan's own threshold, and each target accuracy's (the mixture differs)
            for key, thr in [(cascade_key(r["id"], wider), plan.get("threshold"))] + [
                    (cascade_key(r["id"], wider, t), e["threshold"])
                    # (a target planned at the plan's own threshold is not listed: the
                    # runtime falls back to the plan's quantiles)
                    for t, e in plan.get("targets", {}).items()]:
                if thr is None:
                    continue
                mixed = np.where((p1.max(1) >= thr)[:, None], p1, p2)
                table[key] = _quantiles(mixed, ev.val_y)
    index["quantile_keys"], arrays["quantiles"] = quantile_array(table)
    # deflated (the container's version 2) when smaller, as the weight store
    plain = encode_store(Store(index, arrays))
    packed = compress_store(plain)
    data = packed if len(packed) < len(plain) else plain
    report["bytes"] = len(data)
    return data, report
