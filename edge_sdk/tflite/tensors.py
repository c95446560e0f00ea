"""The tensors and ops of a graph description (:mod:`edge_sdk.tflite.graph`), as plain data:
what the op table (:mod:`edge_sdk.tflite.ops`), the writer and the reader all speak. A constant
is held *by reference*: ``Tensor.weight`` names an array in a separate ``weights`` mapping.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

__all__ = ["DTYPES", "QUANT_AXIS", "Op", "Quantization", "Tensor", "TensorEntry", "Weights"]

DTYPES = ("float32", "int8", "int32", "uint8")  # uint8: a raw image input (CAST)
# the weighted layer kinds and the axis their per-channel int8 scales run along in TFLite
# (CONV_2D / FULLY_CONNECTED filters: 0, the output channel; DEPTHWISE_CONV_2D [1, kh, kw, C]: 3)
QUANT_AXIS = {"conv": 0, "depthwise": 3, "linear": 0}


@dataclass(frozen=True)
class Quantization:
    """``real = scale[c] * (q - zero_point[c])`` along ``axis`` (TFLite schema
    ``QuantizationParameters``: scale, zero_point, quantized_dimension). Constants are
    symmetric per channel (zero points 0: ``zero_point`` left empty); an integer graph's int8
    activations have one scale and one zero point (:mod:`edge_sdk.tflite.integer`)."""

    scale: tuple[float, ...]
    axis: int = 0
    zero_point: tuple[int, ...] = ()  # empty: every zero point is 0

    @property
    def zero_points(self) -> tuple[int, ...]:
        return self.zero_point or (0,) * len(self.scale)


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    weight: str | None = None  # a constant: the key of its array in ``weights``
    quant: Quantization | None = None


@dataclass
class Op:
    op: str
    inputs: list[str | None]  # None: an optional input left out (FULLY_CONNECTED's bias)
    outputs: list[str]
    options: dict[str, Any] = field(default_factory=dict)


# a graph's constants by name (what ``Tensor.weight`` refers to)
Weights = dict[str, npt.NDArray[Any]]
# a tensor as read from a file, with its shape signature (None: the file gives none)
TensorEntry = tuple[Tensor, tuple[int, ...] | None]
