"""The analysis half of :func:`trainer.nest` (trainer/nesting.py; issue 20; BN³ App. 8.1-8.2,
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
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import fx, nn

from edge_sdk.errors import ConfigError
from trainer.nest_ops import (GATES, HOMOGENEOUS, MUL, POOL_FUNCTIONS, RESIZE_FUNCTIONS,
                              UPSAMPLE_MODULES, activation_of, global_pool_size_ok,
                              is_stochastic_depth, mean_dims, pool_of_call, pool_of_module,
                              resize_of_call, resize_of_module)

_ADD = {operator.add, torch.add, operator.iadd}
_CAT = {torch.cat, torch.concat}
_FLATTEN = {torch.flatten, "flatten"}
_PASS_MODULES = (nn.Flatten, nn.Identity, nn.Dropout)
_RESHAPES = {"size", "view", "reshape", "permute", "transpose", "chunk", "split", "contiguous",
             "layer_norm", "unflatten", "flatten_", "view_as", "expand"}
SUPPORTED = ("Conv2d (plain, depthwise or grouped), BatchNorm2d (after a conv, or before: "
             "pre-activation), Linear, ReLU, ReLU6, "
             "Hardswish, SiLU, Sigmoid/Hardsigmoid gates (x * gate, squeeze-excitation), "
             "MaxPool2d / AvgPool2d (padded; max also ceil_mode), AdaptiveAvgPool2d(1), "
             "Upsample / F.interpolate (nearest, bilinear; integer factors), Flatten, Identity, "
             "Dropout, stochastic depth, +, torch.cat, flatten, mean over H and W, "
             "x[:, :, ::s, ::s], F.pad of channels at the end")


def module_path(node: fx.Node) -> str | None:
    """The user's module path the node was traced in (``features.3.block.1``), or None at the
    top level."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack)) if stack else None


def fail(node: fx.Node, why: str) -> ConfigError:
    target = node.target if isinstance(node.target, str) else \
        getattr(node.target, "__name__", repr(node.target))
    where = module_path(node)
    inside = f" in module {where!r}" if where and node.op != "call_module" else ""
    return ConfigError(f"nest: fx node {node.name!r} ({node.op} {target}){inside}: {why}")


@dataclass(eq=False)
class Block:
    node: fx.Node  # the conv / linear node
    module: nn.Module
    kind: str  # conv | depthwise | linear
    out_channels: int
    bn: nn.Module | None = None
    bn_node: fx.Node | None = None
    activation: str | None = None
    absorbed: list = field(default_factory=list)  # BN / activation nodes folded into the block
    inputs: list = field(default_factory=list)  # segments (space, channels, producing block)
    out_space: int = -1
    apply_mask: bool = True
    forward_fold: bool = False
    gate: bool = False  # a squeeze-excitation gate: follows the gated value's unit, no mask

    @property
    def last(self) -> fx.Node:
        return self.absorbed[-1] if self.absorbed else self.node


