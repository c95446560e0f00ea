"""(graph description, weights) -> ``.tflite`` bytes, with numpy and ``flatbuffers`` only.

No TensorFlow, no converter and no generated schema module (ai-edge-litert's is absent from
tflite-runtime): the dozen tables a float/int8 inference graph needs are written here with
``flatbuffers.Builder``, field by field. Field numbers and enum values are those of TFLite's
``schema.fbs`` (tests/edge_sdk/test_tflite_writer.py checks every one against ai-edge-litert's
generated module where it is installed):

    Model           version 0, operator_codes 1, subgraphs 2, description 3, buffers 4,
                    signature_defs 7
    OperatorCode    deprecated_builtin_code 0 (int8), version 2 (int32), builtin_code 3 (int32)
    SubGraph        tensors 0, inputs 1, outputs 2, operators 3, name 4
    Tensor          shape 0, type 1 (int8), buffer 2 (uint32), name 3, quantization 4,
                    shape_signature 7
    QuantizationParameters  scale 2 ([float32]), zero_point 3 ([int64]), quantized_dimension 6
    Buffer          data 0 ([ubyte], force_align 16)
    Operator        opcode_index 0 (uint32), inputs 1, outputs 2, builtin_options_type 3
                    (uint8), builtin_options 4
    SignatureDef    inputs 0, outputs 1, signature_key 2, subgraph_index 4
    TensorMap       name 0, tensor_index 1 (uint32)

The gotchas a runtime enforces, each marked ``(gotcha)``: buffer 0 is the empty
sentinel, model version 3, the ``TFL3`` identifier, both builtin code fields, op versions that
match the data (an old runtime then refuses what it cannot compute instead of computing garbage),
int64 zero points, 16-byte aligned buffer data, a zero bias for convs that have none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, TYPE_CHECKING

import flatbuffers
import numpy as np
import numpy.typing as npt

from edge_sdk.tflite.graph import Graph, check_weight
from edge_sdk.tflite.ops import OPS, REDUCERS, pair
from edge_sdk.tflite.schema import BUILTIN_CODES, MODEL_VERSION, OPTIONS_TYPES, TENSOR_TYPES

if TYPE_CHECKING:
    from edge_sdk.tflite.tensors import Quantization

__all__ = ["write_tflite"]

_PADDING = {"SAME": 0, "VALID": 1}  # enum Padding
_ACTIVATION = {None: 0, "relu": 1, "relu6": 3}  # enum ActivationFunctionType
_ALIGN = 16  # (gotcha) Buffer.data is force_align: 16, as TFLite's own converter writes it


@dataclass
class _T:
    """A tensor as written: the description's, or an int32 constant the writer adds."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: npt.NDArray[Any] | None = None
    quant: Quantization | None = None
    signature: tuple[int, ...] | None = None


# one scalar field of an options table: (kind, slot, value, schema default), kind naming the
# flatbuffers Builder's Prepend<kind>Slot
_Field = tuple[str, int, object, object]
# an op as planned: (name, version, input indices, output indices, options)
_PlannedOp = tuple[str, int, list[int], list[int], dict[str, Any]]


# ---- options tables: fn(builder, options) -> offset, written before their Operator ---------
def _table(b: flatbuffers.Builder, fields: list[_Field]) -> int:
    """One table of scalar fields ``(kind, slot, value, schema default)``; a value equal to its
    default is left out, as flatc's builders do (readers return the default)."""
    b.StartObject(max((f[1] for f in fields), default=-1) + 1)
    for kind, slot, value, default in fields:
        getattr(b, f"Prepend{kind}Slot")(slot, value, default)
    end: int = b.EndObject()
    return end


