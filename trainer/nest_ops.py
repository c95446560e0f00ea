"""The non-layer ops that :func:`trainer.nest` accepts and :mod:`exporters.lowering` lowers,
defined once (``nest()`` accepts nothing the exporter cannot export). Both sides read
their options through these functions, so a network that nests exports, and one that would not
export is refused at nest time, before any training.

- activations: ReLU, ReLU6, Hardswish, Hardsigmoid, SiLU, Sigmoid (modules, functions, methods).
  Only ReLU (and no activation) is positive-homogeneous: a keep-probability rescale folds
  backwards through it into the batch norm; through the others it folds forwards into the
  consumers' input weights (:mod:`trainer.nest_graph`).
- pooling: max / average, square or not, zero padding (average: padded zeros counted, torch's
  default), ``ceil_mode`` where the exporter can reproduce torch's output size exactly.
- ``torchvision.ops.stochastic_depth``: identity at inference; nest() drops it (see there).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn


#: activation name -> is it positive-homogeneous (f(s z) = s f(z) for s >= 0)?
HOMOGENEOUS = {"relu": True, "relu6": False, "hardswish": False, "hardsigmoid": False,
               "silu": False, "sigmoid": False}
#: gate activations: an output read only as a multiplicative gate (squeeze-excitation)
GATES = ("sigmoid", "hardsigmoid")

_ACT_MODULES = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.Hardswish: "hardswish",
                nn.Hardsigmoid: "hardsigmoid", nn.SiLU: "silu", nn.Sigmoid: "sigmoid"}
_ACT_FUNCTIONS = {F.relu: "relu", torch.relu: "relu", "relu": "relu", "relu_": "relu",
                  F.relu6: "relu6", F.hardswish: "hardswish", F.hardsigmoid: "hardsigmoid",
                  F.silu: "silu", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid",
                  "sigmoid": "sigmoid", "sigmoid_": "sigmoid"}
MUL = {operator.mul, torch.mul, operator.imul, "mul", "mul_"}


def activation_of(node: fx.Node, modules: dict) -> str | None:
    """The activation ``node`` computes (its only tensor argument being its input), or None."""
    if node.op == "call_module":
        return _ACT_MODULES.get(type(modules[node.target]))
    if node.op in ("call_function", "call_method"):
        try:
            if node.target in _ACT_FUNCTIONS:
                return _ACT_FUNCTIONS[node.target]
        except TypeError:  # an unhashable target
            return None
        if node.target is F.hardtanh and tuple(node.args[1:3]) == (0.0, 6.0):
            return "relu6"
    return None


def is_stochastic_depth(node: fx.Node) -> bool:
    """torchvision's ``stochastic_depth`` (fx-wrapped: one call_function node): its
    ``training`` flag was frozen to the module's mode at trace time, so nest() drops it (an
    identity at inference; the nested network trains without it)."""
    return node.op == "call_function" and getattr(node.target, "__name__", "") == \
        "stochastic_depth" and "torchvision" in getattr(node.target, "__module__", "")


@dataclass(frozen=True)
class Pool:
    """A pooling the exporter lowers as (PAD ->) MAX/AVERAGE_POOL_2D VALID: kernel, stride,
    padding (top/left, torch's symmetric padding) and the extra bottom/right rows and columns
    ``ceil_mode`` adds (computed per input size by :meth:`extra`)."""

    is_max: bool
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    ceil: bool

    def out_size(self, size: int, axis: int) -> int:
        k, s, p = self.kernel[axis], self.stride[axis], self.padding[axis]
        if not self.ceil:
            return (size + 2 * p - k) // s + 1
        out = -(-(size + 2 * p - k) // s) + 1
        if (out - 1) * s >= size + p:  # torch: the last window must start inside the input
            out -= 1
        return out

    def extra(self, size: int, axis: int) -> int:
        """Rows (axis 0) or columns (1) padded after the input beyond ``padding`` so that a
        VALID pool gives torch's output size."""
        k, s, p = self.kernel[axis], self.stride[axis], self.padding[axis]
        return max(0, (self.out_size(size, axis) - 1) * s + k - (size + 2 * p))


def _pair(v, what: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(t, int) for t in v):
        return (v[0], v[1])
    raise ValueError(f"{what} must be an int or a pair of ints, got {v!r}")


def pool_of(is_max: bool, kernel, stride, padding=0, dilation=1, ceil: bool = False,
            count_include_pad: bool = True, divisor_override=None) -> Pool:
    """The :class:`Pool` for torch's pooling options; ValueError naming what is not exported."""
    k = _pair(kernel, "kernel_size")
    s = _pair(stride if stride not in (None, [], ()) else kernel, "stride")
    p = _pair(padding, "padding")
    if _pair(dilation, "dilation") != (1, 1):
        raise ValueError(f"dilation {dilation} is not supported (only 1)")
    if divisor_override is not None:
        raise ValueError("divisor_override is not supported")
    if any(2 * pp > kk for pp, kk in zip(p, k)):
        raise ValueError(f"padding {p} is more than half the kernel {k}")
    if not is_max and not count_include_pad and any(p):
        # TFLite's AVERAGE_POOL_2D divides by the whole window (padded zeros counted)
        raise ValueError("average pooling with padding and count_include_pad=False is not "
                         "supported (the exporter counts padded zeros, torch's default)")
    if not is_max and ceil:
        # torch divides a window cut by the ceil-mode edge by its in-bounds size; TFLite does
        # not: only max pooling is exported with ceil_mode
        raise ValueError("average pooling with ceil_mode=True is not supported (use floor mode "
                         "or max pooling)")
    return Pool(is_max, k, s, p, bool(ceil))


def pool_of_module(m: nn.Module) -> Pool:
    is_max = isinstance(m, nn.MaxPool2d)
    if is_max and m.return_indices:
        raise ValueError("MaxPool2d(return_indices=True) is not supported")
    return pool_of(is_max, m.kernel_size, m.stride, m.padding,
                   getattr(m, "dilation", 1), m.ceil_mode,
                   getattr(m, "count_include_pad", True), getattr(m, "divisor_override", None))


def pool_of_call(node: fx.Node) -> Pool:
    """F.max_pool2d / F.avg_pool2d called in forward."""
    def opt(i, key, default):
        return node.args[i] if i < len(node.args) else node.kwargs.get(key, default)

    k = opt(1, "kernel_size", None)
    if node.target is F.max_pool2d:
        if opt(6, "return_indices", False):
            raise ValueError("max_pool2d(return_indices=True) is not supported")
        return pool_of(True, k, opt(2, "stride", None), opt(3, "padding", 0),
                       opt(4, "dilation", 1), opt(5, "ceil_mode", False))
    return pool_of(False, k, opt(2, "stride", None), opt(3, "padding", 0), 1,
                   opt(4, "ceil_mode", False), opt(5, "count_include_pad", True),
                   opt(6, "divisor_override", None))


POOL_MODULES = (nn.MaxPool2d, nn.AvgPool2d)
POOL_FUNCTIONS = (F.max_pool2d, F.avg_pool2d)


def global_pool_size_ok(size) -> bool:
    """Only global pooling (output 1x1) is exported."""
    return size == 1 or (isinstance(size, (tuple, list)) and tuple(size) == (1, 1))


@dataclass(frozen=True)
class Resize:
    """An upsampling the exporter lowers as RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR:
    ``scale`` (h, w) integer factors; bilinear with ``align_corners`` as torch's."""

    mode: str
    scale: tuple[int, int]
    align_corners: bool = False

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        return h * self.scale[0], w * self.scale[1]


UPSAMPLE_MODULES = (nn.Upsample,)  # nn.UpsamplingNearest2d / Bilinear2d are subclasses


def resize_of(mode: str, scale, size, align_corners) -> Resize:
    """The :class:`Resize` of torch's upsampling options; ValueError naming what is not
    exported (a fixed output ``size``, a non-integer factor, bicubic ...)."""
    if size is not None:
        raise ValueError("upsampling to a fixed size is not supported (use scale_factor: the "
                         "slice's input size is the one the network was nested for)")
    if scale is None:
        raise ValueError("upsampling needs a scale_factor")
    sc = (scale, scale) if isinstance(scale, (int, float)) else tuple(scale)
    if len(sc) != 2 or any(float(v) != int(v) or int(v) < 1 for v in sc):
        raise ValueError(f"only integer upsampling factors are supported, got {scale!r}")
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"upsampling mode {mode!r} is not supported (nearest, bilinear)")
    return Resize(mode, (int(sc[0]), int(sc[1])), bool(align_corners) and mode == "bilinear")


