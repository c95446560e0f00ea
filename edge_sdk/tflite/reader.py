"""``.tflite`` bytes -> the graph description the writer uses, so that no bundle crashes the
process (docs/reliability.md): :func:`read_graph` parses a slice back into ``(Graph, weights)``
and refuses, as a :class:`~edge_sdk.errors.SliceError`, everything :mod:`edge_sdk.tflite.writer`
would not have written, then checks the result as the store route checks what it materialises
(:meth:`Graph.validate`: every shape and type against the ops that produce and consume it, every
operator's inputs produced before it, so the graph is acyclic and has no self-loop).

Why this exists: a files-layout slice is trusted because its sha256 matches the manifest, but a
sha256 only says the bytes are the ones listed, not that they are sound. TFLite's interpreters
trust a flatbuffer's tensor shapes, buffer sizes and operator indices; a malformed one
(a DEQUANTIZE output shape shrunk by one: heap corruption) kills the process at the first
``invoke``. Nothing an interpreter would read is left unchecked here:

- every table's fields are whitelisted: a field the writer never sets (sparsity, custom options,
  dilation, a second subgraph, buffers stored after the flatbuffer, metadata ...) is refused,
  since an interpreter would act on it and the description would not show it;
- every offset, vector and string lies inside the file (a forged offset is a SliceError, never
  an IndexError or a read of another table's bytes);
- every constant buffer holds exactly ``prod(shape) * itemsize`` bytes; float constants are
  finite (a NaN bias answers NaN for every input); quantization is the writer's symmetric
  per-channel int8 (zero points 0, one finite positive scale per channel);
- operator codes, option tables and their values (padding, activation, strides, beta, axes,
  reshape / pad / mean operands: :mod:`edge_sdk.tflite.operands`) are the ones the writer emits
  for that op;
- the signature (when present) maps exactly the subgraph's inputs and outputs.

numpy + stdlib only (no flatbuffers package needed to read: the bounds-checked access is
:mod:`edge_sdk.tflite.flatbuffer`). Field numbers: TFLite's
``schema.fbs``, as listed in :mod:`edge_sdk.tflite.writer`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import ConfigError, SliceError
from edge_sdk.tflite.flatbuffer import Flat, Table
from edge_sdk.tflite.graph import Graph
from edge_sdk.tflite.tensors import Op, Quantization, Tensor, TensorEntry, Weights
from edge_sdk.tflite.operands import OPERANDS, operand, scalar_operand
from edge_sdk.tflite.ops import REDUCERS
from edge_sdk.tflite.schema import BUILTIN_CODES, MODEL_VERSION, OPTIONS_TYPES, TENSOR_TYPES

__all__ = ["read_graph", "MAX_ELEMENTS"]

_V = TypeVar("_V")

_OP_OF_CODE = {v: k for k, v in BUILTIN_CODES.items()}
_DTYPE_OF_TYPE = {v: k for k, v in TENSOR_TYPES.items()}
_PADDING = {0: "SAME", 1: "VALID"}
_ACTIVATION = {0: None, 1: "relu", 3: "relu6"}
# Limits far above any slice this project exports (the CIFAR-10 ResNet: ~200 tensors, rank 4,
# activations of 32x32x64) and low enough that a forged shape cannot ask an interpreter for
# gigabytes: 2**26 float32 elements is 256 MiB for one tensor.
MAX_ELEMENTS = 2 ** 26
_MAX_TENSORS = 20_000
_MAX_OPS = 10_000
_MAX_RANK = 8
_MAX_VERSION = 12  # the highest op version the writer's ops have in TFLite's versioning

# table -> the fields the writer sets (any other present field is refused)
_FIELDS = {
    "Model": {0, 1, 2, 3, 4, 7}, "OperatorCode": {0, 2, 3}, "SubGraph": {0, 1, 2, 3, 4},
    "Tensor": {0, 1, 2, 3, 4, 7}, "QuantizationParameters": {2, 3, 6}, "Buffer": {0},
    "Operator": {0, 1, 2, 3, 4}, "SignatureDef": {0, 1, 2, 4}, "TensorMap": {0, 1},
}
# op -> (options table, the fields it may set)
_OPTION_FIELDS = {
    "CONV_2D": ("Conv2DOptions", {0, 1, 2, 3}),
    "DEPTHWISE_CONV_2D": ("DepthwiseConv2DOptions", {0, 1, 2, 3, 4}),
    "FULLY_CONNECTED": ("FullyConnectedOptions", {0}),
    "ADD": ("AddOptions", {0}),
    "CONCATENATION": ("ConcatenationOptions", {0, 1}),
    "MAX_POOL_2D": ("Pool2DOptions", {0, 1, 2, 3, 4, 5}),
    "AVERAGE_POOL_2D": ("Pool2DOptions", {0, 1, 2, 3, 4, 5}),
    **{op: ("ReducerOptions", {0}) for op in REDUCERS},
    "L2_NORMALIZATION": ("L2NormOptions", {0}),
    "RESHAPE": ("ReshapeOptions", {0}),
    "PAD": ("PadOptions", set()),
    "PADV2": ("PadV2Options", set()),
    "MUL": ("MulOptions", {0}),
    "GATHER": ("GatherOptions", {0}),
    "RESIZE_NEAREST_NEIGHBOR": ("ResizeNearestNeighborOptions", {0, 1}),
    "RESIZE_BILINEAR": ("ResizeBilinearOptions", {2, 3}),
    "DEQUANTIZE": ("DequantizeOptions", set()),
    "QUANTIZE": ("QuantizeOptions", set()),
    "SOFTMAX": ("SoftmaxOptions", {0}),
}


def _enum(value: int, table: Mapping[int, _V], what: str, flat: Flat) -> _V:
    if value not in table:
        raise flat.bad(f"{what} {value} is not one of {sorted(table)}")
    return table[value]


def _options(op: str, t: Table | None, flat: Flat, where: str) -> dict[str, Any]:
    """The description's options of ``op`` from its options table (operands come later)."""
    kind, allowed = _OPTION_FIELDS.get(op, (None, set()))
    if kind is None:
        if t is not None:
            raise flat.bad(f"{where}: {op} takes no options table, the file has one")
        return {}
    if t is None:
        raise flat.bad(f"{where}: {op} needs its {kind} table, the file has none")
    extra = set(t.fields) - allowed
    if extra:
        raise flat.bad(f"{where}: {kind} sets field(s) {sorted(extra)}, which edge-sdk's writer "
                       f"never writes (it sets {sorted(allowed)})")
    table = t

    def pad() -> str:
        return _enum(table.scalar(0, "<b", 0), _PADDING, f"{where}: padding", flat)

    def act(slot: int) -> str | None:
        return _enum(table.scalar(slot, "<b", 0), _ACTIVATION, f"{where}: fused activation",
                     flat)

    def positive(slot: int, what: str) -> int:
        v = table.scalar(slot, "<i", 0)
        if not 1 <= v <= 1 << 16:
            raise flat.bad(f"{where}: {what} {v}, expected 1..65536")
        return v

    if op in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        o = {"padding": pad(), "stride": [positive(2, "stride_h"), positive(1, "stride_w")],
             "activation": act(4 if op == "DEPTHWISE_CONV_2D" else 3)}
        if op == "DEPTHWISE_CONV_2D" and t.scalar(3, "<i", 0) != 1:
            raise flat.bad(f"{where}: depth_multiplier {t.scalar(3, '<i', 0)}, expected 1")
        return o
    if op in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        return {"padding": pad(), "stride": [positive(2, "stride_h"), positive(1, "stride_w")],
                "size": [positive(4, "filter_height"), positive(3, "filter_width")],
                "activation": act(5)}
    if op in ("FULLY_CONNECTED", "ADD", "MUL", "L2_NORMALIZATION"):
        return {"activation": act(0)}
    if op in ("RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR"):
        base = 0 if op == "RESIZE_NEAREST_NEIGHBOR" else 2
        flags = [t.scalar(base + i, "<B", 0) for i in (0, 1)]
        if any(f not in (0, 1) for f in flags):
            raise flat.bad(f"{where}: resize flags {flags}, expected 0 or 1")
        return {"align_corners": bool(flags[0]), "half_pixel_centers": bool(flags[1])}
    if op == "GATHER":
        axis = t.scalar(0, "<i", 0)
        if not 0 <= axis < _MAX_RANK:
            raise flat.bad(f"{where}: gather axis {axis}, expected 0..{_MAX_RANK - 1}")
        return {"axis": axis}
    if op == "CONCATENATION":
        return {"axis": t.scalar(0, "<i", 0), "activation": act(1)}
    if op in REDUCERS:
        keep = t.scalar(0, "<B", 0)
        if keep not in (0, 1):
            raise flat.bad(f"{where}: keep_dims {keep}, expected 0 or 1")
        return {"keep_dims": bool(keep)}
    if op == "SOFTMAX":
        beta = t.f32(0, 0.0)
        if not (math.isfinite(beta) and 0 < beta <= 1e6):
            raise flat.bad(f"{where}: softmax beta {beta}, expected a finite number in (0, 1e6]")
        return {"beta": float(beta)}
    if op == "RESHAPE":
        new = t.array(0, "<i4", _MAX_RANK)
        return {"shape": None if new is None else [int(d) for d in new]}
    return {}


