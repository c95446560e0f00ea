"""The graph description: what a TFLite slice computes, as plain data ("One lowering
and one writer").

The exporter lowers a model to a :class:`Graph`; :mod:`edge_sdk.tflite.writer` turns
``(graph, weights)`` into ``.tflite`` bytes. The description holds ops, tensors with their
shapes, and constants *by reference* (``Tensor.weight`` names an array in a separate
``weights`` mapping), so it serialises to a few kilobytes of JSON or YAML
(:meth:`Graph.to_dict` / :meth:`Graph.from_dict`) however large the weights are.

Conventions (those of TFLite, which the writer copies verbatim):

- activations are float32 NHWC; conv filters OHWI ``[C_out, kh, kw, C_in]``, depthwise filters
  ``[1, kh, kw, C]``, fully connected weights ``[out, in]``;
- ``batch_dim`` (0, or None for a fixed batch) is the dimension of every graph input and output
  an interpreter may resize (written as -1 in their shape signatures, the manifest's
  ``batch_dim``, docs/manifest.md "Batches"); ops that reshape must then use -1 for it;
- int8 constants are symmetric per-channel quantized (:class:`Quantization`, zero points 0);
- the int32 operands TFLite wants as tensors (RESHAPE's shape, PAD's paddings, MEAN's axes) are
  options here; the writer makes the constants.

No torch, no TFLite: numpy only. Shapes are checked by
:func:`edge_sdk.tflite.ops.infer_shape`, the one place
that knows each op's output shape; :meth:`Graph.validate` re-runs it on a loaded description.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, TypeVar

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import ConfigError
from edge_sdk.tflite.ops import infer_shape
from edge_sdk.tflite.tensors import DTYPES, QUANT_AXIS, Op, Quantization, Tensor

GRAPH_VERSION = 1
_S = TypeVar("_S", bound=np.generic)


def tflite_weight(w: npt.NDArray[_S], kind: str, flat_hw: tuple[int, int] | None = None
                  ) -> npt.NDArray[_S]:
    """A torch-layout weight in the graph's (TFLite's) layout: conv OIHW -> OHWI, depthwise
    ``[C, 1, kh, kw]`` -> ``[1, kh, kw, C]``, linear ``[out, in]`` unchanged, except after a
    flatten of an ``(H, W)`` map (``flat_hw``): torch flattened (C, H, W), NHWC flattens
    (H, W, C), so the columns are permuted. The one definition, used by the exporter's
    lowering and by the device-side materialiser (docs/store.md §3 step 3)."""
    w = np.asarray(w)
    if kind == "conv":
        return w.transpose(0, 2, 3, 1)
    if kind == "depthwise":
        return w.transpose(1, 2, 3, 0)
    if kind == "linear":
        if flat_hw is None or tuple(flat_hw) == (1, 1):
            return w
        h, ww = flat_hw
        o = w.shape[0]
        return w.reshape(o, -1, h, ww).transpose(0, 2, 3, 1).reshape(o, -1)
    raise ConfigError(f"weight kind must be one of {', '.join(QUANT_AXIS)}, got {kind!r}")


@dataclass
class Graph:
    tensors: list[Tensor]
    ops: list[Op]
    inputs: list[str]
    outputs: list[str]
    batch_dim: int | None = 0
    signature: str = "serving_default"
    description: str = "edge-sdk"
    version: int = GRAPH_VERSION

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise ConfigError(f"graph has no tensor {name!r}")

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self, compact: bool = False) -> dict[str, Any]:
        """JSON/YAML-ready: lists, strings, numbers and None only. ``compact`` leaves out what
        :meth:`from_dict` defaults (a float32 dtype, empty options, the default signature,
        description and batch dimension): a store bundle's manifest holds one per width."""
        def tensor(t: Tensor) -> dict[str, Any]:
            d: dict[str, Any] = {"name": t.name, "shape": list(t.shape)}
            if not compact or t.dtype != "float32":
                d["dtype"] = t.dtype
            if t.weight is not None:
                d["weight"] = t.weight
            if t.quant is not None:  # float32 -> Python float -> float32 is exact
                d["quant"] = {"scale": [float(s) for s in t.quant.scale], "axis": t.quant.axis}
                if any(t.quant.zero_point):
                    d["quant"]["zero_point"] = [int(z) for z in t.quant.zero_point]
            return d

        def op(o: Op) -> dict[str, Any]:
            d: dict[str, Any] = {"op": o.op, "inputs": list(o.inputs), "outputs": list(o.outputs)}
            if not compact or o.options:
                d["options"] = _plain(o.options)
            return d

        out: dict[str, Any] = {"version": self.version, "signature": self.signature,
               "description": self.description, "batch_dim": self.batch_dim,
               "inputs": list(self.inputs), "outputs": list(self.outputs),
               "tensors": [tensor(t) for t in self.tensors], "ops": [op(o) for o in self.ops]}
        if compact:
            for key, default in (("signature", "serving_default"), ("description", "edge-sdk"),
                                 ("batch_dim", 0)):
                if out[key] == default:
                    del out[key]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Graph":
        if not isinstance(d, Mapping):
            raise ConfigError(f"a graph description is a mapping, got {type(d).__name__}")
        if d.get("version") != GRAPH_VERSION:
            raise ConfigError(f"graph description version {d.get('version')!r} is not "
                              f"supported (this edge-sdk reads version {GRAPH_VERSION})")
        try:
            tensors = [Tensor(t["name"], tuple(int(s) for s in t["shape"]),
                              t.get("dtype", "float32"), t.get("weight"),
                              None if t.get("quant") is None else Quantization(
                                  tuple(float(s) for s in t["quant"]["scale"]),
                                  int(t["quant"].get("axis", 0)),
                                  tuple(int(z) for z in t["quant"].get("zero_point", ()))))
                       for t in d["tensors"]]
            ops = [Op(o["op"], list(o["inputs"]), list(o["outputs"]), dict(o.get("options", {})))
                   for o in d["ops"]]
            return cls(tensors, ops, list(d["inputs"]), list(d["outputs"]),
                       d.get("batch_dim", 0), d.get("signature", "serving_default"),
                       d.get("description", "edge-sdk"))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"malformed graph description ({type(e).__name__}: {e}); expected "
                              "the keys Graph.to_dict writes") from None

    # ---- checks ----------------------------------------------------------------------------
    def validate(self, weights: Mapping[str, npt.NDArray[Any]] | None = None) -> None:
        """Every reference resolves, every tensor is produced once, every op's output shape is
        the one :func:`~edge_sdk.tflite.ops.infer_shape` gives, and (with ``weights``) every constant's array has
        the tensor's shape and dtype. Raises :class:`ConfigError` naming the first problem."""
        by_name: dict[str, Tensor] = {}
        for t in self.tensors:
            if t.name in by_name:
                raise ConfigError(f"tensor name {t.name!r} is used twice")
            check_tensor(t)
            by_name[t.name] = t
        produced = {n for n, t in by_name.items() if t.weight is not None}
        for n in self.inputs:
            if n not in by_name or n in produced:
                raise ConfigError(f"graph input {n!r} is not a non-constant tensor of the graph")
            produced.add(n)
        for o in self.ops:
            where = f"{o.op} {o.outputs}"
            ins: list[Tensor | None] = []
            for i in o.inputs:
                if i is not None and i not in produced:
                    raise ConfigError(f"{where}: input {i!r} is not produced before it (or "
                                      "not a tensor of the graph)")
                ins.append(None if i is None else by_name[i])
            if len(o.outputs) != 1 or o.outputs[0] not in by_name or o.outputs[0] in produced:
                raise ConfigError(f"{where}: an op has one output, a tensor of the graph "
                                  "produced nowhere else")
            out = by_name[o.outputs[0]]
            shape, dtype = infer_shape(o.op, ins, o.options, o.outputs[0])
            if tuple(out.shape) != shape or out.dtype != dtype:
                raise ConfigError(f"{where}: output recorded as {out.dtype} {list(out.shape)}, "
                                  f"the op computes {dtype} {list(shape)}")
            produced.add(o.outputs[0])
        for n in self.outputs:
            if n not in produced:
                raise ConfigError(f"graph output {n!r} is not produced by any op or input")
        if not self.inputs or not self.outputs:
            raise ConfigError("a graph needs at least one input and one output")
        if self.batch_dim not in (None, 0):
            raise ConfigError(f"batch_dim must be 0 or None (fixed batch), got {self.batch_dim!r}")
        if weights is not None:
            for t in self.tensors:
                if t.weight is not None:
                    check_weight(t, weights)