def resize_of_module(m: nn.Module) -> Resize:
    return resize_of(m.mode, m.scale_factor, m.size, m.align_corners)


def resize_of_call(node: fx.Node) -> Resize:
    """F.interpolate / F.upsample called in forward."""
    def opt(i, key, default):
        return node.args[i] if i < len(node.args) else node.kwargs.get(key, default)

    if opt(5, "recompute_scale_factor", None) or opt(6, "antialias", False):
        raise ValueError("recompute_scale_factor / antialias are not supported")
    return resize_of(opt(3, "mode", "nearest"), opt(2, "scale_factor", None),
                     opt(1, "size", None), opt(4, "align_corners", None))


RESIZE_FUNCTIONS = (F.interpolate, F.upsample)


def mean_dims(node: fx.Node) -> list[int] | None:
    """The dims of ``x.mean(dims)`` / ``torch.mean(x, dims)`` mod 4, or None if not given."""
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", None)
    if dims is None:
        return None
    dims = (dims,) if isinstance(dims, int) else dims
    return sorted(d % 4 for d in dims)


__all__ = ["GATES", "HOMOGENEOUS", "MUL", "POOL_FUNCTIONS", "POOL_MODULES", "Pool",
           "RESIZE_FUNCTIONS", "Resize", "UPSAMPLE_MODULES", "activation_of",
           "global_pool_size_ok", "is_stochastic_depth", "mean_dims", "pool_of", "pool_of_call",
           "pool_of_module", "resize_of", "resize_of_call", "resize_of_module"]
