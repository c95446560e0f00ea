"""Lower a truncated nested model's ``torch.fx`` graph to a graph description ("One
lowering and one writer").

The model is traced with :func:`torch.fx` (each :class:`trainer.layers.BayesNestedLayer` is one
leaf: its sampling and masking branches are not traced), and every node becomes TFLite ops in an
:class:`edge_sdk.tflite.build.GraphBuilder`: nothing here knows a model class, so any network
built from the supported nodes exports. Activations are NCHW in torch and NHWC in the graph;
a value flattened from a spatial map carries the (H, W, C) it came from, so the fully connected
layer reading it permutes its weight columns from torch's (C, H, W) order.

Supported nodes: Bayesian conv (plain and depthwise) and linear layers (weights folded and routed
by :func:`exporters.weights.prepare_weights`); ``+`` / ``torch.add``; ``torch.cat``; max and
average pooling (square, no padding, floor mode); ``x[:, :, ::s, ::s]`` (a 1x1 max pool at
stride s) and ``F.pad`` of channels (a pad shortcut); global average pooling
(``adaptive_avg_pool2d(x, 1)``, ``mean`` over H and W); ``flatten`` from dimension 1; ReLU and
ReLU6 (modules, functions and methods); ``nn.Identity`` and ``nn.Dropout`` (eval: identity).
Anything else is a :class:`ConfigError` naming the fx node.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx, nn

from edge_sdk.errors import ConfigError
from edge_sdk.tflite.graph import tflite_weight
from edge_sdk.tflite.tensors import QUANT_AXIS
from edge_sdk.tflite.build import GraphBuilder
from exporters.weights import LayerWeights
from trainer.layers import BayesNestedConv2d, BayesNestedLayer, BayesNestedLinear
from exporters.lowering_ops import _V, _fusable, _Ops, _pair
from trainer.nest_ops import (MUL, POOL_FUNCTIONS, RESIZE_FUNCTIONS, UPSAMPLE_MODULES,
                              activation_of, global_pool_size_ok, mean_dims, pool_of_call,
                              pool_of_module, resize_of_call, resize_of_module)

__all__ = ["lower"]


class _Tracer(fx.Tracer):
    """Bayesian layers are leaves: one node each, lowered from their folded weights."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, BayesNestedLayer) or super().is_leaf_module(m, qualname)


_ADD = {operator.add, torch.add, operator.iadd}
_CAT = {torch.cat, torch.concat}
_FLATTEN = {torch.flatten, "flatten"}