def _constant(buf: npt.NDArray[Any], shape: tuple[int, ...], dtype: str, name: str,
              flat: Flat) -> npt.NDArray[Any]:
    dt = np.dtype(dtype).newbyteorder("<")
    count = int(np.prod(shape, dtype=np.int64))
    if buf.size != count * dt.itemsize:
        raise flat.bad(f"constant {name!r} ({dtype} {list(shape)}) needs "
                       f"{count * dt.itemsize} bytes, its buffer holds {buf.size}")
    a = buf.view(dt).reshape(shape).astype(np.dtype(dtype))
    if dtype == "float32" and not np.isfinite(a).all():
        raise flat.bad(f"constant {name!r} holds NaN or infinite values")
    return a


def read_graph(data: bytes, what: str = "model") -> tuple[Graph, Weights]:
    """``(graph, weights)`` a ``.tflite`` file describes, checked (:meth:`Graph.validate`),
    or a :class:`SliceError` naming ``what`` and the first problem."""
    try:
        return _read(Flat(bytes(data), what, _FIELDS))
    except SliceError:
        raise
    except ConfigError as exc:  # Graph.validate / infer_shape: a graph that is not sound
        raise SliceError(f"{what}: {exc}") from None
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, RecursionError,
            MemoryError) as exc:  # a defence in depth: anything unforeseen stays typed
        raise SliceError(f"{what}: not a valid TFLite flatbuffer ({type(exc).__name__}: "
                         f"{str(exc)[:200]})") from None


