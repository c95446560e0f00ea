"""The data of :func:`trainer.nest`'s analysis (trainer/nest_graph.py): blocks, channel spaces,
the op tables both share, and the error that names an fx node and the user's module path."""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch import fx, nn

from edge_sdk.errors import ConfigError
from trainer.nest_ops import activation_of

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
        if b.kind == "norm" and any(self.root(s) in self.nested for s, _, _ in b.inputs):
            return ("no unit: follows its input's segments (each branch's kept prefix), its "
                    "output masked again")
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
            _grouped_how(b, units[r].groups, self.divides_of(r)) if b.kind == "grouped" else
            f"shared by {len(users)} summed layers" if r in self.added else
            f"shared by {len(users)} layers" if len(users) > 1 else "own unit")
        extra = ", squeeze-excitation gate (unmasked)" if b.gate else \
            ", masked after its depthwise" if not b.apply_mask else (
            ", rescale folded forward" if b.forward_fold else "")
        return f"unit u{sorted(units).index(r)}: {how}{extra}"


def _grouped_how(b: Block, unit_groups: int, divides: list) -> str:
    if not any(d % unit_groups for d in divides):
        return "follows its input's unit by whole groups"
    return (f"follows its input's unit, {unit_groups} groups inside its {b.module.groups} conv "
            "groups (a width's last conv group partial; its input masked too)")


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


def _arg(node: fx.Node, env: dict, i: int = 0) -> list:
    a = node.args[i] if i < len(node.args) else None
    if isinstance(a, fx.Node) and a.op == "get_attr":
        raise fail(a, "reads a parameter or buffer in forward (not a layer)")
    if not isinstance(a, fx.Node) or a not in env:
        raise fail(node, f"argument {i} must be a tensor computed by the graph")
    return env[a]
