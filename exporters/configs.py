"""A bundle's configuration records from measured slices, for both layouts.

:class:`Configurations` turns the logits of a configuration's files (validation, test, OOD)
into the manifest record: temperature, confidence thresholds, validation NLL and accuracy,
test quality, host latency and memory (each distinct file measured once), and at the end the
two-stage cascade plans. :func:`store_width` adds one width of a ``layout: store`` bundle:
every slice materialised from the store (:func:`edge_sdk.store.materialize`, the function the
device runs), so each virtual file's sha256 is the hash of the bytes measured here, and S
(posterior samples) a run-time choice: one head and one all configuration per S in
``counts`` (by default 1, 2, 4, ... and S_max: ``exporters.layouts.sample_counts``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from edge_sdk.answers import metrics as M
from edge_sdk.bundle import file_entry, width_key
from edge_sdk.store import materialize_graph
from edge_sdk.tflite.writer import write_tflite
from exporters.calibrate import (cascade_threshold, confidence_thresholds, fit_temperature,
                                 predictive_probs)
from exporters.measure import latency_ms, memory_mb, run_tflite
from exporters.precision import ROUTES, config_suffix, integer_slice
from exporters.tflite import graph_stats

__all__ = ["Configurations", "EvalSets", "quality", "slice_logits", "store_width"]


def slice_logits(files: list[bytes], scope: str, xs: np.ndarray) -> np.ndarray:
    """[S, N, C] logits of a configuration on NHWC inputs, through the interpreter (head scope:
    one file, [S, C] per invoke; all scope: one file per sample)."""
    if scope == "head":
        return np.transpose(run_tflite(files[0], xs), (1, 0, 2))  # [N, S, C] -> [S, N, C]
    return np.stack([run_tflite(f, xs)[:, 0] for f in files])


def quality(logits: np.ndarray, labels: np.ndarray, temperature: float,
            ood_logits: np.ndarray | None) -> tuple[np.ndarray, dict[str, float]]:
    """Predictive probabilities [N, C] (samples averaged at ``temperature``) and the metrics
    row the manifest records (accuracy, NLL, ECE, Brier, mutual information, OOD AUROC)."""
    probs_s = M.sample_probs(logits, temperature)
    probs = probs_s.mean(0)
    row = {k: float(v) for k, v in M.summarize(probs, labels).items()}
    row["mutual_info"] = float(M.mutual_information(probs_s).mean())
    if ood_logits is not None:
        ood_probs = M.sample_probs(ood_logits, temperature)
        row["ood_auroc"] = float(M.ood_auroc(M.predictive_entropy(probs_s),
                                             M.predictive_entropy(ood_probs)))
    return probs, row


def _sig(x: float | None, digits: int) -> float | None:
    """``x`` to ``digits`` significant digits: what a measurement or a test metric means (the
    last of 17 digits is noise), written in a third of the manifest bytes (the
    manifest counts against the bundle). Test metrics keep 4 (an accuracy on <= 10,000 test
    samples is exact to one sample), latency and memory 4, the temperature 7 (the thresholds
    and validation NLL are computed at the rounded temperature); thresholds are the shortest
    decimals between two validation confidences (``calibrate.short_threshold``: no validation
    decision changes) and the validation NLL keeps every digit (the budget rule ranks on it);
    the validation accuracy keeps 6 (exact to one sample on up to 100,000 validation samples:
    the device rules compare it)."""
    return None if x is None else float(f"{x:.{digits}g}")


@dataclass
class EvalSets:
    """NHWC inputs the configurations are calibrated (validation), measured (test) and
    checked for OOD detection on."""

    val_x: np.ndarray
    val_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    ood_x: np.ndarray | None = None

    def logits(self, files: list[bytes], scope: str) -> tuple[np.ndarray, ...]:
        """(validation, test, OOD or None) logits [S, N, C] of a configuration's files."""
        return (slice_logits(files, scope, self.val_x), slice_logits(files, scope, self.test_x),
                None if self.ood_x is None else slice_logits(files, scope, self.ood_x))