def _read(flat: Flat) -> tuple[Graph, Weights]:
    if flat.size < 8 or flat.data[4:8] != b"TFL3":
        raise flat.bad(f"not a TFLite model (file identifier {flat.data[4:8]!r}, expected "
                       "b'TFL3')")
    model = flat.table(flat._at("<I", 0), "Model")
    if model.scalar(0, "<I", 0) != MODEL_VERSION:
        raise flat.bad(f"model version {model.scalar(0, '<I', 0)}, expected {MODEL_VERSION}")
    codes = []
    for oc in model.tables(1, "OperatorCode", 256):
        code, old = oc.scalar(3, "<i", 0), oc.scalar(0, "<b", 0)
        version = oc.scalar(2, "<i", 1)
        if code not in _OP_OF_CODE or old != min(code, 127):
            raise flat.bad(f"operator code {max(code, old)} is not one edge-sdk writes "
                           f"({', '.join(BUILTIN_CODES)})")
        if not 1 <= version <= _MAX_VERSION:
            raise flat.bad(f"{_OP_OF_CODE[code]} version {version}, expected 1..{_MAX_VERSION}")
        codes.append(_OP_OF_CODE[code])
    buffers: list[npt.NDArray[Any]] = []
    for b in model.tables(4, "Buffer", _MAX_TENSORS + 1):
        data = b.array(0, "u1", flat.size)  # None: no data field
        buffers.append(np.zeros(0, np.uint8) if data is None else data)
    if not buffers or buffers[0].size:
        raise flat.bad("buffer 0 must be the empty sentinel buffer")
    subgraphs = model.tables(2, "SubGraph", 2)
    if len(subgraphs) != 1:
        raise flat.bad(f"{len(subgraphs)} subgraphs, expected exactly 1")
    sg = subgraphs[0]
    tensors: list[TensorEntry] = []
    weights: Weights = {}
    used_buffers: set[int] = set()
    for i, t in enumerate(sg.tables(0, "Tensor", _MAX_TENSORS)):
        name = t.string(3)
        if not name:
            raise flat.bad(f"tensor {i} has no name")
        shape_arr = t.array(0, "<i4", _MAX_RANK)
        shape = tuple(int(d) for d in (() if shape_arr is None else shape_arr))
        if not shape or any(d <= 0 for d in shape) or np.prod(shape, dtype=np.int64) \
                > MAX_ELEMENTS:
            raise flat.bad(f"tensor {name!r}: shape {list(shape)} (expected 1 to {_MAX_RANK} "
                           f"positive dimensions, at most {MAX_ELEMENTS} elements)")
        dtype = _enum(t.scalar(1, "<b", 0), _DTYPE_OF_TYPE, f"tensor {name!r}: type", flat)
        bi = t.scalar(2, "<I", 0)
        if bi >= len(buffers):
            raise flat.bad(f"tensor {name!r}: buffer {bi} out of range ({len(buffers)} buffers)")
        weight = None
        if buffers[bi].size:
            if bi in used_buffers:
                raise flat.bad(f"tensor {name!r} shares buffer {bi} with another tensor")
            used_buffers.add(bi)
            weights[name] = _constant(buffers[bi], shape, dtype, name, flat)
            weight = name
        quant = _quant(t.sub(4, "QuantizationParameters"), shape, name, flat,
                       constant=weight is not None)
        sig = t.array(7, "<i4", _MAX_RANK)
        tensors.append((Tensor(name, shape, dtype, weight, quant),
                        None if sig is None else tuple(int(d) for d in sig)))
    names = [t.name for t, _ in tensors]

    def index(i: int, where: str) -> str:
        if not 0 <= i < len(tensors):
            raise flat.bad(f"{where}: tensor index {i} out of range ({len(tensors)} tensors)")
        return names[i]

    ops: list[Op] = []
    operand_of: dict[str, str] = {}  # the writer's operand constants -> the op they belong to
    for k, o in enumerate(sg.tables(3, "Operator", _MAX_OPS)):
        opcode = o.scalar(0, "<I", 0)
        if opcode >= len(codes):
            raise flat.bad(f"operator {k}: opcode index {opcode} out of range ({len(codes)})")
        op = codes[opcode]
        where = f"operator {k} ({op})"
        ins_arr, outs_arr = o.array(1, "<i4", 64), o.array(2, "<i4", 64)
        ins = [int(i) for i in (() if ins_arr is None else ins_arr)]
        outs = [int(i) for i in (() if outs_arr is None else outs_arr)]
        if len(outs) != 1:
            raise flat.bad(f"{where}: {len(outs)} outputs, expected 1")
        kind, _ = _OPTION_FIELDS.get(op, (None, None))
        otype = o.scalar(3, "<B", 0)
        if otype != (OPTIONS_TYPES[kind] if kind else 0):
            raise flat.bad(f"{where}: options type {otype}, expected "
                           f"{OPTIONS_TYPES[kind] if kind else 0} ({kind or 'none'})")
        options = _options(op, o.sub(4, kind or "options"), flat, where)
        # FULLY_CONNECTED's bias (input 2) may be left out: -1
        in_names: list[str | None] = [
            None if op == "FULLY_CONNECTED" and j == 2 and i == -1 else index(i, where)
            for j, i in enumerate(ins)]
        if op in OPERANDS:
            in_names = operand(op, in_names, options, weights, tensors, operand_of, flat, where)
        elif op in ("ADD", "MUL") and len(in_names) == 2 and in_names[1] in weights \
                and weights[in_names[1]].size == 1:
            # the writer's scalar operand (a graph's own constant operand of ADD / MUL has a
            # sample's shape: the runtime's raw-input normalisation, edge_sdk.answers.graph)
            options["scalar"] = scalar_operand(in_names[1], weights, tensors, operand_of,
                                               flat, where)
            in_names = in_names[:1]
        ops.append(Op(op, in_names, [index(outs[0], where)],
                      {k: v for k, v in options.items() if v is not None}))
    # the writer's int32 operands are options in the description: drop their tensors
    kept = [(t, sig) for t, sig in tensors if t.name not in operand_of]
    io: dict[str, list[str]] = {}
    for slot, ends in ((1, "inputs"), (2, "outputs")):
        arr = sg.array(slot, "<i4", 64)
        io[ends] = [index(int(i), f"subgraph {ends}") for i in (() if arr is None else arr)]
    batch_dim = _batch_dim(kept, io, flat)
    signature = _signature(model, io, names, flat)
    graph = Graph([t for t, _ in kept], ops, io["inputs"], io["outputs"], batch_dim,
                  signature, model.string(3) or "edge-sdk")
    for n in operand_of:
        weights.pop(n, None)
    graph.validate(weights)
    for gop in graph.ops:  # a reshape keeps a resizable batch only with -1 there (the writer's)
        if gop.op == "RESHAPE" and batch_dim == 0 and gop.options["shape"][0] != -1:
            raise flat.bad(f"RESHAPE {gop.outputs[0]!r} hard-codes the batch "
                           f"({gop.options['shape']}) in a graph whose batch is resizable")
    return graph, weights


