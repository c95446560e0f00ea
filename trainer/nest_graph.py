"""The analysis half of :func:`trainer.nest` (trainer/nesting.py; BN³ App. 8.1-8.2,
9.1): find the blocks (conv/linear + BN + activation) of a traced network, the channel spaces
that adds tie together, and which space gets an ordering unit. Every unsupported node or unmet
rule raises a :class:`ConfigError` naming the fx node. The rules are stated in
:mod:`trainer.nesting`.

A *space* is a variable for "the channel layout of this value". A layer's output opens a new
one; ReLU, pooling, flatten, dropout keep it; a depthwise conv keeps its input's (so it follows
the input's unit); an add unifies its operands' (union-find: summed values must truncate
identically); a concatenation is a list of segments, one per branch, each keeping its space.
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

from trainer.nest_ops import (HOMOGENEOUS, MUL, POOL_FUNCTIONS, RESIZE_FUNCTIONS,
                              UPSAMPLE_MODULES, activation_of, global_pool_size_ok,
                              is_stochastic_depth, mean_dims, pool_of_call, pool_of_module,
                              resize_of_call, resize_of_module)
from trainer.nest_plan import (_ADD, _CAT, _FLATTEN, _PASS_MODULES, SUPPORTED, Block, Plan,
                               _arg, _make_block, _only_user, fail, module_path)
from trainer.nest_rules import (Sum, _check, _check_forward_folds, _gate, _norm_block,
                                _option_a, _pad_at_end, _refuse_reshape, _spatial_stride)

__all__ = ["Block", "Plan", "SUPPORTED", "analyse", "fail", "module_path"]


def analyse(gm: fx.GraphModule, residual: str, nest_stem: bool) -> Plan:
    """Blocks, spaces and nested spaces of ``gm`` (see the module docstring)."""
    plan = Plan()
    plan.residual = residual
    modules = dict(gm.named_modules())
    env: dict[fx.Node, list] = {}  # value -> segments (space, channels or None, producer)
    absorbed: set[fx.Node] = set()
    relu6_nodes: set[fx.Node] = set()  # non-homogeneous activations a forward fold cannot pass
    placeholder = None
    for node in gm.graph.nodes:  # the shortcut rule first: its strided slice comes before it
        if node.target is F.pad:
            _option_a(node)
    for node in gm.graph.nodes:
        if node in absorbed:
            continue
        _refuse_reshape(node, modules)
        if node.op == "placeholder":
            if placeholder is not None:
                raise fail(node, "the model must take exactly one input")
            placeholder = plan.new_space()
            plan.fixed[placeholder] = "input"
            env[node] = [(placeholder, None, None)]
        elif node.op == "output":
            res = node.args[0]
            if not isinstance(res, fx.Node):
                raise fail(node, "the model must return one tensor (logits)")
            for s, _, src in env[res]:
                plan.fixed[plan.root(s)] = "classifier (Bayesian, not nested)"
                plan.classifier = src
        elif node.op == "get_attr":
            # refused where it is used: in a ConvNeXt block the layer scale is read before the
            # permute that says more
            env[node] = node
        elif node.op == "call_module" and isinstance(modules[node.target], (nn.Conv2d, nn.Linear)):
            if any(x.node.target == node.target for x in plan.blocks):
                raise fail(node, "the layer is called twice (shared weights): each call would "
                                 "need its own ordering and batch norm")
            b = _make_block(node, modules[node.target], modules)
            absorbed.update(b.absorbed)
            b.inputs = _arg(node, env)
            if b.kind in ("depthwise", "grouped"):
                if len(b.inputs) != 1:
                    raise fail(node, f"a {b.kind} conv of a concatenation is not supported")
                b.out_space = b.inputs[0][0]  # follows its input's unit
                if b.kind == "grouped":  # the unit's groups must cut whole conv groups
                    plan.divides.setdefault(b.out_space, []).append(b.module.groups)
            else:
                b.out_space = plan.new_space()
                if any(s == placeholder for s, _, _ in b.inputs) and not nest_stem:
                    plan.fixed[b.out_space] = "stem (nest_stem=False)"
            plan.blocks.append(b)
            env[b.last] = [(b.out_space, b.out_channels, b)]
            if b.activation is not None and not HOMOGENEOUS[b.activation]:
                relu6_nodes.add(b.last)
        elif node.op == "call_module":
            m = modules[node.target]
            if isinstance(m, nn.BatchNorm2d):
                b = _norm_block(node, m, modules, env, plan)
                absorbed.update(b.absorbed)
                if b.activation is not None and not HOMOGENEOUS[b.activation]:
                    relu6_nodes.add(b.last)
                continue
            act = activation_of(node, modules)
            if isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
                _check(node, pool_of_module, m)
            elif isinstance(m, UPSAMPLE_MODULES):
                _check(node, resize_of_module, m)  # keeps the channel layout
            elif isinstance(m, nn.AdaptiveAvgPool2d):
                if not global_pool_size_ok(m.output_size):
                    raise fail(node, f"only global pooling, AdaptiveAvgPool2d(1), is exported; "
                                     f"got output_size={m.output_size}")
            elif act is None and not isinstance(m, _PASS_MODULES):
                raise fail(node, f"unsupported module {type(m).__name__} (supported: {SUPPORTED})")
            if act is not None and not HOMOGENEOUS[act]:
                relu6_nodes.add(node)
            env[node] = _arg(node, env)
        else:
            env[node] = _function(node, env, plan, relu6_nodes)
    _decide(plan, residual)
    _check_forward_folds(plan, modules, relu6_nodes)
    return plan


def _function(node: fx.Node, env: dict, plan: Plan, relu6_nodes: set) -> list:
    fn = node.target
    if fn in _ADD:
        a, b = _arg(node, env, 0), _arg(node, env, 1)
        if len(a) != 1 or len(b) != 1:
            raise fail(node, "adds a concatenation: its branches cannot stay aligned")
        s = plan.union(a[0][0], b[0][0])
        plan.added.add(s)
        return [(s, a[0][1] or b[0][1], Sum([a[0][2], b[0][2]]))]
    if fn in _CAT:
        xs = node.args[0] if node.args else node.kwargs.get("tensors")
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if dim not in (1, -3):
            raise fail(node, f"only concatenation along channels (dim 1) is supported, got {dim}")
        segs = [seg for x in xs for seg in env[x]]
        if any(ch is None for _, ch, _ in segs):
            raise fail(node, "concatenates the network input: its channel count is unknown")
        return segs
    if fn is F.pad:
        return _pad_at_end(node, env, plan)
    if fn is operator.getitem:
        if _spatial_stride(node) is None:
            raise fail(node, "only x[:, :, ::s, ::s] (a strided spatial subsample) is supported")
        return _arg(node, env)
    act = activation_of(node, {})
    if act is not None:
        if not HOMOGENEOUS[act]:
            relu6_nodes.add(node)
        return _arg(node, env)
    if fn in MUL:
        return _gate(node, env, plan)
    if is_stochastic_depth(node):
        return _arg(node, env)  # dropped by nest() (an identity at inference)
    if fn in _FLATTEN:
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
        if (start, end) != (1, -1):
            raise fail(node, f"only flatten(x, 1) is exported, got start_dim={start} "
                             f"end_dim={end}")
        return _arg(node, env)
    if fn in POOL_FUNCTIONS:
        _check(node, pool_of_call, node)
        return _arg(node, env)
    if fn in RESIZE_FUNCTIONS:
        _check(node, resize_of_call, node)
        return _arg(node, env)
    if fn is F.adaptive_avg_pool2d:
        size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
        if not global_pool_size_ok(size):
            raise fail(node, f"only global pooling (output size 1) is exported, got {size}")
        return _arg(node, env)
    if fn in (torch.mean, "mean"):
        if mean_dims(node) != [2, 3]:
            raise fail(node, "only the mean over H and W of an NCHW map, x.mean((2, 3)), is "
                             "exported")
        return _arg(node, env)
    name = fn if isinstance(fn, str) else getattr(fn, "__name__", repr(fn))
    raise fail(node, f"unsupported {'method' if isinstance(fn, str) else 'function'} {name} "
                     f"(supported: {SUPPORTED})")


def _decide(plan: Plan, residual: str) -> None:
    """Which spaces get a unit, and which blocks mask (see the rules in trainer.nesting)."""
    fixed = {plan.root(s): why for s, why in plan.fixed.items()}
    added = {plan.root(s) for s in plan.added}
    plan.fixed, plan.added = fixed, added
    channels: dict[int, tuple[int, Block]] = {}
    for b in plan.blocks:
        r = plan.root(b.out_space)
        if r in channels and channels[r][0] != b.out_channels:
            raise fail(b.node, f"is summed with {channels[r][1].node.name!r} but has "
                               f"{b.out_channels} channels, not {channels[r][0]}")
        channels.setdefault(r, (b.out_channels, b))
        if r in fixed or (r in added and residual == "inner"):
            continue
        if b.out_channels % 4:
            # ordering groups hold multiples of 4 channels (TFLite/XNNPACK): such a layer (an
            # efficientnet squeeze of 6 channels) runs at full width in every slice
            fixed[r] = f"{b.out_channels} channels, not a multiple of 4"
            continue
        plan.nested.add(r)
    for b in plan.blocks:
        user = _only_user(b.last)
        dw = next((x for x in plan.blocks if x.node is user), None)
        if b.kind not in ("depthwise", "grouped") and plan.unit_of(b) is not None and \
                dw is not None and dw.kind in ("depthwise", "grouped"):
            b.apply_mask = False  # masked once, after the depthwise block (exact: see nest)
        if b.gate:
            b.apply_mask = False  # the gated value is masked; the gate multiplies it
        b.forward_fold = plan.unit_of(b) is not None and b.apply_mask and \
            b.activation is not None and not HOMOGENEOUS[b.activation]
