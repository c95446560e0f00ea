"""Static integer slices: a float graph description turned into the same network on integer
kernels, the scheme TFLite's own int8 models follow (the LiteRT quantization specification):

- activations int8, per tensor, asymmetric: ``real = scale * (q - zero_point)``, one
  ``(scale, zero_point)`` per tensor, calibrated per width by the exporter
  (:func:`activation_quant` from ranges) and recorded in the bundle;
- weights int8, symmetric, per output channel (a depthwise filter: per channel of axis 3), the
  grid of :mod:`edge_sdk.tflite.quant`: a filter the float graph already holds as an int8
  constant behind a DEQUANTIZE keeps those very codes (a PWFN slice's exact codebook values);
- biases int32 with scale ``input scale x filter scale[c]`` and zero point 0;
- QUANTIZE after the float input and DEQUANTIZE before every float output, so the slice's
  interface (normalised float32 in, float32 logits and features out) is the float slice's and
  the runtime's own graph around it (:mod:`edge_sdk.answers.graph`) works unchanged.

Ops whose kernels need their input's and output's quantization equal (pooling, reshapes, pads,
concatenations) share one ``(scale, zero_point)``: :func:`activation_quant` gives such a group
the union of its members' ranges. The exporter and the device's materialiser both call
:func:`integer_graph` with the recorded parameters, so a store bundle's integer slice is
materialised byte for byte as the exporter measured it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import ConfigError
from edge_sdk.tflite.graph import Graph
from edge_sdk.tflite.quant import quantize_per_channel
from edge_sdk.tflite.tensors import QUANT_AXIS, Op, Quantization, Tensor, Weights

__all__ = ["ActQuant", "INTEGER_OPS", "SAME_QUANT", "activation_quant", "activation_tensors",
           "calibration_graph", "integer_graph", "quant_params"]

# (scale, zero point) of one activation tensor
ActQuant = tuple[float, int]

# ops the integer graph holds, and the filter's quantization axis of the weighted ones
WEIGHTED = {"CONV_2D": QUANT_AXIS["conv"], "DEPTHWISE_CONV_2D": QUANT_AXIS["depthwise"],
            "FULLY_CONNECTED": QUANT_AXIS["linear"]}
# the kernels of these read their input's quantization for their output (or need it equal)
SAME_QUANT = frozenset({"MAX_POOL_2D", "AVERAGE_POOL_2D", "RESHAPE", "PAD", "CONCATENATION",
                        "SLICE", "GATHER", "RESIZE_NEAREST_NEIGHBOR"})
INTEGER_OPS = frozenset(WEIGHTED) | SAME_QUANT | {"ADD", "MEAN", "RELU", "RELU6"}
QMIN, QMAX = -128, 127
INT32_MAX = 2 ** 31 - 1


def quant_params(lo: float, hi: float) -> ActQuant:
    """The int8 ``(scale, zero_point)`` of a tensor whose values span ``[lo, hi]``: the range
    widened to hold 0 (so 0, a pad or a ReLU's floor, is exact), 255 steps across it, the
    scale rounded to float32 as the file stores it."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ConfigError(f"an activation range must be finite with lo <= hi, got [{lo}, {hi}]")
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo <= 0:  # a tensor that is always 0: any scale represents it
        hi = 1.0
    # float32's smallest normal number at least: the file's scale must stay a normal float32
    scale = float(max(np.float32((hi - lo) / (QMAX - QMIN)), np.finfo(np.float32).tiny))
    zero = int(np.clip(round(QMIN - lo / scale), QMIN, QMAX))
    return scale, zero


def activation_tensors(graph: Graph) -> list[str]:
    """The tensors an integer graph quantizes: the float input, then every op's output, in
    graph order (a DEQUANTIZE of a constant filter excepted: its int8 constant is used as it
    is). ConfigError naming the first op the integer graph cannot hold."""
    out = list(graph.inputs)
    for o in graph.ops:
        if o.op == "DEQUANTIZE" and _is_constant(graph, o.inputs[0]):
            continue
        if o.op not in INTEGER_OPS:
            raise ConfigError(f"op {o.op} ({o.outputs[0]!r}) has no integer kernel here; "
                              f"integer slices hold {', '.join(sorted(INTEGER_OPS))}: export "
                              "this network with float precision only")
        if o.op == "ADD" and o.options.get("scalar") is not None:
            raise ConfigError(f"op ADD ({o.outputs[0]!r}) with a scalar operand has no integer "
                              "form here: export this network with float precision only")
        out.append(o.outputs[0])
    return out


def calibration_graph(graph: Graph) -> Graph:
    """``graph`` with every activation tensor an output, to read their values from an
    interpreter. (Not ``experimental_preserve_all_tensors``: a kernel may compute in place, an
    ADD into its input's buffer, so an intermediate read after the invoke can hold a later
    tensor's values; an output never does.)"""
    names = activation_tensors(graph)
    return Graph(list(graph.tensors), list(graph.ops), list(graph.inputs),
                 list(dict.fromkeys([*graph.outputs, *(n for n in names
                                                        if n not in graph.inputs)])),
                 graph.batch_dim, graph.signature, graph.description)


def _groups(graph: Graph) -> dict[str, str]:
    """tensor -> the representative of the tensors that must share one quantization."""
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        while parent.get(t, t) != t:
            t = parent[t]
        return t

    for o in graph.ops:
        if o.op in SAME_QUANT:
            ins = o.inputs if o.op == "CONCATENATION" else o.inputs[:1]
            for i in ins:
                if i is not None and not _is_constant(graph, i):
                    parent[find(i)] = find(o.outputs[0])
    return {t: find(t) for t in activation_tensors(graph)}


def activation_quant(graph: Graph, ranges: Mapping[str, tuple[float, float]]
                     ) -> dict[str, ActQuant]:
    """Every activation tensor's ``(scale, zero_point)`` from the value ranges the exporter
    calibrated (one entry per :func:`activation_tensors` name), tensors that must share a
    quantization given the union of their ranges."""
    group = _groups(graph)
    missing = [t for t in group if t not in ranges]
    if missing:
        raise ConfigError(f"no calibrated range for activation tensor(s) {missing[:3]}")
    span: dict[str, tuple[float, float]] = {}
    for t, g in group.items():
        lo, hi = (float(v) for v in ranges[t])
        a, b = span.get(g, (lo, hi))
        span[g] = (min(a, lo), max(b, hi))
    per_group = {g: quant_params(*r) for g, r in span.items()}
    return {t: per_group[g] for t, g in group.items()}


def _is_constant(graph: Graph, name: str | None) -> bool:
    return name is not None and graph.tensor(name).weight is not None


def integer_graph(graph: Graph, weights: Weights, quant: Mapping[str, ActQuant]
                  ) -> tuple[Graph, Weights]:
    """The integer form of ``graph`` (see the module docstring) with ``quant`` the activation
    parameters :func:`activation_quant` gave. The float graph is not changed."""
    graph.validate(weights)
    need = activation_tensors(graph)
    missing = [t for t in need if t not in quant]
    if missing:
        raise ConfigError(f"no quantization for activation tensor(s) {missing[:3]}")
    by_name = {t.name: t for t in graph.tensors}
    # a float filter made by DEQUANTIZE of an int8 constant: the constant stands in for it
    dequantized = {o.outputs[0]: o.inputs[0] for o in graph.ops
                   if o.op == "DEQUANTIZE" and _is_constant(graph, o.inputs[0])}
    tensors: list[Tensor] = []
    arrays: dict[str, npt.NDArray[Any]] = {}
    rename: dict[str, str] = {}  # a float input / output -> its int8 twin inside the graph

    def act(name: str, shape: tuple[int, ...]) -> Tensor:
        scale, zero = quant[name]
        if not (scale > 0 and math.isfinite(scale)) or not QMIN <= zero <= QMAX:
            raise ConfigError(f"tensor {name!r}: int8 quantization needs a positive finite "
                              f"scale and a zero point in [{QMIN}, {QMAX}], got "
                              f"({scale}, {zero})")
        return Tensor(rename.get(name, name), tuple(shape), "int8",
                      quant=Quantization((float(np.float32(scale)),), 0,
                                         (int(zero),) if zero else ()))

    ops: list[Op] = []
    for name in graph.inputs:  # float in, QUANTIZE to the int8 the kernels take
        t = by_name[name]
        tensors.append(Tensor(name, t.shape, "float32"))
        rename[name] = f"{name}/int8"
        tensors.append(act(name, t.shape))
        ops.append(Op("QUANTIZE", [name], [rename[name]]))
    outputs = set(graph.outputs)
    for name in outputs:
        rename.setdefault(name, f"{name}/int8")

    def ref(name: str | None) -> str | None:
        return None if name is None else rename.get(name, name)

    for o in graph.ops:
        if o.outputs[0] in dequantized:
            continue
        ins: list[str | None] = list(o.inputs)
        consts: set[str] = set()
        if o.op in WEIGHTED:
            fname, bias = _filter_and_bias(o, by_name, dequantized, weights, quant, tensors,
                                           arrays)
            ins = [ins[0], fname, bias]
            consts = {fname, bias}
        for n in ins:
            if n is not None and n not in consts and by_name[n].weight is not None:
                raise ConfigError(f"op {o.op} ({o.outputs[0]!r}) reads constant {n!r}: "
                                  "only filters and biases are constants in an integer graph")
        out = o.outputs[0]
        tensors.append(act(out, by_name[out].shape))
        ops.append(Op(o.op, [n if n is None or n in consts else ref(n) for n in ins],
                      [rename.get(out, out)], dict(o.options)))
        if o.op in SAME_QUANT:
            for i in [n for n in ins if n is not None]:
                if quant[i] != quant[out]:
                    raise ConfigError(f"op {o.op} ({out!r}) needs its input's quantization "
                                      f"for its output: {i!r} {quant[i]} vs {quant[out]}")
    for name in graph.outputs:  # back to float32 where the slice hands its results over
        tensors.append(Tensor(name, by_name[name].shape, "float32"))
        ops.append(Op("DEQUANTIZE", [rename[name]], [name]))
    g = Graph(tensors, ops, list(graph.inputs), list(graph.outputs), graph.batch_dim,
              graph.signature, graph.description)
    g.validate(arrays)
    return g, arrays


def _filter_and_bias(o: Op, by_name: dict[str, Tensor], dequantized: dict[str, str | None],
                     weights: Weights, quant: Mapping[str, ActQuant], tensors: list[Tensor],
                     arrays: dict[str, npt.NDArray[Any]]) -> tuple[str, str]:
    """The int8 filter and int32 bias constants of a weighted op, added to ``tensors`` and
    ``arrays``; returns their names."""
    axis = WEIGHTED[o.op]
    ins = o.inputs
    fname = ins[1]
    if fname is None:
        raise ConfigError(f"op {o.op} ({o.outputs[0]!r}) has no filter")
    src_name = dequantized.get(fname)
    if src_name is not None:  # the int8 codes the float graph already holds
        src = by_name[src_name]
        assert src.weight is not None and src.quant is not None
        codes = np.asarray(weights[src.weight], np.int8)
        w_scale = np.asarray(src.quant.scale, np.float32)
        if src.quant.axis != axis or codes.min(initial=0) < -127:
            raise ConfigError(f"filter {fname!r}: int8 codes per channel of axis {axis} in "
                              f"[-127, 127] expected")
        if w_scale.size == 1:
            w_scale = np.full(codes.shape[axis], w_scale[0], np.float32)
    else:
        t = by_name[fname]
        if t.weight is None:
            raise ConfigError(f"op {o.op} ({o.outputs[0]!r}): the filter must be a constant")
        if t.dtype == "int8" and t.quant is not None and t.quant.axis == axis:
            codes = np.asarray(weights[t.weight], np.int8)  # a hybrid route's int8 filter
            w_scale = np.asarray(t.quant.scale, np.float32)
        else:
            q = quantize_per_channel(np.asarray(weights[t.weight], np.float32), axis)
            codes, w_scale = q.values, q.scale
    name = f"{o.outputs[0]}/filter"
    tensors.append(Tensor(name, tuple(codes.shape), "int8", name,
                          Quantization(tuple(float(s) for s in w_scale), axis)))
    arrays[name] = codes
    x = ins[0]
    assert x is not None
    in_scale = np.float64(quant[x][0])
    b_scale = (in_scale * w_scale.astype(np.float64)).astype(np.float32)
    bname = ins[2] if len(ins) > 2 else None
    if bname is None:  # TFLite's int8 kernels want a bias: a zero one costs nothing
        bias = np.zeros(codes.shape[axis], np.float64)
    else:
        bt = by_name[bname]
        if bt.weight is None:
            raise ConfigError(f"op {o.op} ({o.outputs[0]!r}): the bias must be a constant")
        bias = np.asarray(weights[bt.weight], np.float64)
    q32 = np.rint(bias / b_scale.astype(np.float64))
    if np.abs(q32).max(initial=0) > INT32_MAX:
        raise ConfigError(f"op {o.op} ({o.outputs[0]!r}): the bias does not fit int32 at "
                          "scale input x filter (an input range far too narrow?)")
    out_b = f"{o.outputs[0]}/bias"
    tensors.append(Tensor(out_b, (codes.shape[axis],), "int32", out_b,
                          Quantization(tuple(float(s) for s in b_scale), 0)))
    arrays[out_b] = q32.astype(np.int32)
    return name, out_b