class Plan:
    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.parent: dict[int, int] = {}
        self.fixed: dict[int, str] = {}  # space -> why it stays full width
        self.added: set[int] = set()
        self.nested: set[int] = set()
        self.residual = "inner"
        self.classifier: Block | None = None  # the block producing the output
        self.divides: dict[int, list] = {}  # space -> grouped convs' groups (unit g | each)

    def new_space(self) -> int:
        s = len(self.parent)
        self.parent[s] = s
        return s

    def root(self, s: int) -> int:
        while self.parent[s] != s:
            self.parent[s] = self.parent[self.parent[s]]
            s = self.parent[s]
        return s

    def union(self, a: int, b: int) -> int:
        ra, rb = self.root(a), self.root(b)
        self.parent[max(ra, rb)] = min(ra, rb)
        return min(ra, rb)

    def divides_of(self, r: int) -> list:
        """The conv group counts a unit of space ``r`` must divide."""
        return [g for s, gs in self.divides.items() if self.root(s) == r for g in gs]

    def unit_of(self, b: Block) -> int | None:
        r = self.root(b.out_space)
        return r if r in self.nested else None

    def folds(self, src: Block | None) -> bool:
        return src is not None and src.forward_fold

    def describe(self, b: Block, units: dict) -> str:
        r = self.root(b.out_space)
        if r not in self.nested:
            if r in self.added and self.residual == "inner":
                why = "residual stream (residual='inner')"
            elif r in self.added:  # stage mode, but the stream carries a fixed-width value
                why = f"residual stream with a full-width member ({self.fixed[r]})"
            else:
                why = self.fixed.get(r, "not nested")
            return f"full width: {why}"
        users = [x for x in self.blocks if self.unit_of(x) == r]
        how = "follows its input's unit" if b.kind == "depthwise" else (
            "follows its input's unit by whole groups" if b.kind == "grouped" else
            f"shared by {len(users)} summed layers" if r in self.added else
            f"shared by {len(users)} layers" if len(users) > 1 else "own unit")
        extra = ", squeeze-excitation gate (unmasked)" if b.gate else \
            ", masked after its depthwise" if not b.apply_mask else (
            ", rescale folded forward" if b.forward_fold else "")
        return f"unit u{sorted(units).index(r)}: {how}{extra}"


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].args[:1] == (node,) else None


def _make_block(node: fx.Node, m: nn.Module, modules: dict) -> Block:
    if isinstance(m, nn.Linear):
        b = Block(node, m, "linear", m.out_features)
    else:
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            raise fail(node, f"only numeric zero padding is supported, got padding={m.padding!r}"
                             f" padding_mode={m.padding_mode!r}")
        if m.dilation != (1, 1):
            raise fail(node, f"dilation {m.dilation} is not supported")
        depthwise = m.groups > 1 and m.groups == m.in_channels == m.out_channels
        if m.groups > 1 and not depthwise and m.in_channels != m.out_channels:
            raise fail(node, f"grouped conv with groups={m.groups} ({m.in_channels} -> "
                             f"{m.out_channels}) is not supported: a grouped conv is nested by "
                             "whole groups, following its input, so it needs in == out "
                             "channels (depthwise, or groups=1, otherwise)")
        kind = "depthwise" if depthwise else "grouped" if m.groups > 1 else "conv"
        b = Block(node, m, kind, m.out_channels)
        user = _only_user(node)
        if user is not None and user.op == "call_module" and \
                isinstance(modules[user.target], nn.BatchNorm2d):
            b.bn, b.bn_node = modules[user.target], user
            b.absorbed.append(user)
    user = _only_user(b.last)
    act = None if user is None else activation_of(user, modules)
    if act is not None:
        b.activation = act
        b.absorbed.append(user)
    return b


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


def _norm_block(node: fx.Node, m: nn.BatchNorm2d, modules: dict, env: dict,
                plan: Plan) -> Block:
    """A pre-activation batch norm (DenseNet's norm -> relu -> conv over a concatenation): a
    1x1 depthwise block initialised to the identity, with this BN and the activation after it.
    It is not nested, and the value it reads stays full width: a BN over a concatenation of
    nested prefixes would need index sets, not prefixes (DenseNet then nests the bottleneck
    inside each layer, as ResNet's residual='inner' nests inside each block)."""
    if m.running_mean is None:
        raise fail(node, "a BatchNorm2d without running statistics (track_running_stats=False) "
                         "cannot fold at export")
    b = Block(node, m, "norm", m.num_features, bn=m, bn_node=node)
    user = _only_user(node)
    act = None if user is None else activation_of(user, modules)
    if act is not None:
        b.activation = act
        b.absorbed.append(user)
    b.inputs = _arg(node, env)
    for s, _, _ in b.inputs:
        plan.fixed.setdefault(s, "read by a pre-activation batch norm")
    b.out_space = plan.new_space()
    plan.fixed[b.out_space] = "pre-activation batch norm (identity 1x1 depthwise, not nested)"
    plan.blocks.append(b)
    env[b.last] = [(b.out_space, b.out_channels, b)]
    return b