def _plain(v: object) -> object:
    """``v`` with mappings as dicts, sequences and arrays as lists, numpy scalars as Python's."""
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def check_tensor(t: Tensor) -> None:
    if t.dtype not in DTYPES:
        raise ConfigError(f"tensor {t.name!r}: dtype {t.dtype} is not supported "
                          f"(supported: {', '.join(DTYPES)})")
    if any(not isinstance(d, (int, np.integer)) or d <= 0 for d in t.shape):
        raise ConfigError(f"tensor {t.name!r}: shape {list(t.shape)} must be positive integers")
    q = t.quant
    if q is None:
        if t.dtype == "int8" and t.weight is None:
            raise ConfigError(f"tensor {t.name!r}: an int8 activation needs its quantization")
        return
    if t.weight is None:  # an integer graph's activation: one scale, one zero point
        if t.dtype != "int8" or len(q.scale) != 1 or q.axis != 0 or len(q.zero_point) > 1 \
                or not all(-128 <= z <= 127 for z in q.zero_point):
            raise ConfigError(f"tensor {t.name!r}: a quantized activation is int8 with one "
                              "scale and one zero point in [-128, 127]")
    else:  # a constant: int8 filters and their int32 biases, symmetric per channel
        if t.dtype not in ("int8", "int32") or any(q.zero_point):
            raise ConfigError(f"tensor {t.name!r}: quantized constants are int8 (or an int32 "
                              "bias) with zero points 0")
        if not 0 <= q.axis < len(t.shape) or len(q.scale) != t.shape[q.axis]:
            raise ConfigError(f"tensor {t.name!r}: {len(q.scale)} scales for axis {q.axis} of "
                              f"shape {list(t.shape)} (one per channel expected)")
    if q.zero_point and len(q.zero_point) != len(q.scale):
        raise ConfigError(f"tensor {t.name!r}: {len(q.zero_point)} zero points for "
                          f"{len(q.scale)} scales")
        s = np.asarray(q.scale, np.float64)
        # written as float32: a scale float32 cannot carry would become inf or 0
        if not (np.isfinite(s).all() and (s >= 1.1754943508222875e-38).all()
                and (s <= 3.4028234663852886e38).all()):
            raise ConfigError(f"tensor {t.name!r}: quantization scales must be finite, > 0 and "
                              "within float32's normal range")