class Configurations:
    """The configuration records of one export, in the order added."""

    def __init__(self, ev: EvalSets, targets: Sequence[float], weights: str, measure: bool,
                 classes: int):
        self.ev, self.targets, self.weights = ev, targets, weights
        self.measure, self.classes = measure, classes
        self.records: list[dict] = []
        self.val_probs: dict[str, np.ndarray] = {}
        self.bufs: dict[str, list[bytes]] = {}  # each configuration's file bytes
        self._measured: dict[str, tuple[float, float]] = {}

    def _measure(self, name: str, buf: bytes, params: int) -> tuple[float, float]:
        """(latency ms, memory MB) of one file, measured once per file name."""
        if name not in self._measured:
            self._measured[name] = (latency_ms(buf, self.ev.test_x[0]),
                                    memory_mb(buf, params))  # int8: a byte per weight
        return self._measured[name]

    def add(self, cid: str, width: float, scope: str, samples: int, names: list[str],
            bufs: list[bytes], logits: tuple, info: dict, unique=None, entropy=None,
            recipes: list[dict] | None = None, weights: str | None = None) -> dict:
        """One configuration from its files (``bufs``, named ``names``) and their logits
        ``(val, test, ood)`` [S, N, C]; ``info``: graph facts of its first file (macs, params);
        ``recipes``: one per file (layout store); ``weights``: its route when not the
        export's (a dynamic-range or integer precision)."""
        val_logits, test_logits, ood_logits = logits
        val_y, test_y = self.ev.val_y, self.ev.test_y
        # 7 significant digits (the search's own tolerance is ~1e-9 relative): everything
        # below is computed at the temperature the manifest states
        temperature = _sig(fit_temperature(val_logits, val_y), 7)
        val_probs = predictive_probs(val_logits, temperature)
        self.val_probs[cid] = val_probs
        self.bufs[cid] = list(bufs)
        latency = memory = None
        if self.measure:
            per_file = [self._measure(n, b, info["params"]) for n, b in zip(names, bufs)]
            latency = _sig(sum(p[0] for p in per_file), 4)  # all scope: S invokes
            memory = _sig(sum(p[1] for p in per_file), 4)
        rec = dict(
            id=cid, width=float(width), scope=scope, samples=samples,
            files=[file_entry(n, b).to_dict() for n, b in zip(names, bufs)],
            invokes=len(bufs),
            output={"kind": "logits", "shape": [samples if scope == "head" else 1,
                                                self.classes]},
            temperature=float(temperature), temperature_folded=False,
            weights=weights or self.weights,
            macs=int(info["macs"]), params=int(info["params"]), unique_values=unique,
            weight_entropy_bits=entropy,
            thresholds=confidence_thresholds(val_probs, val_y, self.targets),
            val_nll=float(M.nll(val_probs, val_y)),
            val_accuracy=_sig(M.accuracy(val_probs, val_y), 6),
            test={k: {m: _sig(v, 4) for m, v in quality(test_logits, test_y, t,
                                                         ood_logits)[1].items()}
                  for k, t in (("raw", 1.0), ("calibrated", temperature))},
            latency_ms=latency, memory_mb=memory)
        if recipes is not None:
            rec["materialize"] = recipes
        self.records.append(rec)
        return rec

    def finish(self, max_loss: float) -> list[dict]:
        """The records with their cascade plans: this configuration first, a wider one of the
        same scope, the same S and the same precision second (a plan never changes S
        mid-prediction)."""
        for c in self.records:
            c["cascade"] = {
                o["id"]: cascade_threshold(self.val_probs[c["id"]], self.val_probs[o["id"]],
                                           self.ev.val_y, max_loss, self.targets)
                for o in self.records if o["scope"] == c["scope"] and
                o["samples"] == c["samples"] and o["weights"] == c["weights"]
                and o["width"] > c["width"]}
        return self.records


