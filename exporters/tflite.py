"""Hand-built TFLite flatbuffers and the point-slice exporter (exporter issue, "Writing TFLite").

No TensorFlow and no converter: :class:`GraphBuilder` fills the schema's generated object API
(``ai_edge_litert.schema_py_generated``: ``ModelT``, ``SubGraphT``, ``TensorT`` ...) and packs it.
The gotchas the issue measured are handled here, each marked ``(issue)`` where it is:
buffer 0 sentinel, ``version = 3``, ``TFL3`` identifier, both builtin codes, correct op
versions, NHWC/OHWI layouts, explicit PAD at stride 2, per-channel int8 parameters, numpy
buffer data.

:func:`export_point_slice` writes the point network of a truncated model (one graph-emission
function per registered architecture, no tracing): conv/linear weights with batch norm and the
keep-probability scale folded in (:mod:`exporters.fold`), stored as int8 with per-channel
symmetric scales and run through DEQUANTIZE -> float op (the "dequantize route"), or as float32.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from torch import nn

from edge_sdk.bundle import WEIGHT_ROUTES  # the manifest's weight routes, defined once
from edge_sdk.errors import ConfigError
from exporters.fold import fold_layer, fold_scale
from trainer.layers import BayesNestedConv2d, BayesNestedLayer, BayesNestedLinear
from trainer.models.base import NestedModel
from trainer.models.cnn import NestedCNN
from trainer.models.mobilenetv2 import NestedMobileNetV2
from trainer.models.vgg import NestedVGG

__all__ = ["ChannelQuant", "GraphBuilder", "LayerWeights", "QuantizedTensor", "SIGNATURE_KEY",
           "export_point_slice", "graph_stats", "prepare_weights", "quantize_per_channel"]

SIGNATURE_KEY = "serving_default"
INPUT_NAME = "input"
OUTPUT_NAME = "logits"

_OP = schema.BuiltinOperator
_OP_NAMES = {v: k for k, v in vars(_OP).items() if not k.startswith("_")}
_TYPES = {np.dtype(np.float32): schema.TensorType.FLOAT32,
          np.dtype(np.int8): schema.TensorType.INT8,
          np.dtype(np.int32): schema.TensorType.INT32}
_ACT = {None: schema.ActivationFunctionType.NONE, "relu": schema.ActivationFunctionType.RELU,
        "relu6": schema.ActivationFunctionType.RELU6}
_PADDING = {"SAME": schema.Padding.SAME, "VALID": schema.Padding.VALID}
_INT8_MAX = 127  # symmetric: -128 is never used, so the grid is the same on both sides


# ------------------------------------------------------------------------------- quantization
@dataclass(frozen=True)
class ChannelQuant:
    """Per-channel symmetric int8 parameters of a constant tensor (zero points are all 0)."""

    scale: np.ndarray  # float32, one per channel along ``axis``
    axis: int


@dataclass
class QuantizedTensor:
    """``values * scale`` (broadcast along ``axis``) is what DEQUANTIZE computes, in float32.

    ``exact`` says whether that product equals the target bit for bit (see
    :func:`quantize_per_channel`).
    """

    values: np.ndarray  # int8, in [-127, 127]
    scale: np.ndarray  # float32 [channels]
    axis: int
    exact: bool

    def dequantize(self) -> np.ndarray:
        return self.values.astype(np.float32) * _along(self.scale, self.axis, self.values.ndim)


def _along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def _pow2_at_least(x: np.ndarray) -> np.ndarray:
    """The smallest power of two >= x (float64, x > 0), computed exactly (frexp, no log2)."""
    mant, exp = np.frexp(x)  # x = mant * 2^exp, 0.5 <= mant < 1
    return np.ldexp(1.0, np.where(mant == 0.5, exp - 1, exp))


def quantize_per_channel(w: np.ndarray, axis: int, pow2_step: bool = False,
                         channel_scale: np.ndarray | None = None) -> QuantizedTensor:
    """Symmetric int8 per channel along ``axis``: ``w ~ q * step`` with ``|q| <= 127``.

    The step is ``max|w_c| / 127`` (float32), or with ``pow2_step`` the smallest power of two
    with ``max|w_c| / step <= 127``: then any value that is a multiple of the step, e.g. a sum of
    powers of two no finer than it (PWFN's codebook), is represented exactly.

    ``channel_scale`` (float32, one per channel) multiplies the step: the stored scale is
    ``step * channel_scale``. Pass the *unfolded* codebook values as ``w`` and the fold scale
    here, and DEQUANTIZE yields ``float32(w) * channel_scale`` exactly when ``q * step == w``
    (a power-of-two factor commutes with float32 rounding), which is the exporter issue's check
    "int8 x scale == codebook value x fold scale".

    ``exact`` is whether ``q * scale`` (float32, as the runtime computes it) equals the target
    ``float32(w) [* channel_scale]`` for every element. An all-zero channel gets step 1.
    """
    w = np.asarray(w)
    if w.ndim == 0 or not -w.ndim <= axis < w.ndim:
        raise ConfigError(f"axis {axis} is out of range for a weight of shape {w.shape}")
    axis %= w.ndim
    if not np.isfinite(w).all():
        raise ConfigError("cannot quantize a weight with non-finite values")
    channels = w.shape[axis]
    w32 = w.astype(np.float32)
    amax = np.abs(np.moveaxis(w32, axis, 0).reshape(channels, -1)).max(axis=1).astype(np.float64)
    if pow2_step:
        # amax is a float32, so the float64 quotient keeps amax <= 127 * step exact.
        step = np.where(amax > 0, _pow2_at_least(np.where(amax > 0, amax, 1.0) / _INT8_MAX), 1.0)
    else:
        step = np.where(amax > 0, amax / _INT8_MAX, 1.0)
    step = step.astype(np.float32)
    q = np.clip(np.rint(w32 / _along(step, axis, w.ndim)), -_INT8_MAX, _INT8_MAX).astype(np.int8)

    if channel_scale is None:
        scale, target = step, w32
    else:
        cs = np.asarray(channel_scale, dtype=np.float32).reshape(-1)
        if cs.shape != (channels,):
            raise ConfigError(f"channel_scale has {cs.size} entries, expected {channels}")
        scale = step * cs
        target = w32 * _along(cs, axis, w.ndim)
    out = QuantizedTensor(q, scale.astype(np.float32), axis, exact=False)
    out.exact = bool(np.array_equal(out.dequantize(), target))
    return out


# ------------------------------------------------------------------------------- graph builder
@dataclass
class _Op:
    code: int
    inputs: list[int]
    outputs: list[int]
    options_type: int = schema.BuiltinOptions.NONE
    options: object = None


class _AlignedBuilder(flatbuffers.Builder):
    """Aligns byte vectors (buffer data) to 16 bytes, as the schema's ``force_align: 16`` asks
    and TFLite's own converter does; the generated Python code aligns them to 1."""

    def CreateNumpyVector(self, x):  # noqa: N802 (flatbuffers' name)
        if x.dtype == np.uint8:
            self.Prep(16, x.nbytes)
        return super().CreateNumpyVector(x)


class GraphBuilder:
    """One float32 subgraph built op by op; every method returns the output tensor's index.

    Activations are float32 NHWC. Constant filters must be float32: int8 weights go through
    :meth:`dequantize` first (hybrid ops are not emitted yet). Shapes are inferred, so a
    mismatch fails here with a message rather than inside the interpreter.
    """

    def __init__(self) -> None:
        self._tensors: list[schema.TensorT] = []
        self._shapes: list[tuple[int, ...]] = []
        self._dtypes: list[np.dtype] = []
        self._quant: list[ChannelQuant | None] = []
        self._buffers = [schema.BufferT()]  # (issue) buffer 0 is the empty sentinel
        self._ops: list[_Op] = []
        self._inputs: list[tuple[str, int]] = []
        self._outputs: list[tuple[str, int]] = []
        self._names: set[str] = set()

    # ---- tensors ---------------------------------------------------------------------------
    def shape(self, t: int) -> tuple[int, ...]:
        return self._shapes[t]

    def dtype(self, t: int) -> np.dtype:
        return self._dtypes[t]

    def _tensor(self, name: str, shape: Sequence[int], dtype, buffer: int = 0,
                quant: ChannelQuant | None = None) -> int:
        if name in self._names:
            raise ConfigError(f"tensor name {name!r} is used twice")
        dtype = np.dtype(dtype)
        if dtype not in _TYPES:
            raise ConfigError(f"tensor {name!r}: dtype {dtype} is not supported "
                              f"(supported: {', '.join(map(str, _TYPES))})")
        shape = tuple(int(d) for d in shape)
        if any(d <= 0 for d in shape):
            raise ConfigError(f"tensor {name!r}: shape {shape} has a non-positive dimension")
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name, list(shape), _TYPES[dtype], buffer
        if quant is not None:
            q = schema.QuantizationParametersT()
            q.scale = np.asarray(quant.scale, np.float32)
            q.zeroPoint = np.zeros(len(q.scale), np.int64)  # (issue) int64 zero points, all 0
            q.quantizedDimension = quant.axis
            t.quantization = q
        self._names.add(name)
        self._tensors.append(t)
        self._shapes.append(shape)
        self._dtypes.append(dtype)
        self._quant.append(quant)
        return len(self._tensors) - 1

    def add_input(self, name: str, shape: Sequence[int], dtype=np.float32) -> int:
        t = self._tensor(name, shape, dtype)
        self._inputs.append((name, t))
        return t

    def add_const(self, array: np.ndarray, name: str, quant: ChannelQuant | None = None) -> int:
        """A constant; ``quant`` marks an int8 array as per-channel symmetric quantized."""
        array = np.ascontiguousarray(array)
        if quant is not None:
            if array.dtype != np.int8:
                raise ConfigError(f"{name!r}: quantized constants must be int8, got {array.dtype}")
            if not 0 <= quant.axis < array.ndim or len(quant.scale) != array.shape[quant.axis]:
                raise ConfigError(f"{name!r}: {len(quant.scale)} scales for axis {quant.axis} of "
                                  f"shape {array.shape}")
            if not (np.isfinite(quant.scale).all() and (np.asarray(quant.scale) > 0).all()):
                raise ConfigError(f"{name!r}: quantization scales must be finite and > 0")
            if (array == -128).any():  # (issue) clamp to +-127: symmetric grid
                raise ConfigError(f"{name!r}: int8 value -128 is outside the symmetric range")
        buf = schema.BufferT()
        # (issue) a numpy uint8 array packs in one copy; a list packs byte by byte (0.5 s/MB)
        buf.data = np.frombuffer(array.astype(array.dtype.newbyteorder("<")).tobytes(), np.uint8)
        self._buffers.append(buf)
        return self._tensor(name, array.shape, array.dtype, len(self._buffers) - 1, quant)

    def mark_output(self, t: int, name: str) -> None:
        """Expose ``t`` as a graph (and signature) output called ``name``."""
        if self._tensors[t].name != name:
            if name in self._names:
                raise ConfigError(f"output name {name!r} is already a tensor name")
            self._names.discard(self._tensors[t].name)
            self._names.add(name)
            self._tensors[t].name = name
        self._outputs.append((name, t))

    # ---- ops -------------------------------------------------------------------------------
    def _op(self, code: int, inputs: list[int], out_shape: Sequence[int], name: str,
            options_type: int = schema.BuiltinOptions.NONE, options: object = None,
            out_dtype=np.float32) -> int:
        out = self._tensor(name, out_shape, out_dtype)
        self._ops.append(_Op(code, list(inputs), [out], options_type, options))
        return out

    def _float_input(self, t: int, what: str, rank: int | None = None) -> tuple[int, ...]:
        if self._dtypes[t] != np.float32:
            raise ConfigError(f"{what} must be float32, got {self._dtypes[t]} "
                              "(dequantize int8 weights first; hybrid ops are not emitted)")
        shape = self._shapes[t]
        if rank is not None and len(shape) != rank:
            raise ConfigError(f"{what} must have rank {rank}, got shape {shape}")
        return shape

    def _bias(self, bias: int | None, channels: int, what: str, optional: bool = True) -> list[int]:
        if bias is None:
            if optional:
                return [-1]  # optional input left out (FULLY_CONNECTED stays version 1)
            # CONV_2D and DEPTHWISE_CONV_2D refuse an omitted bias at allocation ("Tensor at
            # index 2 was optional but was expected"): give them zeros.
            bias = self.add_const(np.zeros(channels, np.float32), f"{what}/zero_bias")
        if self._shapes[bias] != (channels,) or self._dtypes[bias] != np.float32:
            raise ConfigError(f"{what} bias must be float32 ({channels},), got "
                              f"{self._dtypes[bias]} {self._shapes[bias]}")
        return [bias]

    @staticmethod
    def _out_hw(hw: tuple[int, int], k: tuple[int, int], stride: int,
                padding: str) -> tuple[int, int]:
        """Output height and width of a conv or pool window (TFLite's rules)."""
        if padding not in _PADDING:
            raise ConfigError(f"padding must be SAME or VALID, got {padding!r}")
        if stride < 1:
            raise ConfigError(f"stride must be >= 1, got {stride}")
        if padding == "SAME":
            return tuple(-(-size // stride) for size in hw)
        if any(size < kk for size, kk in zip(hw, k)):
            raise ConfigError(f"VALID window {k} does not fit an input of size {hw}")
        return tuple((size - kk) // stride + 1 for size, kk in zip(hw, k))

    def dequantize(self, t: int, name: str) -> int:
        if self._quant[t] is None:
            raise ConfigError(f"DEQUANTIZE input {self._tensors[t].name!r} has no quantization")
        return self._op(_OP.DEQUANTIZE, [t], self._shapes[t], name,
                        schema.BuiltinOptions.DequantizeOptions, schema.DequantizeOptionsT())

    def _filter(self, t: int, what: str, rank: int) -> tuple[int, ...]:
        """A float32 filter, or an int8 per-channel (axis 0) one: the hybrid route, where the
        kernel quantizes activations on the fly and the version marks it (see _version)."""
        if self._dtypes[t] == np.int8:
            q = self._quant[t]
            if q is None or q.axis != 0:
                raise ConfigError(f"{what}: an int8 filter needs per-channel quantization on "
                                  "axis 0")
            if len(self._shapes[t]) != rank:
                raise ConfigError(f"{what} must have rank {rank}, got {self._shapes[t]}")
            return self._shapes[t]
        return self._float_input(t, what, rank)

    def conv2d(self, x: int, filt: int, bias: int | None, *, stride: int = 1,
               padding: str = "SAME", activation: str | None = None, name: str) -> int:
        """``filt``: OHWI ``[C_out, kh, kw, C_in]`` (issue: torch OIHW -> ``permute(0,2,3,1)``)."""
        n, h, w, c = self._float_input(x, f"{name}: CONV_2D input", 4)
        o, kh, kw, i = self._filter(filt, f"{name}: CONV_2D filter", 4)
        if i != c:
            raise ConfigError(f"{name}: filter has {i} input channels, the input has {c}")
        opts = schema.Conv2DOptionsT()
        opts.padding, opts.strideH, opts.strideW = _PADDING.get(padding), stride, stride
        opts.fusedActivationFunction = _activation(activation)
        shape = (n, *self._out_hw((h, w), (kh, kw), stride, padding), o)
        return self._op(_OP.CONV_2D, [x, filt] + self._bias(bias, o, name, False), shape, name,
                        schema.BuiltinOptions.Conv2DOptions, opts)

    def depthwise_conv2d(self, x: int, filt: int, bias: int | None, *, stride: int = 1,
                         padding: str = "SAME", activation: str | None = None, name: str) -> int:
        """``filt``: ``[1, kh, kw, C]`` (depth multiplier 1; torch ``[C, 1, kh, kw]``)."""
        n, h, w, c = self._float_input(x, f"{name}: DEPTHWISE_CONV_2D input", 4)
        one, kh, kw, o = self._float_input(filt, f"{name}: DEPTHWISE_CONV_2D filter", 4)
        if one != 1 or o != c:
            raise ConfigError(f"{name}: depthwise filter must be [1, kh, kw, {c}], got "
                              f"{self._shapes[filt]}")
        opts = schema.DepthwiseConv2DOptionsT()
        opts.padding, opts.strideH, opts.strideW = _PADDING.get(padding), stride, stride
        opts.depthMultiplier = 1
        opts.fusedActivationFunction = _activation(activation)
        shape = (n, *self._out_hw((h, w), (kh, kw), stride, padding), c)
        return self._op(_OP.DEPTHWISE_CONV_2D, [x, filt] + self._bias(bias, c, name, False),
                        shape, name,
                        schema.BuiltinOptions.DepthwiseConv2DOptions, opts)

    def fully_connected(self, x: int, weights: int, bias: int | None, *,
                        activation: str | None = None, name: str) -> int:
        """``x``: ``[N, in]``; ``weights``: ``[out, in]`` (the torch layout)."""
        n, i = self._float_input(x, f"{name}: FULLY_CONNECTED input", 2)
        o, wi = self._filter(weights, f"{name}: FULLY_CONNECTED weights", 2)
        if wi != i:
            raise ConfigError(f"{name}: weights take {wi} inputs, the input has {i}")
        opts = schema.FullyConnectedOptionsT()
        opts.fusedActivationFunction = _activation(activation)
        return self._op(_OP.FULLY_CONNECTED, [x, weights] + self._bias(bias, o, name), (n, o),
                        name, schema.BuiltinOptions.FullyConnectedOptions, opts)

    def add(self, a: int, b: int, *, activation: str | None = None, name: str) -> int:
        sa = self._float_input(a, f"{name}: ADD input")
        sb = self._float_input(b, f"{name}: ADD input")
        if sa != sb:  # no broadcasting: residual additions have equal shapes
            raise ConfigError(f"{name}: ADD needs equal shapes, got {sa} and {sb}")
        opts = schema.AddOptionsT()
        opts.fusedActivationFunction = _activation(activation)
        return self._op(_OP.ADD, [a, b], sa, name, schema.BuiltinOptions.AddOptions, opts)

    def pad(self, x: int, paddings: Sequence[Sequence[int]], *, name: str) -> int:
        """Zero padding; ``paddings[d] = (before, after)`` for every dimension of ``x``."""
        shape = self._float_input(x, f"{name}: PAD input")
        p = np.asarray(paddings, dtype=np.int32)
        if p.shape != (len(shape), 2) or (p < 0).any():
            raise ConfigError(f"{name}: paddings must be {len(shape)} non-negative (before, after) "
                              f"pairs, got {paddings}")
        pt = self.add_const(p, f"{name}/paddings")
        out = tuple(d + int(a) + int(b) for d, (a, b) in zip(shape, p))
        return self._op(_OP.PAD, [x, pt], out, name, schema.BuiltinOptions.PadOptions,
                        schema.PadOptionsT())

    def _pool(self, code: int, x: int, size: int, stride: int, padding: str, name: str) -> int:
        n, h, w, c = self._float_input(x, f"{name}: pool input", 4)
        opts = schema.Pool2DOptionsT()
        opts.padding, opts.strideH, opts.strideW = _PADDING.get(padding), stride, stride
        opts.filterHeight = opts.filterWidth = size
        shape = (n, *self._out_hw((h, w), (size, size), stride, padding), c)
        return self._op(code, [x], shape, name, schema.BuiltinOptions.Pool2DOptions, opts)

    def max_pool2d(self, x: int, size: int, stride: int | None = None, padding: str = "VALID",
                   *, name: str) -> int:
        return self._pool(_OP.MAX_POOL_2D, x, size, stride or size, padding, name)

    def average_pool2d(self, x: int, size: int, stride: int | None = None,
                       padding: str = "VALID", *, name: str) -> int:
        return self._pool(_OP.AVERAGE_POOL_2D, x, size, stride or size, padding, name)

    def mean(self, x: int, axes: Sequence[int] = (1, 2), keep_dims: bool = False, *,
             name: str) -> int:
        """Mean over ``axes`` (default the spatial axes of NHWC: global average pooling)."""
        shape = self._float_input(x, f"{name}: MEAN input")
        axes = sorted({a % len(shape) for a in axes})
        at = self.add_const(np.asarray(axes, np.int32), f"{name}/axes")
        out = tuple(1 if d in axes else s
                    for d, s in enumerate(shape) if keep_dims or d not in axes)
        opts = schema.ReducerOptionsT()
        opts.keepDims = keep_dims
        return self._op(_OP.MEAN, [x, at], out, name, schema.BuiltinOptions.ReducerOptions, opts)

    def reshape(self, x: int, shape: Sequence[int], *, name: str) -> int:
        """One dimension of ``shape`` may be -1: the interpreter infers it on every resize (the
        exporter's ``[-1, features]`` flatten keeps the batch dimension resizable; a literal 1
        makes the graph batch-1 only). The recorded shape is the one at the current size."""
        old = self._float_input(x, f"{name}: RESHAPE input")
        shape = tuple(int(d) for d in shape)
        if shape.count(-1) > 1 or any(d == 0 or d < -1 for d in shape):
            raise ConfigError(f"{name}: reshape to {shape}: dimensions must be > 0, one may be -1")
        static = shape
        if -1 in shape:
            known = int(np.prod([d for d in shape if d != -1]))
            if int(np.prod(old)) % known:
                raise ConfigError(f"{name}: cannot reshape {old} to {shape}")
            static = tuple(int(np.prod(old)) // known if d == -1 else d for d in shape)
        if int(np.prod(static)) != int(np.prod(old)):
            raise ConfigError(f"{name}: cannot reshape {old} to {shape}")
        st = self.add_const(np.asarray(shape, np.int32), f"{name}/shape")
        opts = schema.ReshapeOptionsT()
        opts.newShape = list(shape)
        return self._op(_OP.RESHAPE, [x, st], static, name, schema.BuiltinOptions.ReshapeOptions,
                        opts)

    def softmax(self, x: int, beta: float = 1.0, *, name: str) -> int:
        shape = self._float_input(x, f"{name}: SOFTMAX input")
        opts = schema.SoftmaxOptionsT()
        opts.beta = float(beta)
        return self._op(_OP.SOFTMAX, [x], shape, name, schema.BuiltinOptions.SoftmaxOptions, opts)

    # ---- output ----------------------------------------------------------------------------
    def _version(self, op: _Op) -> int:
        """The op version the runtime's versioning table assigns (issue: a wrong, too-low
        version makes an old runtime compute garbage instead of refusing). Every op here has
        float32 activations and float32 filters, which is version 1, except DEQUANTIZE of int8:
        2 per-tensor, 5 per-channel (more than one scale, as many as the quantized dimension)."""
        if op.code == _OP.DEQUANTIZE:
            src = op.inputs[0]
            q = self._quant[src]
            if self._dtypes[src] == np.int8:
                per_channel = len(q.scale) > 1 and len(q.scale) == self._shapes[src][q.axis]
                return 5 if per_channel else 2
        if op.code in (_OP.CONV_2D, _OP.FULLY_CONNECTED) and self._dtypes[op.inputs[1]] == np.int8:
            # (issue) hybrid: CONV_2D 2 (per-tensor) / 5 (per-channel); FULLY_CONNECTED 3 /
            # 12 (tflite-runtime 2.14 computes per-channel hybrid FC wrongly below v12)
            w = op.inputs[1]
            per_channel = len(self._quant[w].scale) > 1
            if op.code == _OP.CONV_2D:
                return 5 if per_channel else 2
            return 12 if per_channel else 3
        return 1

    def finish(self, signature_key: str = SIGNATURE_KEY,
               description: str = "edge-sdk exporter", resizable_batch: bool = False) -> bytes:
        """Pack the model; the graph inputs/outputs also form the signature ``signature_key``.
        ``resizable_batch``: mark dimension 0 of every graph input and output -1 in its shape
        signature (the graph must not hard-code the batch: reshape with -1)."""
        if not self._inputs or not self._outputs:
            raise ConfigError("a graph needs at least one input and one output")
        for _, t in self._inputs + self._outputs:
            shape = self._shapes[t]
            self._tensors[t].shapeSignature = [-1, *shape[1:]] if resizable_batch else None
        codes: dict[tuple[int, int], int] = {}
        operators = []
        for op in self._ops:
            key = (op.code, self._version(op))
            index = codes.setdefault(key, len(codes))
            o = schema.OperatorT()
            o.opcodeIndex, o.inputs, o.outputs = index, op.inputs, op.outputs
            o.builtinOptionsType, o.builtinOptions = op.options_type, op.options
            operators.append(o)
        opcodes = []
        for code, version in codes:
            oc = schema.OperatorCodeT()
            # (issue) both fields: readers before the 2020 schema only look at the deprecated one
            oc.builtinCode, oc.deprecatedBuiltinCode, oc.version = code, min(code, 127), version
            opcodes.append(oc)

        sg = schema.SubGraphT()
        sg.tensors, sg.operators, sg.name = self._tensors, operators, "main"
        sg.inputs = [t for _, t in self._inputs]
        sg.outputs = [t for _, t in self._outputs]
        sig = schema.SignatureDefT()
        sig.signatureKey, sig.subgraphIndex = signature_key, 0
        sig.inputs = [_tensor_map(n, t) for n, t in self._inputs]
        sig.outputs = [_tensor_map(n, t) for n, t in self._outputs]

        model = schema.ModelT()
        model.version = 3  # (issue) the schema version the runtime expects
        model.description = description
        model.operatorCodes, model.subgraphs = opcodes, [sg]
        model.buffers, model.signatureDefs = self._buffers, [sig]
        size = sum(b.data.size for b in self._buffers if b.data is not None)
        builder = _AlignedBuilder(size + 16 * len(self._buffers) + 65536)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")  # (issue)
        return bytes(builder.Output())


def _tensor_map(name: str, index: int) -> schema.TensorMapT:
    m = schema.TensorMapT()
    m.name, m.tensorIndex = name, index
    return m


def _activation(name: str | None) -> int:
    if name not in _ACT:
        raise ConfigError(f"fused activation must be one of relu, relu6, None; got {name!r}")
    return _ACT[name]


def graph_stats(tflite: bytes) -> dict:
    """MACs per invoke and parameters counted from a written graph (DESIGN: "MACs per slice,
    counted from the graph"). CONV_2D: ``H_out W_out C_out kh kw C_in`` per batch element;
    DEPTHWISE_CONV_2D: ``H_out W_out C kh kw``; FULLY_CONNECTED: ``in x out`` per row.
    Parameters are the filter and bias elements of those ops. Also counts ops by name."""
    model = schema.ModelT.InitFromPackedBuf(tflite, 0)
    sg = model.subgraphs[0]
    macs = params = 0
    ops: Counter[str] = Counter()
    for op in sg.operators:
        code = model.operatorCodes[op.opcodeIndex].builtinCode
        ops[_OP_NAMES.get(code, str(code))] += 1
        if code not in (_OP.CONV_2D, _OP.DEPTHWISE_CONV_2D, _OP.FULLY_CONNECTED):
            continue
        filt = [int(d) for d in sg.tensors[op.inputs[1]].shape]
        out = [int(d) for d in sg.tensors[op.outputs[0]].shape]
        rows = int(np.prod(out[:-1]))  # N*H_out*W_out (conv) or N (FC)
        macs += rows * int(np.prod(filt))  # OHWI, [1,kh,kw,C] and [out,in] are all per output
        params += int(np.prod(filt))
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            params += int(np.prod(sg.tensors[op.inputs[2]].shape))
    return {"macs": macs, "params": params, "ops": dict(ops)}


# ------------------------------------------------------------------------------- weights
@dataclass
class LayerWeights:
    """One layer's folded weights as they go into the graph (torch layout).

    ``quant`` is the int8 form (per output channel, axis 0) on the dequantize route and
    ``None`` on the float route; :meth:`effective` is what the graph computes with.
    """

    name: str
    weight: np.ndarray  # folded float32, torch layout
    bias: np.ndarray  # float32 [out]; biases always stay float32 (issue)
    fold_scale: np.ndarray  # float32 [out]
    quant: QuantizedTensor | None
    route: str  # "dequantize" | "hybrid" | "float"

    @property
    def exact(self) -> bool | None:
        return None if self.quant is None else self.quant.exact

    def effective(self) -> np.ndarray:
        return self.weight if self.quant is None else self.quant.dequantize()


def prepare_weights(model: NestedModel, weights: str = "dequantize",
                    pow2_step: bool = False) -> dict[str, LayerWeights]:
    """Fold and (on the dequantize route) quantize every Bayesian layer's point weights.

    ``pow2_step`` is the codebook-exact mode (PWFN point slices): the *unfolded* weights
    (``weight_mu``, which PWFN sets to codebook values) are quantized with a power-of-two step
    times the fold scale, so ``int8 x scale == codebook value x fold scale`` bit for bit; a
    tensor that cannot be exact stays float32 (route ``"float"``, recorded by the caller).
    """
    if weights not in WEIGHT_ROUTES:
        raise ConfigError(f"weights must be one of {', '.join(WEIGHT_ROUTES)}, got {weights!r}")
    out = {}
    for name, layer in model.named_modules():
        if not isinstance(layer, BayesNestedLayer):
            continue
        w, b = fold_layer(layer)
        fs = fold_scale(layer)
        quant = None
        if weights in ("dequantize", "hybrid"):
            if pow2_step:
                mu = layer.weight_mu.detach().cpu().numpy()
                quant = quantize_per_channel(mu, 0, pow2_step=True, channel_scale=fs)
                if quant.exact:
                    assert np.array_equal(quant.dequantize(), w)  # by construction (fold.py)
                else:
                    quant = None  # cannot be exact: keep float (issue)
            else:
                quant = quantize_per_channel(w, 0)
        route = "float" if quant is None else weights
        if route == "hybrid" and getattr(layer, "depthwise", False):
            route = "dequantize"  # depthwise filters stay on the DEQUANTIZE route (see _weight)
        out[name] = LayerWeights(name, w, b, fs, quant, route)
    return out


# ------------------------------------------------------------------------------- emission
@dataclass
class _Emitter:
    """Emits one truncated layer at a time into ``g`` (NHWC activations)."""

    g: GraphBuilder
    weights: dict[str, LayerWeights]
    names: dict[int, str]
    records: list[dict] = field(default_factory=list)

    def _weight(self, layer: BayesNestedLayer, to_tflite: Callable[[np.ndarray], np.ndarray],
                axis: int) -> tuple[int, int, str]:
        name = self.names[id(layer)]
        lw = self.weights[name]
        if lw.quant is None:
            wt = self.g.add_const(to_tflite(lw.weight), f"{name}/weight")
        elif lw.route == "hybrid":
            # int8 filter straight into CONV_2D / FULLY_CONNECTED: the kernel quantizes the
            # activations per invoke (dynamic range) and runs an int8 matmul
            wt = self.g.add_const(to_tflite(lw.quant.values), f"{name}/weight_int8",
                                  ChannelQuant(lw.quant.scale, axis))
        else:
            # (issue) per-channel int8: quantized_dimension 0 for CONV_2D/FULLY_CONNECTED
            # filters, 3 for DEPTHWISE_CONV_2D; the float op reads the DEQUANTIZE output.
            qt = self.g.add_const(to_tflite(lw.quant.values), f"{name}/weight_int8",
                                  ChannelQuant(lw.quant.scale, axis))
            wt = self.g.dequantize(qt, f"{name}/weight")
        bt = self.g.add_const(lw.bias, f"{name}/bias")
        # how far the int8 grid moved the folded weights (0 when exact or on the float route)
        err = float(np.abs(lw.effective() - lw.weight).max() / max(np.abs(lw.weight).max(), 1e-30))
        self.records.append({"layer": name, "shape": list(self.g.shape(wt)), "route": lw.route,
                             "exact": lw.exact, "max_rel_error": err})
        return wt, bt, name

    def conv(self, x: int, layer: BayesNestedConv2d) -> int:
        if not isinstance(layer, BayesNestedConv2d):
            raise ConfigError(f"expected a BayesNestedConv2d, got {type(layer).__name__}")
        channels = self.g.shape(x)[-1]
        if channels != layer.in_channels:
            raise ConfigError(f"{self.names[id(layer)]} expects {layer.in_channels} input "
                              f"channels, the graph has {channels}")
        k, s, p = layer.kernel_size, layer.stride, layer.padding
        name = self.names[id(layer)]
        if p == 0:
            padding = "VALID"
        elif s == 1 and 2 * p == k - 1:
            padding = "SAME"  # stride 1, odd k: TFLite pads (k-1)/2 on both sides, as torch does
        else:
            # (issue) TFLite SAME at stride 2 pads asymmetrically (the extra row goes at the
            # bottom/right), torch pads p on both sides: a silent ~3 % logit error. PAD + VALID.
            x = self.g.pad(x, [(0, 0), (p, p), (p, p), (0, 0)], name=f"{name}/pad")
            padding = "VALID"
        if layer.depthwise:
            wt, bt, name = self._weight(layer, lambda w: w.transpose(1, 2, 3, 0), 3)
            return self.g.depthwise_conv2d(x, wt, bt, stride=s, padding=padding,
                                           activation=layer.activation, name=name)
        wt, bt, name = self._weight(layer, lambda w: w.transpose(0, 2, 3, 1), 0)  # OIHW -> OHWI
        return self.g.conv2d(x, wt, bt, stride=s, padding=padding, activation=layer.activation,
                             name=name)

    def linear(self, x: int, layer: BayesNestedLinear, hw: tuple[int, int] = (1, 1)) -> int:
        """``x`` is ``[N, features]``; ``hw`` the spatial size it was flattened from (NHWC)."""
        if not isinstance(layer, BayesNestedLinear):
            raise ConfigError(f"expected a BayesNestedLinear, got {type(layer).__name__}")
        name = self.names[id(layer)]
        features = self.g.shape(x)[-1]
        if features != layer.in_features or layer.input_spatial != hw[0] * hw[1]:
            raise ConfigError(f"{name} expects {layer.in_features} inputs flattened from "
                              f"{layer.input_spatial} positions; the graph has {features} from "
                              f"{hw[0]}x{hw[1]}")
        h, w = hw

        def to_tflite(m: np.ndarray) -> np.ndarray:
            # (issue) torch flattened (C, H, W); NHWC flattens (H, W, C): permute the columns.
            o = m.shape[0]
            return m.reshape(o, -1, h, w).transpose(0, 2, 3, 1).reshape(o, -1)

        wt, bt, name = self._weight(layer, to_tflite, 0)
        return self.g.fully_connected(x, wt, bt, activation=layer.activation, name=name)

    def max_pool(self, x: int, pool: nn.MaxPool2d) -> int:
        size, stride = _pair_value(pool.kernel_size), _pair_value(pool.stride or pool.kernel_size)
        if (None in (size, stride) or _pair_value(pool.padding) != 0
                or _pair_value(pool.dilation) != 1 or pool.ceil_mode):
            raise ConfigError(f"{self.names[id(pool)]}: only square MaxPool2d without padding, "
                              f"dilation or ceil_mode is exported, got {pool}")
        # torch floors the output size; TFLite VALID gives (H - k) // s + 1, the same.
        return self.g.max_pool2d(x, size, stride, "VALID", name=self.names[id(pool)])

    def flatten(self, x: int) -> tuple[int, tuple[int, int]]:
        _, h, w, c = self.g.shape(x)
        # -1, not the batch: the interpreter can then be resized to [N, H, W, C] (batch predict)
        return self.g.reshape(x, (-1, h * w * c), name="flatten"), (h, w)


def _pair_value(v) -> int | None:
    """``2`` and ``(2, 2)`` -> 2; a non-square pair -> None."""
    if isinstance(v, (tuple, list)):
        return v[0] if len(set(v)) == 1 else None
    return v


def _emit_features_fc_classifier(e: _Emitter, x: int, model: nn.Module) -> int:
    for m in model.features:
        if isinstance(m, BayesNestedConv2d):
            x = e.conv(x, m)
        elif isinstance(m, nn.MaxPool2d):
            x = e.max_pool(x, m)
        else:
            raise ConfigError(f"cannot export a {type(m).__name__} in "
                              f"{type(model).__name__}.features")
    x, hw = e.flatten(x)
    return e.linear(e.linear(x, model.fc, hw), model.classifier)


def _emit_nested_cnn(e: _Emitter, x: int, model: NestedCNN) -> int:
    # forward: classifier(fc(flatten(features(x)))), flatten in (C, H, W) order
    return _emit_features_fc_classifier(e, x, model)


def _emit_nested_vgg(e: _Emitter, x: int, model: NestedVGG) -> int:
    # Same shape of graph as NestedCNN (conv/pool features, flatten, fc, classifier).
    return _emit_features_fc_classifier(e, x, model)


def _emit_nested_mobilenetv2(e: _Emitter, x: int, model: NestedMobileNetV2) -> int:
    x = e.conv(x, model.stem)
    for i, block in enumerate(model.blocks):
        y = x if block.expand is None else e.conv(x, block.expand)
        y = e.conv(e.conv(y, block.dw), block.project)
        x = e.g.add(x, y, name=f"blocks.{i}/add") if block.residual else y
    x = e.g.mean(e.conv(x, model.head), (1, 2), name="pool")  # adaptive_avg_pool2d(., 1) + flatten
    return e.linear(x, model.classifier)


_EMITTERS: dict[type, Callable[[_Emitter, int, nn.Module], int]] = {
    NestedCNN: _emit_nested_cnn,
    NestedVGG: _emit_nested_vgg,
    NestedMobileNetV2: _emit_nested_mobilenetv2,
}


def export_point_slice(model: NestedModel, input_shape_nhwc: Sequence[int],
                       weights: str = "dequantize", pow2_step: bool = False,
                       output_shape: Sequence[int] | None = None) -> tuple[bytes, dict]:
    """The point network of a truncated model as a ``.tflite`` flatbuffer, and facts about it.

    Input ``"input"``: float32 NHWC, already normalised (normalising is the runtime's job).
    Output ``"logits"``: ``[N, num_classes]``. Signature ``serving_default``. The batch
    dimension is resizable (``resize_tensor_input(0, [N, H, W, C])``; -1 in the input's and
    output's shape signature): a head graph then answers ``[N * S, C]``. ``weights``:
    ``"dequantize"`` (int8 per-channel + DEQUANTIZE), ``"hybrid"`` (int8 filters straight into
    CONV_2D / FULLY_CONNECTED, activations quantized per invoke; depthwise filters stay on the
    DEQUANTIZE route) or ``"float"``; ``pow2_step``: see
    :func:`prepare_weights`.

    Batch norms fold with their running statistics (eval semantics) whatever ``model.training``
    says; note ``truncate()`` returns rebuilt batch norms in training mode, so call ``eval()``
    before comparing with torch.

    ``output_shape``: reshape the logits before the output (the head scope's ``[S, C]`` from a
    classifier whose S sampled heads are stacked into one ``[S*C, in]`` FULLY_CONNECTED).

    ``info``: ``macs`` and ``params`` (counted from the written graph), ``ops`` (count by op),
    ``bytes``, ``tensors`` (per layer: TFLite weight shape, route, whether int8 x scale equals
    the folded float weight exactly), ``float_fallback`` (layers that could not be exact in
    ``pow2_step`` mode and stayed float), ``input``/``output`` (name, shape).
    """
    emit = next((_EMITTERS[c] for c in type(model).__mro__ if c in _EMITTERS), None)
    if emit is None:
        raise ConfigError(f"no TFLite emitter for {type(model).__name__}; "
                          f"supported: {', '.join(c.__name__ for c in _EMITTERS)}")
    still_nested = [n for n, m in model.named_modules()
                    if isinstance(m, BayesNestedLayer) and m.ordering is not None]
    if still_nested:
        raise ConfigError(f"{type(model).__name__} is not truncated ({still_nested[0]} still has "
                          "an ordering unit): export model.truncate(width)")
    shape = tuple(input_shape_nhwc)
    if len(shape) != 4 or not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape):
        raise ConfigError(f"input_shape_nhwc must be 4 positive ints [N, H, W, C], got {shape}")

    lw = prepare_weights(model, weights, pow2_step)
    g = GraphBuilder()
    e = _Emitter(g, lw, {id(m): n for n, m in model.named_modules()})
    x = g.add_input(INPUT_NAME, shape)
    y = emit(e, x, model)
    if output_shape is not None:
        # [N, S*C] -> [N*S, C]: rows n*S .. n*S+S-1 are sample n's (batch-resizable, as flatten)
        rows = tuple(output_shape)
        y = g.reshape(y, (-1, *rows[1:]), name="heads")
        if g.shape(y) != rows:
            raise ConfigError(f"output_shape {list(rows)} does not fit the graph's output "
                              f"{list(g.shape(y))} at batch {shape[0]}")
    g.mark_output(y, OUTPUT_NAME)
    buf = g.finish(resizable_batch=True)
    info = graph_stats(buf)
    info.update(bytes=len(buf), weights=weights, pow2_step=pow2_step, tensors=e.records,
                float_fallback=[r["layer"] for r in e.records
                                if pow2_step and weights != "float" and r["route"] == "float"],
                input={"name": INPUT_NAME, "shape": list(shape)},
                output={"name": OUTPUT_NAME, "shape": list(g.shape(y))})
    return buf, info