class _Lowering(_Ops):
    def __init__(self, model: nn.Module, weights: dict[str, LayerWeights], g: GraphBuilder):
        self.model, self.weights, self.g = model, weights, g
        self.modules = dict(model.named_modules())
        self.records: list[dict] = []
        self.env: dict[fx.Node, _V] = {}
        # the input of the final linear classifier: the "penultimate features" the
        # out-of-distribution score reads; None when the logits do not come from a linear layer
        self.features: str | None = None

    # ---- helpers ---------------------------------------------------------------------------
    def fail(self, node: fx.Node, why: str) -> ConfigError:
        target = node.target if isinstance(node.target, str) else \
            getattr(node.target, "__name__", repr(node.target))
        return ConfigError(f"fx node {node.name!r} ({node.op} {target}): {why}")

    def arg(self, node: fx.Node, i: int = 0, rank: int | None = None) -> _V:
        a = node.args[i] if i < len(node.args) else None
        if not isinstance(a, fx.Node) or a not in self.env:
            raise self.fail(node, f"argument {i} must be a tensor computed by the graph")
        v = self.env[a]
        if rank is not None and len(self.g.shape(v.name)) != rank:
            raise self.fail(node, f"expects a rank-{rank} input, got shape "
                                  f"{list(self.g.shape(v.name))} (NHWC)")
        return v

    def option(self, node: fx.Node, i: int, key: str, default: Any) -> Any:
        if i < len(node.args):
            return node.args[i]
        return node.kwargs.get(key, default)

    def nhwc_dim(self, node: fx.Node, v: _V, dim: int) -> int:
        """A torch (NCHW) dimension as the graph's (NHWC) one."""
        rank = len(self.g.shape(v.name))
        if not -rank <= dim < rank:
            raise self.fail(node, f"dimension {dim} is out of range for rank {rank}")
        dim %= rank
        return dim if rank != 4 else (0, 3, 1, 2)[dim]

    # ---- the walk --------------------------------------------------------------------------
    def run(self, input_name: str) -> str:
        graph = _Tracer().trace(self.model)
        out = None
        for node in graph.nodes:
            if node.op == "placeholder":
                if any(n.op == "placeholder" for n in self.env):
                    raise self.fail(node, "the model must take exactly one input")
                self.env[node] = _V(input_name)
            elif node.op == "output":
                res = node.args[0]
                if not isinstance(res, fx.Node):
                    raise self.fail(node, "the model must return one tensor (logits)")
                out = self.env[res]
                if res.op == "call_module" and isinstance(self.modules.get(res.target),
                                                          BayesNestedLinear):
                    feat = res.args[0] if res.args else None
                    if isinstance(feat, fx.Node) and feat in self.env:
                        self.features = self.env[feat].name
            elif node.op == "call_module":
                self.env[node] = self.call_module(node, self.modules[node.target])
            elif node.op in ("call_function", "call_method"):
                self.env[node] = self.call(node, node.target)
            else:
                raise self.fail(node, "unsupported node (a parameter or buffer read in "
                                      "forward cannot be lowered)")
        if out is None or len(self.g.shape(out.name)) != 2 or out.flat_from is not None:
            raise ConfigError("the model must return [N, classes] logits (after a linear layer)")
        return out.name

    def call_module(self, node: fx.Node, m: nn.Module) -> _V:
        if isinstance(m, BayesNestedConv2d):
            return _V(self.conv(node, self.arg(node, 0, 4).name, m))
        if isinstance(m, BayesNestedLinear):
            return _V(self.linear(node, self.arg(node), m))
        if isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
            return self.pool(node, self._spec(node, pool_of_module, m))
        if isinstance(m, UPSAMPLE_MODULES):
            return self.resize(node, self._spec(node, resize_of_module, m))
        act = activation_of(node, self.modules)
        if act is not None:
            x = self.arg(node)
            return _V(self.activation(x.name, act, self.name(node)), x.flat_from)
        if isinstance(m, nn.AdaptiveAvgPool2d):
            return self.global_pool(node, m.output_size)
        if isinstance(m, nn.Flatten):
            if (m.start_dim, m.end_dim) != (1, -1):
                raise self.fail(node, f"only Flatten(1, -1) is supported, got {m}")
            return self.flatten(node)
        if isinstance(m, (nn.Identity, nn.Dropout)):  # eval mode: identity
            return self.arg(node)
        raise self.fail(node, f"unsupported module {type(m).__name__} (supported: Bayesian "
                              "conv/linear, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d(1), ReLU, "
                              "ReLU6, Hardswish, Hardsigmoid, SiLU, Sigmoid, Flatten, Identity, "
                              "Dropout)")

    def call(self, node: fx.Node, fn: Callable | str) -> _V:
        if fn in _ADD:
            a, b = self.arg(node, 0), self.arg(node, 1)
            if node.kwargs.get("alpha", 1) != 1 or a.flat_from != b.flat_from:
                raise self.fail(node, "only a plain sum of two same-layout tensors is supported")
            if self.g.shape(a.name) != self.g.shape(b.name):
                raise self.fail(node, f"adds {list(self.g.shape(a.name))} and "
                                      f"{list(self.g.shape(b.name))}: ADD needs equal shapes")
            return _V(self.g.add(a.name, b.name, name=self.name(node)), a.flat_from)
        if fn in _CAT:
            return self.cat(node)
        act = activation_of(node, self.modules)
        if act is not None:
            x = self.arg(node)
            return _V(self.activation(x.name, act, self.name(node)), x.flat_from)
        if fn in MUL:
            return self.mul(node)
        if fn in _FLATTEN:
            if self.option(node, 1, "start_dim", 0) != 1 or \
                    self.option(node, 2, "end_dim", -1) != -1:
                raise self.fail(node, "only flatten(x, 1) is supported")
            return self.flatten(node)
        if fn is F.adaptive_avg_pool2d:
            return self.global_pool(node, self.option(node, 1, "output_size", None))
        if fn in POOL_FUNCTIONS:
            return self.pool(node, self._spec(node, pool_of_call, node))
        if fn in RESIZE_FUNCTIONS:
            return self.resize(node, self._spec(node, resize_of_call, node))
        if fn is operator.getitem:
            return self.subsample(node)
        if fn is F.pad:
            return self.channel_pad(node)
        if fn in (torch.mean, "mean"):
            if mean_dims(node) != [2, 3] or len(self.g.shape(self.arg(node).name)) != 4:
                raise self.fail(node, "only the mean over H and W of an NCHW map is supported")
            return self.global_pool(node, 1, self.option(node, 2, "keepdim", False))
        name = fn if isinstance(fn, str) else getattr(fn, "__name__", repr(fn))
        raise self.fail(node, f"unsupported {'method' if isinstance(fn, str) else 'function'} "
                              f"{name}")

    def name(self, node: fx.Node) -> str:
        target = node.target if isinstance(node.target, str) and node.op == "call_module" \
            else node.name
        return self.g.unique(target)

    # ---- ops ---------------------------------------------------------------------------------
    def _weight(self, node: fx.Node, layer: BayesNestedLayer, kind: str,
                flat_hw: tuple[int, int] | None = None) -> tuple[str, str]:
        """The layer's filter (int8 + DEQUANTIZE, int8 for hybrid, or float) and bias tensors;
        the layout transform is :func:`edge_sdk.tflite.graph.tflite_weight` (shared with the store's
        materialiser), int8 scales along :data:`edge_sdk.tflite.graph.QUANT_AXIS`."""
        name = node.target
        axis = QUANT_AXIS[kind]

        def to_tflite(w: np.ndarray) -> np.ndarray:
            return tflite_weight(w, kind, flat_hw)

        lw = self.weights.get(name)
        if lw is None:
            raise self.fail(node, "no prepared weights for this layer")
        if f"{name}/bias" in self.g.tensors:
            raise self.fail(node, "the layer is called twice (shared weights): not supported")
        if lw.quant is None:
            wt = self.g.add_const(to_tflite(lw.weight), f"{name}/weight")
        else:
            # per-channel int8: quantized dimension 0 for CONV_2D / FULLY_CONNECTED filters,
            # 3 for DEPTHWISE_CONV_2D ([1, kh, kw, C])
            q = self.g.add_const(to_tflite(lw.quant.values), f"{name}/weight_int8",
                                 _Quant(lw.quant.scale, axis))
            # hybrid: the int8 filter goes straight into CONV_2D / FULLY_CONNECTED (the kernel
            # quantizes activations per invoke); otherwise DEQUANTIZE -> float op (exact)
            wt = q if lw.route == "hybrid" else self.g.dequantize(q, f"{name}/weight")
        bt = self.g.add_const(lw.bias, f"{name}/bias")
        # how far the int8 grid moved the folded weights (0 when exact or on the float route)
        err = float(np.abs(lw.effective() - lw.weight).max()
                    / max(np.abs(lw.weight).max(), 1e-30))
        self.records.append({"layer": name, "shape": list(self.g.shape(wt)), "route": lw.route,
                             "exact": lw.exact, "max_rel_error": err, "kind": kind,
                             "flat_hw": None if flat_hw is None else list(flat_hw)})
        return wt, bt

    def conv(self, node: fx.Node, x: str, layer: BayesNestedConv2d) -> str:
        channels = self.g.shape(x)[-1]
        if channels != layer.in_channels:
            raise self.fail(node, f"{node.target} expects {layer.in_channels} input channels, "
                                  f"the graph has {channels}")
        k, s, p = (_pair(v) for v in (layer.kernel_size, layer.stride, layer.padding))
        name = node.target
        if p == (0, 0):
            padding = "VALID"
        elif s == (1, 1) and all(2 * pp == kk - 1 for pp, kk in zip(p, k)):
            padding = "SAME"  # stride 1, odd k: TFLite pads (k-1)/2 on both sides, as torch does
        else:
            # (gotcha) TFLite SAME at stride 2 pads asymmetrically (the extra row goes at the
            # bottom/right), torch pads p on both sides: a silent ~3 % logit error. PAD + VALID.
            x = self.g.pad(x, [(0, 0), (p[0], p[0]), (p[1], p[1]), (0, 0)], name=f"{name}/pad")
            padding = "VALID"
        s = s[0] if s[0] == s[1] else list(s)
        fused, out = _fusable(layer.activation), name
        if not fused:
            name = f"{name}/linear"
        if getattr(layer, "grouped", False):
            y = self.grouped_conv(node, x, layer, s, padding, fused, name)
        elif layer.depthwise:
            wt, bt = self._weight(node, layer, "depthwise")
            y = self.g.depthwise_conv2d(x, wt, bt, stride=s, padding=padding,
                                        activation=layer.activation if fused else None,
                                        name=name)
        else:
            wt, bt = self._weight(node, layer, "conv")  # OIHW -> OHWI
            y = self.g.conv2d(x, wt, bt, stride=s, padding=padding,
                              activation=layer.activation if fused else None, name=name)
        return y if fused else self.activation(y, layer.activation, self.g.unique(out))
    def linear(self, node: fx.Node, x: _V, layer: BayesNestedLinear) -> str:
        shape = self.g.shape(x.name)
        h, w, _ = x.flat_from or (1, 1, None)
        if len(shape) != 2 or shape[1] != layer.in_features or layer.input_spatial != h * w:
            raise self.fail(node, f"{node.target} expects {layer.in_features} inputs flattened "
                                  f"from {layer.input_spatial} positions; the graph has "
                                  f"{list(shape)} from {h}x{w}")
        # torch flattened (C, H, W); NHWC flattens (H, W, C): the columns are permuted
        wt, bt = self._weight(node, layer, "linear", (h, w))
        if _fusable(layer.activation):
            return self.g.fully_connected(x.name, wt, bt, activation=layer.activation,
                                          name=node.target)
        y = self.g.fully_connected(x.name, wt, bt, name=f"{node.target}/linear")
        return self.activation(y, layer.activation, self.g.unique(node.target))
    def global_pool(self, node: fx.Node, size, keep_dims: bool = True) -> _V:
        if not global_pool_size_ok(size):
            raise self.fail(node, f"only global pooling (output size 1) is supported, got {size}")
        x = self.arg(node, 0, 4).name
        users = list(node.users)
        # pooled then flattened (the usual classifier input): one MEAN without the 1x1 dims
        flat = len(users) == 1 and (users[0].target in _FLATTEN or isinstance(
            self.modules.get(users[0].target), nn.Flatten))
        out = self.g.mean(x, (1, 2), keep_dims=keep_dims and not flat, name=self.name(node))
        return _V(out)

    def flatten(self, node: fx.Node) -> _V:
        x = self.arg(node)
        shape = self.g.shape(x.name)
        if len(shape) == 2:
            return x  # already [N, features] (e.g. a global pool's MEAN)
        if len(shape) != 4:
            raise self.fail(node, f"cannot flatten a rank-{len(shape)} value")
        _, h, w, c = shape
        # -1, not the batch: the interpreter can then be resized to [N, H, W, C] (batch predict)
        out = self.g.reshape(x.name, (-1, h * w * c), name=self.name(node))
        return _V(out, None if h * w == 1 else (h, w, c))

    def subsample(self, node: fx.Node) -> _V:
        """``x[:, :, ::s, ::s]`` (a strided shortcut's subsample) is a 1x1 max pool at stride s:
        VALID gives (H - 1) // s + 1 rows, the slice's ceil(H / s)."""
        idx = node.args[1] if len(node.args) > 1 else None
        full = slice(None)
        steps = [t.step for t in idx[2:]] if isinstance(idx, tuple) and len(idx) == 4 and \
            idx[:2] == (full, full) and all(isinstance(t, slice) and t.start is None and
                                            t.stop is None for t in idx[2:]) else None
        if not steps or steps[0] != steps[1] or not isinstance(steps[0], int):
            raise self.fail(node, "only x[:, :, ::s, ::s] indexing is supported")
        x = self.arg(node, 0, 4).name
        return _V(self.g.max_pool2d(x, 1, steps[0], "VALID", name=self.name(node)))

    def channel_pad(self, node: fx.Node) -> _V:
        """Zero channels appended at the end (a pad-at-end shortcut): PAD on NHWC's last axis."""
        pad = list(self.option(node, 1, "pad", ()))
        mode, value = self.option(node, 2, "mode", "constant"), self.option(node, 3, "value", None)
        if len(pad) != 6 or any(pad[:4]) or mode != "constant" or value not in (None, 0, 0.0):
            raise self.fail(node, "only zero padding of the channels of an NCHW map, "
                                  "F.pad(x, (0, 0, 0, 0, before, after)), is supported")
        x = self.arg(node, 0, 4).name
        return _V(self.g.pad(x, [(0, 0), (0, 0), (0, 0), (pad[4], pad[5])], name=self.name(node)))

    def cat(self, node: fx.Node) -> _V:
        xs = node.args[0] if node.args else node.kwargs.get("tensors")
        if not isinstance(xs, (list, tuple)) or not all(isinstance(a, fx.Node) for a in xs):
            raise self.fail(node, "torch.cat needs a list of tensors computed by the graph")
        vs = [self.env[a] for a in xs]
        if any(v.flat_from is not None for v in vs):
            raise self.fail(node, "cannot concatenate values flattened from a spatial map")
        axis = self.nhwc_dim(node, vs[0], self.option(node, 1, "dim", 0))
        return _V(self.g.concatenation([v.name for v in vs], axis, name=self.name(node)))


@dataclass(frozen=True)
class _Quant:
    scale: np.ndarray
    axis: int

def lower(model: nn.Module, g: GraphBuilder, x: str, weights: dict[str, LayerWeights],
          features: list[str] | None = None) -> tuple[str, list[dict]]:
    """Lower ``model`` (truncated, eval) into ``g`` reading the graph input ``x``; returns the
    logits tensor's name and, per Bayesian layer, how its weights were written (shape, route,
    exactness, the int8 grid's largest relative move). ``features``: a list that receives the
    name of the final linear classifier's input tensor (the OOD score's penultimate features),
    when the logits come straight from a linear layer."""
    lowering = _Lowering(model, weights, g)
    out = lowering.run(x)
    if features is not None and lowering.features is not None:
        features.append(lowering.features)
    return out, lowering.records