def _window(o: dict[str, Any], depthwise: bool = False) -> list[_Field]:
    sh, sw = pair(o.get("stride", 1), "stride")
    act_slot = 4 if depthwise else 3
    fields: list[_Field] = [("Int8", 0, _PADDING[o.get("padding", "VALID")], 0),
                            ("Int32", 1, sw, 0),
              ("Int32", 2, sh, 0), ("Int8", act_slot, _ACTIVATION[o.get("activation")], 0)]
    if depthwise:
        fields.append(("Int32", 3, 1, 0))  # depth_multiplier: one output per input channel
    return fields


def _pool(o: dict[str, Any]) -> list[_Field]:
    kh, kw = pair(o.get("size", 2), "size")
    sh, sw = pair(o.get("stride") or o.get("size", 2), "stride")
    return [("Int8", 0, _PADDING[o.get("padding", "VALID")], 0), ("Int32", 1, sw, 0),
            ("Int32", 2, sh, 0), ("Int32", 3, kw, 0), ("Int32", 4, kh, 0),
            ("Int8", 5, _ACTIVATION[o.get("activation")], 0)]


def _act(o: dict[str, Any], slot: int = 0) -> list[_Field]:
    return [("Int8", slot, _ACTIVATION[o.get("activation")], 0)]


def _reshape(b: flatbuffers.Builder, o: dict[str, Any]) -> int:
    shape = b.CreateNumpyVector(np.asarray(o["shape"], np.int32))
    b.StartObject(1)
    b.PrependUOffsetTRelativeSlot(0, shape, 0)  # new_shape (the shape tensor is input 1 too)
    end: int = b.EndObject()
    return end


# op -> (options type name, its fields from the op's options); RESHAPE: _reshape
_OPTIONS: dict[str, tuple[str, Callable[[dict[str, Any]], list[_Field]]]] = {
    "CONV_2D": ("Conv2DOptions", _window),
    "DEPTHWISE_CONV_2D": ("DepthwiseConv2DOptions", lambda o: _window(o, depthwise=True)),
    "FULLY_CONNECTED": ("FullyConnectedOptions", _act),
    "ADD": ("AddOptions", _act),
    "CONCATENATION": ("ConcatenationOptions",
                      lambda o: [("Int32", 0, int(o.get("axis", -1)), 0)] + _act(o, 1)),
    "MAX_POOL_2D": ("Pool2DOptions", _pool),
    "AVERAGE_POOL_2D": ("Pool2DOptions", _pool),
    **{op: ("ReducerOptions", lambda o: [("Bool", 0, bool(o.get("keep_dims", False)), False)])
       for op in REDUCERS},
    "L2_NORMALIZATION": ("L2NormOptions", _act),
    "PAD": ("PadOptions", lambda o: []),
    "PADV2": ("PadV2Options", lambda o: []),
    "MUL": ("MulOptions", _act),
    "GATHER": ("GatherOptions", lambda o: [("Int32", 0, int(o.get("axis", 0)), 0)]),
    "RESIZE_NEAREST_NEIGHBOR": ("ResizeNearestNeighborOptions", lambda o: [
        ("Bool", 0, bool(o.get("align_corners", False)), False),
        ("Bool", 1, bool(o.get("half_pixel_centers", False)), False)]),
    "RESIZE_BILINEAR": ("ResizeBilinearOptions", lambda o: [  # slots 0, 1: deprecated sizes
        ("Bool", 2, bool(o.get("align_corners", False)), False),
        ("Bool", 3, bool(o.get("half_pixel_centers", False)), False)]),
    "DEQUANTIZE": ("DequantizeOptions", lambda o: []),
    "QUANTIZE": ("QuantizeOptions", lambda o: []),
    "SOFTMAX": ("SoftmaxOptions", lambda o: [("Float32", 0, float(o.get("beta", 1.0)), 0.0)]),
}


# the versions TFLite's op_version.cc gives ops on int8 activations
_INT8_VERSIONS = {"CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 4, "ADD": 2,
                  "CONCATENATION": 2, "MAX_POOL_2D": 2, "AVERAGE_POOL_2D": 2, "MEAN": 2,
                  "PAD": 2, "RELU": 2, "RELU6": 2, "RESHAPE": 1}


