"""Build a :class:`edge_sdk.tflite.graph.Graph` op by op, with every shape checked as it is added.

What the exporter's lowering and hand-made test graphs use; each method returns the name of
the tensor it made (names are what a graph description refers to).
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import ConfigError
from edge_sdk.tflite.graph import Graph, check_tensor
from edge_sdk.tflite.tensors import Op, Quantization, Tensor
from edge_sdk.tflite.ops import infer_shape

IntPair = int | Sequence[int]  # 2 or [2, 2]: a window's size or stride (edge_sdk.tflite.ops.pair)


class PerChannelScale(Protocol):
    """What :meth:`GraphBuilder.add_const` reads of ``quant`` (e.g. a
    :class:`edge_sdk.tflite.quant.QuantizedTensor`)."""

    @property
    def scale(self) -> npt.ArrayLike: ...

    @property
    def axis(self) -> int: ...

__all__ = ["GraphBuilder"]


class GraphBuilder:
    """Tensors, ops and the constants' arrays of one graph. :meth:`graph` gives the
    description and the weights; :meth:`finish` writes them as TFLite bytes."""

    def __init__(self) -> None:
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []
        self.weights: dict[str, npt.NDArray[Any]] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []

    # ---- tensors ---------------------------------------------------------------------------
    def shape(self, t: str) -> tuple[int, ...]:
        return tuple(self.tensors[t].shape)

    def dtype(self, t: str) -> np.dtype[Any]:
        return np.dtype(self.tensors[t].dtype)

    def _new(self, t: Tensor) -> str:
        if t.name in self.tensors:
            raise ConfigError(f"tensor name {t.name!r} is used twice")
        check_tensor(t)
        self.tensors[t.name] = t
        return t.name

    def unique(self, name: str) -> str:
        """``name``, or ``name_1``, ``name_2`` ... when taken."""
        out, i = name, 0
        while out in self.tensors:
            i += 1
            out = f"{name}_{i}"
        return out

    def add_input(self, name: str, shape: Sequence[int], dtype: npt.DTypeLike = np.float32
                  ) -> str:
        t = self._new(Tensor(name, tuple(int(d) for d in shape), np.dtype(dtype).name))
        self.inputs.append(t)
        return t

    def add_const(self, array: npt.ArrayLike, name: str, quant: PerChannelScale | None = None
                  ) -> str:
        """A constant named ``name`` (its array is stored under the same key). ``quant`` (any
        object with ``scale`` and ``axis``) marks an int8 array as per-channel quantized."""
        array = np.ascontiguousarray(array)
        q = None
        if quant is not None:
            if array.dtype != np.int8:
                raise ConfigError(f"{name!r}: quantized constants must be int8, got {array.dtype}")
            q = Quantization(tuple(float(s) for s in np.asarray(quant.scale, np.float32)),
                             int(quant.axis))
        t = self._new(Tensor(name, array.shape, array.dtype.name, name, q))
        if q is not None and (array == -128).any():  # symmetric grid: -128 is never used
            del self.tensors[name]
            raise ConfigError(f"{name!r}: int8 value -128 is outside the symmetric range")
        self.weights[name] = array
        return t

    def mark_output(self, t: str, name: str | None = None) -> str:
        """Expose ``t`` as a graph (and signature) output, renamed to ``name`` if given."""
        if name is not None and name != t:
            if name in self.tensors:
                raise ConfigError(f"output name {name!r} is already a tensor name")
            self._rename(t, name)
            t = name
        self.outputs.append(t)
        return t

    def _rename(self, old: str, new: str) -> None:
        tensor = self.tensors.pop(old)
        tensor.name = new
        self.tensors[new] = tensor
        for o in self.ops:
            o.inputs = [new if n == old else n for n in o.inputs]
            o.outputs = [new if n == old else n for n in o.outputs]
        self.inputs = [new if n == old else n for n in self.inputs]
        self.outputs = [new if n == old else n for n in self.outputs]

    # ---- ops -------------------------------------------------------------------------------
    def op(self, op: str, inputs: Sequence[str | None], name: str, **options: Any) -> str:
        """Any op of :data:`edge_sdk.tflite.ops.OPS`; the output's shape is inferred (and checked)."""
        for n in inputs:
            if n is not None and n not in self.tensors:
                raise ConfigError(f"{op} {name!r}: input {n!r} is not a tensor of this graph")
        ins = [None if n is None else self.tensors[n] for n in inputs]
        options = {k: v for k, v in options.items() if v is not None}
        shape, dtype = infer_shape(op, ins, options, name)
        out = self._new(Tensor(name, shape, dtype))
        self.ops.append(Op(op, list(inputs), [out], options))
        return out

    def dequantize(self, t: str, name: str) -> str:
        return self.op("DEQUANTIZE", [t], name)

    def conv2d(self, x: str, filt: str, bias: str | None, *, stride: IntPair = 1,
               padding: str = "SAME",
               activation: str | None = None, name: str) -> str:
        """``filt``: OHWI ``[C_out, kh, kw, C_in]`` (torch OIHW -> ``transpose(0, 2, 3, 1)``)."""
        return self.op("CONV_2D", [x, filt, bias], name, stride=stride, padding=padding,
                       activation=activation)

    def depthwise_conv2d(self, x: str, filt: str, bias: str | None, *, stride: IntPair = 1,
                         padding: str = "SAME", activation: str | None = None, name: str) -> str:
        """``filt``: ``[1, kh, kw, C]`` (depth multiplier 1; torch ``[C, 1, kh, kw]``)."""
        return self.op("DEPTHWISE_CONV_2D", [x, filt, bias], name, stride=stride,
                       padding=padding, activation=activation)

    def fully_connected(self, x: str, weights: str, bias: str | None, *,
                        activation: str | None = None, name: str) -> str:
        """``x``: ``[N, in]``; ``weights``: ``[out, in]`` (the torch layout)."""
        return self.op("FULLY_CONNECTED", [x, weights, bias], name, activation=activation)

    def add(self, a: str, b: str, *, activation: str | None = None, name: str) -> str:
        return self.op("ADD", [a, b], name, activation=activation)

    def concatenation(self, xs: Sequence[str], axis: int, *, activation: str | None = None,
                      name: str) -> str:
        return self.op("CONCATENATION", list(xs), name, axis=axis, activation=activation)

    def pad(self, x: str, paddings: Sequence[Sequence[int]], *, name: str) -> str:
        """Zero padding; ``paddings[d] = (before, after)`` for every dimension of ``x``."""
        return self.op("PAD", [x], name, paddings=[[int(a), int(b)] for a, b in paddings])

    def max_pool2d(self, x: str, size: IntPair, stride: IntPair | None = None,
                   padding: str = "VALID", *,
                   name: str) -> str:
        return self.op("MAX_POOL_2D", [x], name, size=size, stride=stride, padding=padding)

    def average_pool2d(self, x: str, size: IntPair, stride: IntPair | None = None,
                       padding: str = "VALID", *,
                       name: str) -> str:
        return self.op("AVERAGE_POOL_2D", [x], name, size=size, stride=stride, padding=padding)

    def mean(self, x: str, axes: Sequence[int] = (1, 2), keep_dims: bool = False, *,
             name: str) -> str:
        """Mean over ``axes`` (default the spatial axes of NHWC: global average pooling)."""
        return self.op("MEAN", [x], name, axes=[int(a) for a in axes], keep_dims=bool(keep_dims))

    def reshape(self, x: str, shape: Sequence[int], *, name: str) -> str:
        """One dimension of ``shape`` may be -1: the interpreter infers it on every resize (a
        ``[-1, features]`` flatten keeps the batch resizable; a literal 1 makes the graph batch-1
        only). The recorded shape is the one at the current size."""
        return self.op("RESHAPE", [x], name, shape=[int(d) for d in shape])

    def relu(self, x: str, *, name: str) -> str:
        return self.op("RELU", [x], name)

    def relu6(self, x: str, *, name: str) -> str:
        return self.op("RELU6", [x], name)

    def softmax(self, x: str, beta: float = 1.0, *, name: str) -> str:
        return self.op("SOFTMAX", [x], name, beta=float(beta))

    # ---- output ----------------------------------------------------------------------------
    def graph(self, resizable_batch: bool = False, signature: str = "serving_default",
              description: str = "edge-sdk exporter") -> tuple[Graph, dict[str, npt.NDArray[Any]]]:
        """The description and its weights. ``resizable_batch``: dimension 0 of every input
        and output may be resized (the graph must not hard-code the batch: reshape with -1)."""
        g = Graph(list(self.tensors.values()), list(self.ops), list(self.inputs),
                  list(self.outputs), 0 if resizable_batch else None, signature, description)
        g.validate(self.weights)
        return g, dict(self.weights)

    def finish(self, signature_key: str = "serving_default",
               description: str = "edge-sdk exporter", resizable_batch: bool = False) -> bytes:
        from edge_sdk.tflite.writer import write_tflite

        return write_tflite(*self.graph(resizable_batch, signature_key, description))
