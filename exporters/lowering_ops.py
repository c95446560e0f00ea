"""The lowering's ops beyond convs and linears: padded / ceil-mode pooling, integer
upsampling, the activations TFLite has no fused form of (Hardswish, Hardsigmoid, SiLU,
Sigmoid), squeeze-excitation gates and grouped convolutions. A mixin of
:class:`exporters.lowering._Lowering`; the option rules are :mod:`trainer.nest_ops`', which
``trainer.nest`` checks at nest time."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import fx

from edge_sdk.errors import ConfigError
from trainer.layers import BayesNestedConv2d
from trainer.nest_ops import Pool, Resize


@dataclass
class _V:
    """A lowered value: its graph tensor and, for a 2-D value flattened from a spatial map,
    the NHWC ``(H, W, C)`` it was flattened from (None: columns in torch's order)."""

    name: str
    flat_from: tuple[int, int, int] | None = None


#: the lowest float32: max pooling's padding (torch pads with -inf; never a window's maximum,
#: since no window lies wholly in the padding)
_NEG = float(np.finfo(np.float32).min)


class _Ops:
    """Needs ``self.g`` (a GraphBuilder), ``self.arg``, ``self.name``, ``self.fail`` and
    ``self._weight`` from the lowering."""

    def grouped_conv(self, node: fx.Node, x: str, layer: BayesNestedConv2d, s, padding: str,
                     fused: bool, name: str) -> str:
        """A grouped conv as GATHER + CONV_2D per group + CONCATENATION: TFLite's CONV_2D reads
        every input channel (tflite-runtime 2.14 has no grouped kernel outside XNNPACK), so
        each group gathers its input channels and SLICEs its filter rows and bias from the one
        filter constant (the weight store fills that one constant, as for any conv)."""
        wt, bt = self._weight(node, layer, "conv")  # [O, kh, kw, I / groups]
        if self.g.dtype(wt) != np.float32:
            raise self.fail(node, "a grouped conv has no hybrid (int8 filter) route; export "
                                  "with weights dequantize or float")
        n, kh, kw, c = self.g.shape(wt)  # c: a conv group's channels (in == out per group)
        act = layer.activation if fused else None
        outs = []
        # a width may end inside a conv group (trainer.nesting.partial_groups): that last
        # group keeps its first k outputs reading its first k inputs
        for i, lo in enumerate(range(0, n, c)):
            k = min(c, n - lo)
            # GATHER, not SLICE: TFLite's SLICE keeps its recorded output shape when the
            # batch is resized (a wrong-size error on LiteRT, a crash on tflite-runtime 2.14)
            xi = self.g.op("GATHER", [x], f"{name}/g{i}/x", axis=3,
                           indices=list(range(lo, lo + k)))
            wi = self.g.op("SLICE", [wt], f"{name}/g{i}/w", begin=[lo, 0, 0, 0],
                           size=[k, kh, kw, k])
            bi = self.g.op("SLICE", [bt], f"{name}/g{i}/b", begin=[lo], size=[k])
            outs.append(self.g.conv2d(xi, wi, bi, stride=s, padding=padding, activation=act,
                                      name=f"{name}/g{i}"))
        return self.g.concatenation(outs, 3, name=name)

    def resize(self, node: fx.Node, r: Resize) -> _V:
        """Upsampling by integer factors: torch's nearest takes floor(dst / factor), TFLite's
        nearest without flags the same; bilinear with align_corners=False is TFLite's
        half_pixel_centers."""
        x = self.arg(node, 0, 4).name
        _, h, w, _ = self.g.shape(x)
        op = "RESIZE_NEAREST_NEIGHBOR" if r.mode == "nearest" else "RESIZE_BILINEAR"
        half = r.mode == "bilinear" and not r.align_corners
        return _V(self.g.op(op, [x], self.name(node), size=list(r.out_hw(h, w)),
                            align_corners=r.align_corners, half_pixel_centers=half))

    def _spec(self, node: fx.Node, spec, arg):
        try:
            return spec(arg)
        except ValueError as e:  # trainer.nest refuses the same at nest time
            raise self.fail(node, str(e)) from None

    def pool(self, node: fx.Node, p: Pool) -> _V:
        """Torch's padding (and ceil_mode's extra bottom/right rows) as an explicit pad, then
        a VALID pool: TFLite's SAME pads asymmetrically and would shift every window. Max
        pooling pads with the lowest float (PADV2), average pooling with zeros, which torch
        counts in the divisor too (count_include_pad, checked by trainer.nest_ops)."""
        x = self.arg(node, 0, 4).name
        _, h, w, _ = self.g.shape(x)
        (ph, pw), eh, ew = p.padding, p.extra(h, 0), p.extra(w, 1)
        name = self.name(node)
        if ph or pw or eh or ew:
            pads = [(0, 0), (ph, ph + eh), (pw, pw + ew), (0, 0)]
            if p.is_max:
                x = self.g.op("PADV2", [x], f"{name}/pad", paddings=pads, value=_NEG)
            else:
                x = self.g.pad(x, pads, name=f"{name}/pad")
        op = self.g.max_pool2d if p.is_max else self.g.average_pool2d
        return _V(op(x, list(p.kernel), list(p.stride), "VALID", name=name))

    def activation(self, x: str, act: str, name: str) -> str:
        """One activation as TFLite ops: RELU, RELU6, HARD_SWISH and LOGISTIC are builtins;
        SiLU is x * LOGISTIC(x); hardsigmoid(x) = relu6(x + 3) / 6."""
        if act in ("relu", "relu6", "hardswish", "sigmoid"):
            op = {"relu": "RELU", "relu6": "RELU6", "hardswish": "HARD_SWISH",
                  "sigmoid": "LOGISTIC"}[act]
            return self.g.op(op, [x], name)
        if act == "silu":
            return self.g.op("MUL", [x, self.g.op("LOGISTIC", [x], f"{name}/sigmoid")], name)
        if act == "hardsigmoid":
            # scalars as options: the weight store's graphs carry no constants but the layers'
            y = self.g.op("RELU6", [self.g.op("ADD", [x], f"{name}/plus3", scalar=3.0)],
                          f"{name}/relu6")
            return self.g.op("MUL", [y], name, scalar=1.0 / 6.0)
        raise ConfigError(f"{name}: activation {act!r} cannot be lowered")

    def mul(self, node: fx.Node) -> _V:
        """A squeeze-excitation gate: [N, 1, 1, C] times [N, H, W, C] (MUL broadcasts)."""
        a, b = self.arg(node, 0), self.arg(node, 1)
        if a.flat_from is not None or b.flat_from is not None:
            raise self.fail(node, "cannot multiply values flattened from a spatial map")
        return _V(self.g.op("MUL", [a.name, b.name], self.name(node)))


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _fusable(act: str | None) -> bool:
    """TFLite fuses only ReLU and ReLU6 into a conv / fully connected op."""
    return act in (None, "relu", "relu6")
