"""The precisions a point slice is exported in, beside float32 kernels: ``dynamic`` (int8
weights straight into CONV_2D / FULLY_CONNECTED, activations quantized per invoke: the hybrid
route) and ``int8`` (int8 kernels end to end, :mod:`edge_sdk.tflite.integer`), whose
activation ranges are calibrated here, per width: a nested network's activations differ per
width as its batch-norm statistics do.

Calibration runs the width's float slice on training images (every activation an output:
:func:`edge_sdk.tflite.integer.calibration_graph`), turns each tensor's values into a range by
each of :data:`CALIBRATIONS`, and keeps the one whose integer slice has the lowest NLL on
the validation split (the test split is never looked at).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from edge_sdk.answers import metrics as M
from edge_sdk.errors import ConfigError
from edge_sdk.tflite.graph import Graph
from edge_sdk.tflite.integer import (ActQuant, activation_quant, activation_tensors,
                                     calibration_graph, integer_graph)
from edge_sdk.tflite.tensors import Weights
from edge_sdk.tflite.writer import write_tflite
from exporters.measure import run_tflite

__all__ = ["CALIBRATIONS", "PRECISIONS", "ROUTES", "IntegerSlice", "activation_ranges",
           "check_precisions", "config_suffix", "integer_slice"]

# what `edge-sdk export --precisions` takes; float is the route the export's --weights names
PRECISIONS = ("float", "dynamic", "int8")
ROUTES = {"dynamic": "hybrid", "int8": "int8"}
# range estimators screened per width: min-max keeps every calibration value, the percentile
# clips the 0.01 % tails an outlier image puts in a range (a wider step for every other value)
CALIBRATIONS = ("minmax", "p99.99")
_BATCH = 256
_SAMPLE = 1 << 20  # values per tensor kept for a percentile (a seeded subsample)


def check_precisions(precisions: Sequence[str]) -> tuple[str, ...]:
    """The precisions asked for, float first; ConfigError naming an unknown one."""
    got = [str(p) for p in precisions]
    bad = [p for p in got if p not in PRECISIONS]
    if bad or "float" not in got:
        raise ConfigError(f"precisions must include float and be among {', '.join(PRECISIONS)}, "
                          f"got {got}")
    return tuple(p for p in PRECISIONS if p in got)


def config_suffix(precision: str) -> str:
    """What a configuration id adds for its precision: nothing for float (the ids earlier
    bundles have), ``-dyn`` for dynamic range, ``-int8`` for integer kernels."""
    return {"float": "", "dynamic": "-dyn", "int8": "-int8"}[precision]


def activation_ranges(graph: Graph, weights: Weights, xs: np.ndarray, method: str = "minmax",
                      seed: int = 0) -> dict[str, tuple[float, float]]:
    """Each activation tensor's ``(lo, hi)`` over the NHWC inputs ``xs`` by ``method``."""
    if method not in CALIBRATIONS:
        raise ConfigError(f"calibration must be one of {', '.join(CALIBRATIONS)}, got {method!r}")
    names = activation_tensors(graph)
    buf = write_tflite(calibration_graph(graph), weights)
    from edge_sdk.backends import interpreter_class

    it = interpreter_class()[0](model_content=buf, num_threads=1)
    inp = it.get_input_details()[0]["index"]
    outs = {d["name"]: d["index"] for d in it.get_output_details()}
    rng = np.random.default_rng(seed)
    lo = {n: np.inf for n in names}
    hi = {n: -np.inf for n in names}
    kept: dict[str, list[np.ndarray]] = {n: [] for n in names}
    per_batch = max(1, _SAMPLE // max(1, -(-len(xs) // _BATCH)))
    for start in range(0, len(xs), _BATCH):
        x = np.ascontiguousarray(xs[start:start + _BATCH], np.float32)
        it.resize_tensor_input(inp, list(x.shape))
        it.allocate_tensors()
        it.set_tensor(inp, x)
        it.invoke()
        for n in names:
            v = x if n not in outs else it.get_tensor(outs[n])
            lo[n], hi[n] = min(lo[n], float(v.min())), max(hi[n], float(v.max()))
            if method != "minmax":
                flat = v.reshape(-1)
                kept[n].append(flat if flat.size <= per_batch else
                               rng.choice(flat, per_batch, replace=False))
    if method == "minmax":
        return {n: (lo[n], hi[n]) for n in names}
    q = 100 - float(method[1:])
    out = {}
    for n in names:
        a, b = np.percentile(np.concatenate(kept[n]), [q, 100 - q])
        out[n] = (float(a), float(b))
    return out


@dataclass
class IntegerSlice:
    """An integer slice and how it was calibrated: its bytes, the activations' parameters (a
    store bundle records them for the device), the estimator chosen and every estimator's
    validation NLL and accuracy."""

    data: bytes
    quant: dict[str, ActQuant]
    calibration: str
    screened: dict[str, dict[str, float]]


def integer_slice(graph: Graph, weights: Weights, calib_x: np.ndarray, val_x: np.ndarray,
                  val_y: np.ndarray, methods: Sequence[str] = CALIBRATIONS) -> IntegerSlice:
    """The width's integer slice from its float graph (the exporter's or the materialiser's),
    calibrated on ``calib_x`` by each of ``methods``, the lowest validation NLL kept."""
    best: IntegerSlice | None = None
    screened: dict[str, dict[str, float]] = {}
    for method in methods:
        quant = activation_quant(graph, activation_ranges(graph, weights, calib_x, method))
        g8, w8 = integer_graph(graph, weights, quant)
        data = write_tflite(g8, w8)
        logits = run_tflite(data, val_x)[:, 0].astype(np.float64)
        probs = M.softmax(logits)
        screened[method] = {"nll": float(M.nll(probs, val_y)),
                            "accuracy": float((probs.argmax(1) == val_y).mean())}
        if best is None or screened[method]["nll"] < screened[best.calibration]["nll"]:
            best = IntegerSlice(data, quant, method, screened)
    assert best is not None
    return best