def _arg(node: fx.Node, env: dict, i: int = 0) -> list:
    a = node.args[i] if i < len(node.args) else None
    if isinstance(a, fx.Node) and a.op == "get_attr":
        raise fail(a, "reads a parameter or buffer in forward (not a layer)")
    if not isinstance(a, fx.Node) or a not in env:
        raise fail(node, f"argument {i} must be a tensor computed by the graph")
    return env[a]


def _function(node: fx.Node, env: dict, plan: Plan, relu6_nodes: set) -> list:
    fn = node.target
    if fn in _ADD:
        a, b = _arg(node, env, 0), _arg(node, env, 1)
        if len(a) != 1 or len(b) != 1:
            raise fail(node, "adds a concatenation: its branches cannot stay aligned")
        s = plan.union(a[0][0], b[0][0])
        plan.added.add(s)
        return [(s, a[0][1] or b[0][1], None)]
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


def _refuse_reshape(node: fx.Node, modules: dict) -> None:
    """Shape reads and channel rearrangements, with the reason."""
    if node.op in ("call_function", "call_method"):
        fn = node.target
        name = fn if isinstance(fn, str) else getattr(fn, "__name__", "")
        if name in _RESHAPES:
            raise fail(node, f"{name}: reading or rearranging a tensor's shape (size, view, "
                             "reshape, permute, transpose, chunk, split) is not supported: a "
                             "nested width keeps a prefix of every layer's channels, which a "
                             "channel shuffle, attention or a LayerNorm over channels would "
                             "scatter or mix")
    elif node.op == "call_module" and isinstance(modules[node.target], (
            nn.LayerNorm, nn.MultiheadAttention, nn.GroupNorm)):
        raise fail(node, f"{type(modules[node.target]).__name__} is not supported: it mixes "
                         "every channel of a position (or attends across positions), so a "
                         "nested width's prefix of channels would change what it computes")


def _check(node: fx.Node, spec, arg) -> None:
    """Run an exporter rule of trainer.nest_ops; its ValueError becomes a ConfigError here."""
    try:
        spec(arg)
    except ValueError as e:
        raise fail(node, f"{e} (the exporter could not lower it)") from None


def _gate(node: fx.Node, env: dict, plan: Plan) -> list:
    """``x * gate`` where ``gate`` is a layer's sigmoid / hardsigmoid output read by nothing
    else (squeeze-excitation): the gate's layer joins x's space, so it keeps the channels x
    keeps (the gate follows its block), and it is not masked (x is)."""
    args = [a for a in node.args[:2] if isinstance(a, fx.Node)]
    for a in args:
        if a.op == "get_attr":
            raise fail(a, "reads a parameter or buffer in forward (not a layer)")
    if len(args) != 2 or any(a not in env for a in args):
        raise fail(node, "only x * gate of two tensors (a squeeze-excitation gate) is supported")
    segs = [env[a] for a in args]
    gates = [i for i, sg in enumerate(segs) if len(sg) == 1 and sg[0][2] is not None and
             sg[0][2].activation in GATES and sg[0][2].last is args[i] and
             len(args[i].users) == 1]
    if not gates:
        raise fail(node, "a product is supported only as a squeeze-excitation gate: x times "
                         "the sigmoid / hardsigmoid output of a conv or linear layer that "
                         "nothing else reads")
    g = gates[-1]
    x = segs[1 - g]
    gate = segs[g][0][2]
    if len(x) != 1:
        raise fail(node, "gates a concatenation: its branches cannot follow one gate")
    if x[0][1] is not None and x[0][1] != gate.out_channels:
        raise fail(node, f"gates {x[0][1]} channels with {gate.out_channels}")
    gate.gate = True
    plan.union(x[0][0], gate.out_space)
    return x