def store_width(out: Configurations, build, width: float, scopes: Sequence[str], s_max: int,
                point_stats: tuple, counts: Sequence[int], precisions: Sequence[str] = (),
                calib_x: np.ndarray | None = None, integer: dict | None = None) -> dict:
    """Add width ``width``'s configurations of a store bundle to ``out``: point; head S and
    all S for S in ``counts`` (``exporters.layouts.sample_counts``: sorted, ending at S_max;
    empty without samples). Every file is
    materialised from ``build.store`` (the decoded store the device will hold). Quality of
    all-S is that of the first S samples' files; quality of head-S is the S_max head's first S rows: the stacked classifier is quantized per
    row, so head S's rows are bit for bit head S_max's first S (tests/exporters/test_store.py
    checks the logits), while each head-S file is materialised and measured (its sha256 and
    latency are its own). ``precisions``: the point slice's other precisions (dynamic, int8:
    exporters.precision), an integer one calibrated on ``calib_x`` and recorded in
    ``integer`` by width key. Returns the weight notes per scope."""
    wk = width_key(width)
    graph = build.graphs[wk]
    notes: dict[str, dict] = {}
    precisions = [p for p in precisions if p != "float"]
    integer = {} if integer is None else integer
    if "int8" in precisions and calib_x is None:
        raise ValueError("an integer precision needs calibration inputs")
    counts = list(counts)
    if ("head" in scopes or "all" in scopes) and (not counts or counts[-1] != s_max):
        raise ValueError(f"sample counts {counts} must end at S_max = {s_max}")

    def made(scope: str, **kw) -> tuple[bytes, dict]:
        # materialize() is exactly write_tflite(materialize_graph(...)): the records too
        g, arrays, recs = materialize_graph(build.store, graph, wk, **kw)
        buf = write_tflite(g, arrays)
        n = notes.setdefault(f"w{wk}-{scope}", {"float_fallback": [],
                                                 "int8_max_rel_error": 0.0})
        n["float_fallback"] = sorted(set(n["float_fallback"]) | {
            r.layer for r in recs if r.route == "float" and out.weights != "float"})
        n["int8_max_rel_error"] = max(n["int8_max_rel_error"],
                                      *(r.max_rel_error for r in recs))
        return buf, graph_stats(buf)

    if "point" in scopes:
        buf, info = made("point")
        recipe = [{"width": wk, "sample": None, "heads": 0}]
        out.add(f"w{wk}-point", width, "point", 1, [f"w{wk}-point.tflite"], [buf],
                out.ev.logits([buf], "point"), info, *point_stats, recipes=recipe)
        for p in precisions:  # the same network on other kernels, materialised the same way
            cid = f"w{wk}-point{config_suffix(p)}"
            if p == "dynamic":
                g, arrays, _ = materialize_graph(build.store, graph, wk, route="hybrid")
                pbuf = write_tflite(g, arrays)
            else:
                g, arrays, _ = materialize_graph(build.store, graph, wk)
                made_int = integer_slice(g, arrays, calib_x, out.ev.val_x, out.ev.val_y)
                pbuf = made_int.data
                integer[wk] = made_int
            out.add(cid, width, "point", 1, [f"{cid}.tflite"], [pbuf],
                    out.ev.logits([pbuf], "point"), graph_stats(pbuf), *point_stats,
                    recipes=recipe, weights=ROUTES[p])
    if "head" in scopes:
        heads = {s: made("head", heads=s) for s in counts}
        full = out.ev.logits([heads[s_max][0]], "head")
        for s in counts:
            buf, info = heads[s]
            out.add(f"w{wk}-head{s}", width, "head", s, [f"w{wk}-head{s}.tflite"], [buf],
                    tuple(None if z is None else z[:s] for z in full), info,
                    recipes=[{"width": wk, "sample": None, "heads": s}])
    if "all" in scopes:
        draws = [made("all", sample=i) for i in range(s_max)]
        bufs = [b for b, _ in draws]
        full = out.ev.logits(bufs, "all")
        names = [f"w{wk}-s{i}.tflite" for i in range(s_max)]
        for s in counts:
            out.add(f"w{wk}-all{s}", width, "all", s, names[:s], bufs[:s],
                    tuple(None if z is None else z[:s] for z in full), draws[0][1],
                    recipes=[{"width": wk, "sample": i, "heads": 0} for i in range(s)])
    return notes