def _version(op: str, ins: list[_T | None]) -> int:
    """The op version TFLite's versioning assigns to this data: 1 for float32 activations and
    filters, except (gotcha) DEQUANTIZE of int8 (2 per-tensor, 5 per-channel) and the hybrid
    route's int8 filters: CONV_2D 2 / 5, FULLY_CONNECTED 3 / 12 (tflite-runtime 2.14 computes
    per-channel hybrid FULLY_CONNECTED wrongly below version 12)."""
    x, w = (ins + [None, None])[:2]
    if x is not None and x.dtype == "int8" and x.data is None and op != "DEQUANTIZE":
        # an integer graph's int8 kernels (TFLite's op_version.cc: int8 inputs and outputs)
        return _INT8_VERSIONS.get(op, 1)
    # (Graph.validate: an int8 input of these ops is a quantized constant)
    if op == "DEQUANTIZE" and x is not None and x.dtype == "int8" and x.quant is not None:
        return 5 if len(x.quant.scale) > 1 else 2
    if op in ("CONV_2D", "FULLY_CONNECTED") and w is not None and w.dtype == "int8" \
            and w.quant is not None:
        per_channel = len(w.quant.scale) > 1
        return (5 if per_channel else 2) if op == "CONV_2D" else (12 if per_channel else 3)
    return 1


def _plan(graph: Graph, weights: Mapping[str, npt.NDArray[Any]]
          ) -> tuple[list[_T], list[_PlannedOp]]:
    """Tensors in write order and ops as ``(name, version, inputs, outputs, options)`` with
    tensor indices; adds the int32 operand constants and the convs' zero biases."""
    tensors: list[_T] = []
    index: dict[str, int] = {}

    def add(t: _T) -> int:
        base, i = t.name, 0
        while t.name in index:  # a writer-made name never shadows one of the description's
            i += 1
            t.name = f"{base}_{i}"
        index[t.name] = len(tensors)
        tensors.append(t)
        return index[t.name]

    io = set(graph.inputs) | set(graph.outputs)
    for t in graph.tensors:
        data = None if t.weight is None else check_weight(t, weights)
        sig = None
        if graph.batch_dim == 0 and t.name in io:
            sig = (-1, *t.shape[1:])  # the interpreter may resize the batch (manifest batch_dim)
        add(_T(t.name, tuple(t.shape), t.dtype, data, t.quant, sig))
    ops: list[_PlannedOp] = []
    for o in graph.ops:
        ins = [-1 if n is None else index[n] for n in o.inputs]
        out = o.outputs[0]
        if o.op in ("CONV_2D", "DEPTHWISE_CONV_2D") and (len(ins) < 3 or ins[2] < 0):
            # (gotcha) CONV_2D and DEPTHWISE_CONV_2D refuse an omitted bias at allocation ("Tensor
            # at index 2 was optional but was expected"): give them zeros.
            c = tensors[index[out]].shape[-1]
            ins = ins[:2] + [add(_T(f"{out}/zero_bias", (c,), "float32",
                                    np.zeros(c, np.float32)))]
        elif o.op == "FULLY_CONNECTED" and len(ins) == 2:
            ins.append(-1)  # optional bias left out: version 1 still
        operand = {"RESHAPE": ("shape", "shape"), "PAD": ("paddings", "paddings"),
                   "PADV2": ("paddings", "paddings"), **{r: ("axes", "axes") for r in REDUCERS},
                   "GATHER": ("indices", "indices"), "RESIZE_NEAREST_NEIGHBOR": ("size", "size"),
                   "RESIZE_BILINEAR": ("size", "size")}.get(o.op)
        if operand is not None:  # schema: these take their int32 operand as input 1
            key, suffix = operand
            v = np.asarray(o.options.get(key, OPS[o.op].get(key)), np.int32)
            if o.op in REDUCERS:
                rank = len(tensors[ins[0]].shape)
                v = np.asarray(sorted({int(a) % rank for a in v}), np.int32)
            ins.insert(1, add(_T(f"{out}/{suffix}", v.shape, "int32", v)))
        if o.op == "SLICE":  # begin and size: inputs 1 and 2
            for key in ("begin", "size"):
                v = np.asarray(o.options[key], np.int32)
                ins.append(add(_T(f"{out}/{key}", v.shape, "int32", v)))
        if o.op == "PADV2":  # input 2: the pad value
            v = np.asarray([o.options.get("value", 0.0)], np.float32)
            ins.append(add(_T(f"{out}/value", (1,), "float32", v)))
        if o.op in ("ADD", "MUL") and o.options.get("scalar") is not None:
            v = np.asarray([o.options["scalar"]], np.float32)  # broadcast against the input
            ins.append(add(_T(f"{out}/scalar", (1,), "float32", v)))
        version = _version(o.op, [None if i < 0 else tensors[i] for i in ins])
        ops.append((o.op, version, ins, [index[out]], o.options))
    return tensors, ops