def _quant(q: Table | None, shape: tuple[int, ...], name: str, flat: Flat,
           constant: bool = True) -> Quantization | None:
    """A constant's quantization is symmetric per channel; an activation's (an integer
    graph's) has one scale and one zero point in [-128, 127] (checked in full by the graph's
    validation)."""
    if q is None:
        return None
    scale, zero = q.array(2, "<f4", 1 << 16), q.array(3, "<i8", 1 << 16)
    axis = q.scalar(6, "<i", 0)
    if scale is None and zero is None:
        return None  # an empty table: no quantization
    if scale is None or zero is None or len(scale) != len(zero):
        raise flat.bad(f"tensor {name!r}: quantization needs one scale and one zero point per "
                       "channel")
    if constant and (zero != 0).any():
        raise flat.bad(f"tensor {name!r}: quantization must be symmetric (one scale and a zero "
                       "point of 0 per channel)")
    if not constant and (len(scale) != 1 or not -128 <= int(zero[0]) <= 127):
        raise flat.bad(f"tensor {name!r}: an activation's quantization is one scale and one "
                       "zero point in [-128, 127]")
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        raise flat.bad(f"tensor {name!r}: quantization scales must be finite and > 0")
    if not 0 <= axis < len(shape):
        raise flat.bad(f"tensor {name!r}: quantized dimension {axis} of a rank-{len(shape)} "
                       "tensor")
    zeros = () if constant or int(zero[0]) == 0 else (int(zero[0]),)
    return Quantization(tuple(float(s) for s in scale), int(axis), zeros)