def check_weight(t: Tensor, weights: Mapping[str, npt.NDArray[Any]]) -> npt.NDArray[Any]:
    """The array constant ``t`` refers to, checked against its shape and dtype."""
    if t.weight is None or t.weight not in weights:
        raise ConfigError(f"tensor {t.name!r} refers to weight {t.weight!r}, which the weights "
                          "given do not hold")
    a = np.asarray(weights[t.weight])
    if a.shape != tuple(t.shape) or a.dtype != np.dtype(t.dtype):
        raise ConfigError(f"weight {t.weight!r} is {a.dtype} {list(a.shape)}, tensor {t.name!r} "
                          f"expects {t.dtype} {list(t.shape)}")
    if t.quant is not None and t.dtype == "int8" and (a == -128).any():  # symmetric grid
        raise ConfigError(f"weight {t.weight!r}: int8 value -128 is outside the symmetric range")
    return a


def graph_stats(graph: Graph) -> dict[str, Any]:
    """MACs per invoke and parameters counted from the graph (DESIGN: "MACs per slice, counted
    from the graph"). CONV_2D: ``H_out W_out C_out kh kw C_in`` per batch element;
    DEPTHWISE_CONV_2D: ``H_out W_out C kh kw``; FULLY_CONNECTED: ``in x out`` per row.
    Parameters are the filter and bias elements of those ops (a CONV_2D without a bias counts
    the zeros the writer gives it). Also counts ops by name, with the writer's additions."""
    shapes = {t.name: tuple(t.shape) for t in graph.tensors}
    macs = params = 0
    ops: dict[str, int] = {}
    for o in graph.ops:
        ops[o.op] = ops.get(o.op, 0) + 1
        if o.op not in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            continue
        weight = o.inputs[1]
        if weight is None:
            raise ConfigError(f"{o.op} {o.outputs}: no filter input")
        filt, out = shapes[weight], shapes[o.outputs[0]]
        macs += int(np.prod(out[:-1])) * int(np.prod(filt))  # OHWI, [1,kh,kw,C], [out,in]
        params += int(np.prod(filt))
        if o.op != "FULLY_CONNECTED" or (len(o.inputs) > 2 and o.inputs[2] is not None):
            params += out[-1]
    return {"macs": macs, "params": params, "ops": ops}