def write_tflite(graph: Graph, weights: Mapping[str, npt.NDArray[Any]]) -> bytes:
    """The ``.tflite`` flatbuffer of ``graph`` with its constants taken from ``weights``.

    One subgraph ``main``, whose inputs and outputs also form the signature ``graph.signature``
    (tensor names as the signature's names). Raises :class:`ConfigError` naming the first
    problem :meth:`Graph.validate` finds (the writer never writes a graph it has not checked).
    """
    graph.validate(weights)
    tensors, ops = _plan(graph, weights)
    size = sum(0 if t.data is None else t.data.nbytes + _ALIGN for t in tensors)
    b = flatbuffers.Builder(size + 1024 * (len(tensors) + len(ops)) + 4096)

    # Buffers: 0 is the empty sentinel (gotcha); then one per constant, data aligned to 16.
    buffer_of, buffers = {}, [_table(b, [])]
    for i, t in enumerate(tensors):
        if t.data is None:
            continue
        # little-endian bytes viewed as uint8, copied only if needed (a list packs byte by byte)
        raw = np.ascontiguousarray(t.data, t.data.dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
        b.Prep(_ALIGN, raw.nbytes)  # the vector's first byte lands on a 16-byte boundary
        data = b.CreateNumpyVector(raw)
        b.StartObject(1)
        b.PrependUOffsetTRelativeSlot(0, data, 0)
        buffer_of[i] = len(buffers)
        buffers.append(b.EndObject())

    tensor_offsets = []
    for i, t in enumerate(tensors):
        name = b.CreateString(t.name)
        shape = b.CreateNumpyVector(np.asarray(t.shape, np.int32))
        sig = None if t.signature is None else b.CreateNumpyVector(np.asarray(t.signature,
                                                                              np.int32))
        quant = None
        if t.quant is not None:
            scale = b.CreateNumpyVector(np.asarray(t.quant.scale, np.float32))
            zero = b.CreateNumpyVector(np.asarray(t.quant.zero_points, np.int64))  # (gotcha) int64
            b.StartObject(7)
            b.PrependUOffsetTRelativeSlot(2, scale, 0)
            b.PrependUOffsetTRelativeSlot(3, zero, 0)
            b.PrependInt32Slot(6, t.quant.axis, 0)
            quant = b.EndObject()
        b.StartObject(8)
        b.PrependUOffsetTRelativeSlot(0, shape, 0)
        b.PrependInt8Slot(1, TENSOR_TYPES[t.dtype], 0)
        b.PrependUint32Slot(2, buffer_of.get(i, 0), 0)
        b.PrependUOffsetTRelativeSlot(3, name, 0)
        if quant is not None:
            b.PrependUOffsetTRelativeSlot(4, quant, 0)
        if sig is not None:
            b.PrependUOffsetTRelativeSlot(7, sig, 0)
        tensor_offsets.append(b.EndObject())

    codes: dict[tuple[int, int], int] = {}
    op_offsets = []
    for op, version, ins, outs, options in ops:
        code = BUILTIN_CODES[op]
        opcode = codes.setdefault((code, version), len(codes))
        table: tuple[str, int] | None = None  # (options type name, its offset)
        if op == "RESHAPE":
            table = "ReshapeOptions", _reshape(b, options)
        elif op in _OPTIONS:
            kind, fields = _OPTIONS[op]
            table = kind, _table(b, fields(options))
        vin = b.CreateNumpyVector(np.asarray(ins, np.int32))
        vout = b.CreateNumpyVector(np.asarray(outs, np.int32))
        b.StartObject(5)
        b.PrependUint32Slot(0, opcode, 0)
        b.PrependUOffsetTRelativeSlot(1, vin, 0)
        b.PrependUOffsetTRelativeSlot(2, vout, 0)
        if table is not None:
            b.PrependUint8Slot(3, OPTIONS_TYPES[table[0]], 0)
            b.PrependUOffsetTRelativeSlot(4, table[1], 0)
        op_offsets.append(b.EndObject())

    opcode_offsets = []
    for code, version in codes:  # dicts keep insertion order: index = position
        # (gotcha) both fields: readers before the 2020 schema only look at the deprecated one
        opcode_offsets.append(_table(b, [("Int8", 0, min(code, 127), 0),
                                         ("Int32", 2, version, 1), ("Int32", 3, code, 0)]))

    index = {t.name: i for i, t in enumerate(tensors)}
    sg_in = [index[n] for n in graph.inputs]
    sg_out = [index[n] for n in graph.outputs]
    sg_name = b.CreateString("main")
    v_in, v_out = (b.CreateNumpyVector(np.asarray(v, np.int32)) for v in (sg_in, sg_out))
    v_tensors, v_ops = _offsets(b, tensor_offsets), _offsets(b, op_offsets)
    b.StartObject(5)
    for slot, off in enumerate((v_tensors, v_in, v_out, v_ops, sg_name)):
        b.PrependUOffsetTRelativeSlot(slot, off, 0)
    subgraph = b.EndObject()

    maps = []
    for names, idx in ((graph.inputs, sg_in), (graph.outputs, sg_out)):
        entries = []
        for n, i in zip(names, idx):
            s = b.CreateString(n)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, s, 0)
            b.PrependUint32Slot(1, i, 0)
            entries.append(b.EndObject())
        maps.append(_offsets(b, entries))
    key = b.CreateString(graph.signature)
    b.StartObject(5)
    b.PrependUOffsetTRelativeSlot(0, maps[0], 0)
    b.PrependUOffsetTRelativeSlot(1, maps[1], 0)
    b.PrependUOffsetTRelativeSlot(2, key, 0)
    b.PrependUint32Slot(4, 0, 0)  # subgraph_index
    signature = b.EndObject()

    desc = b.CreateString(graph.description)
    v_codes, v_sgs = _offsets(b, opcode_offsets), _offsets(b, [subgraph])
    v_bufs, v_sigs = _offsets(b, buffers), _offsets(b, [signature])
    b.StartObject(8)
    b.PrependUint32Slot(0, MODEL_VERSION, 0)
    for slot, off in ((1, v_codes), (2, v_sgs), (3, desc), (4, v_bufs), (7, v_sigs)):
        b.PrependUOffsetTRelativeSlot(slot, off, 0)
    b.Finish(b.EndObject(), file_identifier=b"TFL3")  # (gotcha)
    return bytes(b.Output())


def _offsets(b: flatbuffers.Builder, offsets: list[int]) -> int:
    """A vector of tables (prepended back to front, so it reads front to back)."""
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    end: int = b.EndVector()
    return end

