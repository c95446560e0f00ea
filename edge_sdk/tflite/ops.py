"""The ops of the graph description (:mod:`edge_sdk.tflite.graph`): which ops it holds, the options
each takes, and each op's output shape. :func:`infer_shape` is the one place that knows an op's
output shape; :meth:`edge_sdk.tflite.graph.Graph.validate` runs it over every
op of a graph, the writer and reader through it. The ops beyond convs and linears take their shapes
from :func:`out_shape` after :func:`infer_shape` has checked that every input is a float32
tensor: MUL with broadcasting (squeeze-excitation gates), PADV2 (max pooling's padding), SLICE
(one group's filter rows), GATHER (one group's input channels), RESIZE_NEAREST_NEIGHBOR /
RESIZE_BILINEAR (upsampling). numpy only."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence, SupportsInt, TYPE_CHECKING

import numpy as np

from edge_sdk.errors import ConfigError

if TYPE_CHECKING:
    from edge_sdk.tflite.tensors import Tensor

ACTIVATIONS = (None, "relu", "relu6")
PADDINGS = ("SAME", "VALID")
# op -> the options it takes (and their defaults); an option not listed is refused
OPS: dict[str, dict[str, Any]] = {
    "CONV_2D": {"stride": 1, "padding": "VALID", "activation": None},
    "DEPTHWISE_CONV_2D": {"stride": 1, "padding": "VALID", "activation": None},
    "FULLY_CONNECTED": {"activation": None},
    "ADD": {"activation": None, "scalar": None},
    "CONCATENATION": {"axis": -1, "activation": None},
    "MAX_POOL_2D": {"size": 2, "stride": None, "padding": "VALID", "activation": None},
    "AVERAGE_POOL_2D": {"size": 2, "stride": None, "padding": "VALID", "activation": None},
    "MEAN": {"axes": [1, 2], "keep_dims": False},
    "RESHAPE": {"shape": None},
    "PAD": {"paddings": None},
    "RELU": {}, "RELU6": {}, "DEQUANTIZE": {},
    # float32 -> int8 at an integer graph's input (edge_sdk.tflite.integer)
    "QUANTIZE": {},
    # a uint8 input (raw pixels) to float32, the runtime's in-graph normalisation
    # (edge_sdk/answers/graph.py)
    "CAST": {},
    "SOFTMAX": {"beta": 1.0},
    # squeeze-excitation gates, SiLU and Hardswish, padded max pooling
    # MUL broadcasts (a [N, 1, 1, C] gate times [N, H, W, C]); with ``scalar`` it takes one
    # input and multiplies it by that number (the writer makes the float32 [1] constant, as
    # it makes PAD's paddings)
    "MUL": {"activation": None, "scalar": None},
    "LOGISTIC": {}, "HARD_SWISH": {},
    "PADV2": {"paddings": None, "value": 0.0},  # PAD with ``value`` (max pooling's padding)
    # a box of a constant (size -1: to the end): one group's filter rows and bias
    "SLICE": {"begin": None, "size": None},
    # the ``indices`` along ``axis``: one group's input channels (SLICE of a value whose batch
    # is resized fails in TFLite: its output keeps the recorded shape)
    "GATHER": {"axis": 0, "indices": None},
    # upsampling to ``size`` (H, W); torch's align_corners=False is half_pixel_centers for
    # bilinear (nearest with integer factors: neither)
    "RESIZE_NEAREST_NEIGHBOR": {"size": None, "align_corners": False,
                                "half_pixel_centers": False},
    "RESIZE_BILINEAR": {"size": None, "align_corners": False, "half_pixel_centers": False},
    # the out-of-distribution score the runtime appends (edge_sdk/answers/ood_graph.py): unit
    # features (the last dimension), the nearest bank row, the largest probability and its log
    "L2_NORMALIZATION": {},
    "REDUCE_MAX": {"axes": [1], "keep_dims": False},
    "REDUCE_MIN": {"axes": [1], "keep_dims": False},
    "LOG": {},
}
#: the reductions over ``axes`` (their operand), with ReducerOptions' ``keep_dims``
REDUCERS = ("MEAN", "REDUCE_MAX", "REDUCE_MIN")
#: ops whose option ``scalar`` replaces their second input (a float32 [1] constant in the file)
SCALAR_OPS = ("ADD", "MUL")
#: ops with int8 kernels: the ops of an integer graph (edge_sdk.tflite.integer), whose
#: activations are int8 from the QUANTIZE after its input to the DEQUANTIZE before its outputs
INT8_KERNELS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD",
                          "CONCATENATION", "MAX_POOL_2D", "AVERAGE_POOL_2D", "MEAN", "RESHAPE",
                          "PAD", "RELU", "RELU6", "DEQUANTIZE"})


# ------------------------------------------------------------------------------ shapes
def pair(v: int | Sequence[int] | None, what: str) -> tuple[int, int]:
    """``2`` and ``[2, 2]`` -> (2, 2); anything else positive-int-pair-like or a ConfigError."""
    p = (v, v) if isinstance(v, (int, np.integer)) else tuple(v) if v is not None else ()
    if len(p) != 2 or not all(isinstance(x, (int, np.integer)) and x >= 1 for x in p):
        raise ConfigError(f"{what} must be a positive int or [h, w], got {v!r}")
    return int(p[0]), int(p[1])


def window_hw(hw: tuple[int, int], k: tuple[int, int], stride: tuple[int, int], padding: str,
              what: str) -> tuple[int, int]:
    """Output height and width of a conv or pool window (TFLite's SAME/VALID rules)."""
    if padding not in PADDINGS:
        raise ConfigError(f"{what}: padding must be SAME or VALID, got {padding!r}")
    (h, w), (kh, kw), (sh, sw) = hw, k, stride
    if padding == "SAME":
        return -(-h // sh), -(-w // sw)
    if h < kh or w < kw:
        raise ConfigError(f"{what}: VALID window {list(k)} does not fit an input of size "
                          f"{list(hw)}")
    return (h - kh) // sh + 1, (w - kw) // sw + 1


def _need(t: Tensor | None, what: str, rank: int | None = None, dtype: str = "float32",
          ) -> tuple[int, ...]:
    if t is None:
        raise ConfigError(f"{what} is missing")
    if t.dtype != dtype:
        raise ConfigError(f"{what} {t.name!r} must be {dtype}, got {t.dtype}")
    if rank is not None and len(t.shape) != rank:
        raise ConfigError(f"{what} {t.name!r} must have rank {rank}, got {list(t.shape)}")
    return tuple(t.shape)


def _filter(t: Tensor | None, what: str, rank: int, int8_ok: bool, axis: int | None = None
            ) -> tuple[int, ...]:
    """A float32 filter, or (hybrid route) an int8 constant quantized per channel on axis 0;
    ``axis``: an integer op's filter, int8 per channel on that axis."""
    if axis is not None:
        if t is None or t.weight is None or t.quant is None or t.quant.axis != axis:
            raise ConfigError(f"{what}: an int8 kernel's filter is an int8 constant quantized "
                              f"per channel on axis {axis}")
        return _need(t, what, rank, "int8")
    if t is not None and t.dtype == "int8" and int8_ok:
        if t.quant is None or t.quant.axis != 0:
            raise ConfigError(f"{what} {t.name!r}: an int8 filter needs per-channel "
                              "quantization on axis 0")
        return _need(t, what, rank, "int8")
    return _need(t, what, rank)


def _bias(t: Tensor | None, channels: int, what: str, act: str = "float32") -> None:
    want = "int32" if act == "int8" else "float32"  # an int8 kernel's bias: int32, quantized
    if act == "int8" and (t is None or t.weight is None or t.quant is None):
        raise ConfigError(f"{what}: an int8 kernel needs an int32 bias constant with its scales")
    if t is not None and (t.dtype != want or tuple(t.shape) != (channels,)):
        raise ConfigError(f"{what} bias {t.name!r} must be {want} [{channels}], got "
                          f"{t.dtype} {list(t.shape)}")


def infer_shape(op: str, ins: Sequence[Tensor | None], options: Mapping[str, Any],
                name: str = "?") -> tuple[tuple[int, ...], str]:
    """(output shape, dtype) of ``op`` on ``ins``; a ConfigError naming the op otherwise."""
    what = f"{op} {name!r}"
    if op not in OPS:
        raise ConfigError(f"{what}: unsupported op (supported: {', '.join(OPS)})")
    unknown = set(options) - set(OPS[op])
    if unknown:
        raise ConfigError(f"{what}: unknown options {sorted(unknown)} (takes "
                          f"{sorted(OPS[op]) or 'none'})")
    opt = {**OPS[op], **options}
    if opt.get("activation", None) not in ACTIVATIONS:
        raise ConfigError(f"{what}: activation must be relu, relu6 or None, got "
                          f"{opt['activation']!r}")
    arity = {"FULLY_CONNECTED": (2, 3), "CONV_2D": (2, 3), "DEPTHWISE_CONV_2D": (2, 3),
             "ADD": (2, 2), "CONCATENATION": (1, 64), "MUL": (2, 2)}.get(op, (1, 1))
    if op in SCALAR_OPS and opt.get("scalar") is not None:
        if not isinstance(opt["scalar"], (int, float)) or not np.isfinite(opt["scalar"]):
            raise ConfigError(f"{what}: scalar must be a finite number, got {opt['scalar']!r}")
        arity = (1, 1)
    if not arity[0] <= len(ins) <= arity[1]:
        raise ConfigError(f"{what}: takes {arity[0]}..{arity[1]} inputs, got {len(ins)}")
    x = ins[0]
    # an int8 activation in: the op runs its int8 kernel and puts out int8
    act = "int8" if x is not None and x.dtype == "int8" and x.weight is None else "float32"
    if act == "int8" and op not in INT8_KERNELS:
        raise ConfigError(f"{what}: no int8 kernel for this op here (int8 activations feed "
                          f"{', '.join(sorted(INT8_KERNELS))})")
    if op in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        n, h, w, c = _need(x, f"{what} input", 4, act)
        dw = op == "DEPTHWISE_CONV_2D"
        o, kh, kw, i = _filter(ins[1], f"{what} filter", 4, int8_ok=not dw,
                               axis=(3 if dw else 0) if act == "int8" else None)
        if (dw and (o != 1 or i != c)) or (not dw and i != c):
            raise ConfigError(f"{what}: filter {[o, kh, kw, i]} does not fit an input with {c} "
                              f"channels (expected {[1, kh, kw, c] if dw else [o, kh, kw, c]})")
        out_c = c if dw else o
        _bias(ins[2] if len(ins) > 2 else None, out_c, what, act)
        hw = window_hw((h, w), (kh, kw), pair(opt["stride"], f"{what} stride"), opt["padding"],
                       what)
        return (n, *hw, out_c), act
    if op == "FULLY_CONNECTED":
        n, i = _need(x, f"{what} input", 2, act)
        o, wi = _filter(ins[1], f"{what} weights", 2, int8_ok=True,
                        axis=0 if act == "int8" else None)
        if wi != i:
            raise ConfigError(f"{what}: weights take {wi} inputs, the input has {i}")
        _bias(ins[2] if len(ins) > 2 else None, o, what, act)
        return (n, o), act
    if op in SCALAR_OPS and opt.get("scalar") is not None:
        return _need(x, f"{what} input"), "float32"
    if op in SHAPES:  # the ops beyond convs and linears (out_shape, below)
        return out_shape(op, [_need(t, f"{what} input") for t in ins], opt,
                                   what), "float32"
    if op == "ADD":
        a, b = _need(x, f"{what} input", dtype=act), _need(ins[1], f"{what} input", dtype=act)
        if a != b:  # no broadcasting: residual additions have equal shapes
            raise ConfigError(f"{what}: ADD needs equal shapes, got {list(a)} and {list(b)}")
        return a, act
    if op == "CONCATENATION":
        shapes = [_need(t, f"{what} input", dtype=act) for t in ins]
        rank = len(shapes[0])
        axis = opt["axis"] % rank if -rank <= opt["axis"] < rank else None
        if axis is None or any(len(s) != rank or s[:axis] + s[axis + 1:] !=
                               shapes[0][:axis] + shapes[0][axis + 1:] for s in shapes):
            raise ConfigError(f"{what}: cannot concatenate {[list(s) for s in shapes]} on axis "
                              f"{opt['axis']}")
        return (*shapes[0][:axis], sum(s[axis] for s in shapes), *shapes[0][axis + 1:]), act
    if op in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        n, h, w, c = _need(x, f"{what} input", 4, act)
        k = pair(opt["size"], f"{what} size")
        s = pair(opt["stride"] if opt["stride"] is not None else opt["size"], f"{what} stride")
        return (n, *window_hw((h, w), k, s, opt["padding"], what), c), act
    if op in REDUCERS:
        shape = _need(x, f"{what} input", dtype=act)
        axes = {int(a) % len(shape) for a in opt["axes"] if -len(shape) <= int(a) < len(shape)}
        if len(axes) != len(list(opt["axes"])) or not axes:
            raise ConfigError(f"{what}: axes {opt['axes']} must be distinct dimensions of "
                              f"{list(shape)}")
        return tuple(1 if d in axes else s for d, s in enumerate(shape)
                     if opt["keep_dims"] or d not in axes), act
    if op == "RESHAPE":
        return _reshape(_need(x, f"{what} input", dtype=act), opt["shape"], what), act
    if op == "PAD":
        shape = _need(x, f"{what} input", dtype=act)
        p = np.asarray(opt["paddings"] if opt["paddings"] is not None else [], dtype=np.int64)
        if p.shape != (len(shape), 2) or (p < 0).any():
            raise ConfigError(f"{what}: paddings must be {len(shape)} non-negative "
                              f"[before, after] pairs, got {opt['paddings']}")
        return tuple(d + int(a) + int(b) for d, (a, b) in zip(shape, p)), act
    if op == "CAST":
        if x is None or x.dtype != "uint8" or x.weight is not None:
            raise ConfigError(f"{what}: the input must be a uint8 tensor that is not a constant")
        return tuple(x.shape), "float32"
    if op == "DEQUANTIZE":  # an int8 constant (a filter), or an integer graph's output
        if x is None or x.dtype != "int8" or x.quant is None:
            raise ConfigError(f"{what}: the input must be a quantized int8 tensor")
        return tuple(x.shape), "float32"
    if op == "QUANTIZE":
        if x is None or x.dtype != "float32" or x.weight is not None:
            raise ConfigError(f"{what}: the input must be a float32 tensor that is not a "
                              "constant")
        return tuple(x.shape), "int8"
    # RELU, RELU6, SOFTMAX, LOGISTIC, HARD_SWISH, L2_NORMALIZATION, LOG
    return _need(x, f"{what} input", dtype=act), act


def _reshape(old: tuple[int, ...], option: Iterable[SupportsInt], what: str) -> tuple[int, ...]:
    """One dimension may be -1 (inferred at every resize: how the batch stays resizable)."""
    try:
        shape = tuple(int(d) for d in option)
    except TypeError:
        raise ConfigError(f"{what}: option shape must be a list of ints, got {option!r}") from None
    total = int(np.prod(old))
    if shape.count(-1) > 1 or any(d == 0 or d < -1 for d in shape):
        raise ConfigError(f"{what}: reshape to {list(shape)}: dimensions must be > 0, one may "
                          "be -1")
    known = int(np.prod([d for d in shape if d != -1]))
    static = tuple(total // known if d == -1 else d for d in shape)
    if total % known or int(np.prod(static)) != total:
        raise ConfigError(f"{what}: cannot reshape {list(old)} to {list(shape)}")
    return static


# ---------------------------------------------------------------- beyond convs and linears
SHAPES = ("MUL", "PADV2", "SLICE", "GATHER", "RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR")


def _rank(shape: tuple[int, ...], rank: int, what: str) -> tuple[int, ...]:
    if len(shape) != rank:
        raise ConfigError(f"{what} input must have rank {rank}, got {list(shape)}")
    return shape


def out_shape(op: str, shapes: Sequence[tuple[int, ...]], opt: Mapping[str, Any],
              what: str) -> tuple[int, ...]:
    """The output shape of ``op`` (one of :data:`SHAPES`) on inputs of ``shapes``."""
    if op == "MUL":
        a, b = shapes[0], shapes[1]
        if len(a) != len(b) or any(p != q and 1 not in (p, q) for p, q in zip(a, b)):
            raise ConfigError(f"{what}: cannot broadcast {list(a)} and {list(b)} (same rank, "
                              "each dimension equal or 1)")
        return tuple(max(p, q) for p, q in zip(a, b))
    if op == "PADV2":
        shape = shapes[0]
        if not isinstance(opt["value"], (int, float)) or np.isnan(opt["value"]):
            raise ConfigError(f"{what}: value must be a number, got {opt['value']!r}")
        p = np.asarray(opt["paddings"] if opt["paddings"] is not None else [], dtype=np.int64)
        if p.shape != (len(shape), 2) or (p < 0).any():
            raise ConfigError(f"{what}: paddings must be {len(shape)} non-negative "
                              f"[before, after] pairs, got {opt['paddings']}")
        return tuple(d + int(a) + int(b) for d, (a, b) in zip(shape, p))
    if op in ("RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR"):
        n, h, w, c = _rank(shapes[0], 4, what)
        size = opt["size"]
        if not isinstance(size, (list, tuple)) or len(size) != 2 or not all(
                isinstance(v, (int, np.integer)) and 0 < v <= 1 << 16 for v in size):
            raise ConfigError(f"{what}: size must be [height, width], got {size!r}")
        if opt["align_corners"] and opt["half_pixel_centers"]:
            raise ConfigError(f"{what}: align_corners and half_pixel_centers exclude each other")
        return (n, int(size[0]), int(size[1]), c)
    if op == "GATHER":
        shape = shapes[0]
        axis = opt["axis"]
        idx = np.asarray(opt["indices"] if opt["indices"] is not None else [], dtype=np.int64)
        if not isinstance(axis, int) or not 0 <= axis < len(shape) or idx.ndim != 1 or \
                not idx.size or (idx < 0).any() or (idx >= shape[axis]).any():
            raise ConfigError(f"{what}: indices must be a non-empty vector within dimension "
                              f"{axis} of {list(shape)}")
        return (*shape[:axis], int(idx.size), *shape[axis + 1:])
    if op == "SLICE":
        shape = shapes[0]
        try:
            begin, size = [int(v) for v in opt["begin"]], [int(v) for v in opt["size"]]
        except (TypeError, ValueError):
            raise ConfigError(f"{what}: begin and size must be lists of ints, got "
                              f"{opt['begin']!r} and {opt['size']!r}") from None
        if len(begin) != len(shape) or len(size) != len(shape):
            raise ConfigError(f"{what}: begin and size need {len(shape)} entries each")
        out = tuple(d - b if n == -1 else n for d, b, n in zip(shape, begin, size))
        if any(b < 0 or n < -1 or n == 0 or b + o > d
               for d, b, n, o in zip(shape, begin, size, out)) or min(out) <= 0:
            raise ConfigError(f"{what}: begin {begin} size {size} is outside {list(shape)}")
        return out
    raise ConfigError(f"{what}: not an op of edge_sdk.tflite.ops")