def _option_a(node: fx.Node) -> None:
    """ResNet's "option A" shortcut pads new channels on both sides of the identity."""
    pad = list(node.args[1] if len(node.args) > 1 else node.kwargs.get("pad", ()))
    if len(pad) >= 6 and pad[4] and pad[5]:
        raise fail(node, f"pads channels on both sides ({pad[4]}, {pad[5]}), like ResNet's "
                         "'option A' shortcut: the identity's channels sit in the middle, so no "
                         "prefix truncation keeps the sum aligned; use a 1x1 projection shortcut "
                         "or pad the new channels at the end")


def _spatial_stride(node: fx.Node) -> int | None:
    """s for ``x[:, :, ::s, ::s]``, else None (the exporter lowers it as a 1x1 max pool)."""
    idx = node.args[1] if len(node.args) > 1 else None
    full = slice(None, None, None)
    if not isinstance(idx, tuple) or len(idx) != 4 or idx[:2] != (full, full):
        return None
    a, b = idx[2:]
    ok = all(isinstance(t, slice) and t.start is None and t.stop is None and
             isinstance(t.step, int) and t.step >= 1 for t in (a, b))
    return a.step if ok and a.step == b.step else None


def _pad_at_end(node: fx.Node, env: dict, plan: Plan) -> list:
    """Zero channels appended after the identity (a pad-at-end shortcut): aligned under prefix
    truncation only if neither side is cut, so the padded value and its input stay full width
    (a stream they join is not nested, in either residual mode)."""
    _option_a(node)
    pad = list(node.args[1] if len(node.args) > 1 else node.kwargs.get("pad", ()))
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    value = node.args[3] if len(node.args) > 3 else node.kwargs.get("value", None)
    if len(pad) != 6 or any(pad[:5]) or pad[5] <= 0 or mode != "constant" or value not in (
            None, 0, 0.0):
        raise fail(node, f"only zero channels padded at the end, F.pad(x, (0, 0, 0, 0, 0, n)), "
                         f"are supported; got pad={pad} mode={mode!r} value={value!r}")
    segs = _arg(node, env)
    if any(ch is None for _, ch, _ in segs):
        raise fail(node, "pads the network input: its channel count is unknown")
    for s, _, _ in segs:
        plan.fixed.setdefault(s, "padded into a shortcut (pad at the end)")
    out = plan.new_space()
    plan.fixed[out] = "padded shortcut (pad at the end)"
    return [(out, sum(ch for _, ch, _ in segs) + pad[5], None)]


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


def _check_forward_folds(plan: Plan, modules: dict, relu6_nodes: set) -> None:
    """Every path from a masked ReLU6 output must reach a conv / depthwise / linear layer through
    ops that commute with a positive per-channel scale; the rescale folds into its inputs."""
    heads = {b.node: b for b in plan.blocks}
    for b in plan.blocks:
        if not b.forward_fold:
            continue
        todo, seen = list(b.last.users), set()
        while todo:
            n = todo.pop()
            if n in heads and heads[n].kind == "grouped":
                raise fail(n, f"the keep-probability rescale of the masked {b.activation} layer "
                              f"{b.node.name!r} would fold into this grouped conv's inputs, "
                              "which is not implemented; use ReLU before a grouped conv")
            if n in seen or n in heads:
                continue  # a layer: the scale folds into its input weights
            seen.add(n)
            what = None
            if n.op == "output":
                what = "the model's output"
            elif n.target in _ADD:
                what = "an add (the summed branches would need the same scale folded backwards)"
            elif n in relu6_nodes:
                what = "a non-homogeneous activation (f(s z) != s f(z))"
            elif n.target in MUL and all(a in seen for a in n.args[:2]
                                         if isinstance(a, fx.Node)):
                what = "a product of two scaled values (the scale would be squared)"
            if what is not None:
                raise fail(n, f"the keep-probability rescale of the masked ReLU6 layer "
                              f"{b.node.name!r} cannot pass {what}; use ReLU there, or "
                              f"residual='inner'")
            todo.extend(n.users)