def _batch_dim(tensors: list[TensorEntry], io: dict[str, list[str]], flat: Flat) -> int | None:
    """0 when every graph input and output's shape signature marks dimension 0 as -1 (and
    nothing else), None when none has one; any other signature is refused."""
    ends = set(io["inputs"]) | set(io["outputs"])
    marked: set[str] = set()
    for t, sig in tensors:
        if sig is None:
            continue
        if t.name not in ends or len(sig) != len(t.shape) or tuple(sig[1:]) != t.shape[1:] \
                or sig[0] not in (-1, t.shape[0]):
            raise flat.bad(f"tensor {t.name!r}: shape signature {list(sig)} (only a graph "
                           "input or output may have one, -1 in dimension 0 alone)")
        if sig[0] == -1:
            marked.add(t.name)
    if not marked:
        return None
    if marked != ends:
        raise flat.bad("only some graph inputs and outputs have a resizable batch")
    return 0


def _signature(model: Table, io: dict[str, list[str]], names: list[str], flat: Flat) -> str:
    sigs = model.tables(7, "SignatureDef", 2)
    if not sigs:
        return "serving_default"
    if len(sigs) != 1 or sigs[0].scalar(4, "<I", 0) != 0:
        raise flat.bad("expected one signature, of subgraph 0")
    s = sigs[0]
    for slot, kind in ((0, "inputs"), (1, "outputs")):
        mapped = []
        for m in s.tables(slot, "TensorMap", 64):
            i = m.scalar(1, "<I", 0)
            if i >= len(names) or not m.string(0):
                raise flat.bad(f"signature {kind}: tensor index {i} out of range or unnamed")
            mapped.append(names[i])
        if mapped != io[kind]:
            raise flat.bad(f"signature {kind} {mapped} are not the subgraph's {io[kind]}")
    return s.string(2) or "serving_default"
