"""``nest()``: a user's plain PyTorch CNN -> a Bayesian nested network ("Bring your own
network"; BN³ §2.2-2.3 ordering units, §3.2-3.4 Bayesian layers, App. 8.1-8.2 blocks and the
keep-probability rescale, App. 9.1 which layers are nested in VGG / ResNeXt / MobileNetV2).

The module is traced with :mod:`torch.fx`; every ``Conv2d`` (plain or depthwise) or ``Linear``,
with the ``BatchNorm2d`` and ReLU / ReLU6 that directly follow it, becomes one Bayesian block
(:class:`trainer.nest_model.NestConv2d` / ``NestLinear``: conv -> BN -> activation -> ordering
mask) whose posterior means are the user's weights (BN affine and running statistics too; a
conv bias before a BN moves into the BN's running mean). The rules:

- **depthwise** convs follow their input's ordering unit (no unit of their own); a conv whose
  only consumer is such a depthwise conv is masked once, after the depthwise block (channel c
  of the one only feeds channel c of the other, App. 9.1 "nested dropout on the depth-wise").
- **residual** adds: the values an add joins must keep aligned channels. ``residual="inner"``
  (default; BN³ App. 9.1 for ResNeXt and MobileNetV2): every layer whose output is summed stays
  full width, only the channels inside blocks are nested. ``residual="stage"``: every layer
  whose output is summed shares one unit, so the stream narrows and truncation cuts all of them
  identically (if the stream also carries the un-nested stem or the input, it stays full width).
- a shortcut that cannot stay aligned under prefix truncation (ResNet-20's "option A":
  ``F.pad`` of new channels on both sides of the identity) is a ConfigError; use a 1x1
  projection, or pad at the end (``x[:, :, ::2, ::2]`` then ``F.pad(x, (0, 0, 0, 0, 0, n))``):
  aligned as long as the padded value and its input stay full width, which they do (a
  stream they join is not nested, in either mode).
- **groups** is a maximum: each group holds a multiple of 4 channels (TFLite/XNNPACK), so a
  layer with C channels gets the largest g <= groups with C % (4 g) == 0 (C < 4 * groups: C // 4).
- the **rescale** (BN³ App. 8.2) folds backwards into BN through ReLU or no activation, as in
  the built-in models. Through ReLU6 it cannot (``relu6(s z) != s relu6(z)``): it is folded
  forwards into the input weights of the conv / depthwise / linear layers the output feeds, via
  ReLU, max / average / global pooling, flatten, dropout and concatenation (all commute with a
  positive per-channel scale). A path to an add, a ReLU6 or the output is a ConfigError.
- **concatenations** keep each branch's unit and channel offset (``in_segments``).
- the **classifier** (the layer producing the output) is Bayesian but not nested; the **stem**
  (the layer reading the input) is nested only with ``nest_stem=True``.
- any other op, or a rule that cannot be met, is a ConfigError naming the fx node.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import fx, nn

from edge_sdk.errors import ConfigError
from trainer.nest_graph import Block, Plan, analyse, fail
from trainer.nest_model import NestConv2d, NestedGraphModel, NestLinear, NestNorm
from trainer.nest_ops import HOMOGENEOUS, is_stochastic_depth
from trainer.ordering import DownhillOrdering

__all__ = ["nest", "partial_groups", "pick_groups"]


def pick_groups(channels: int, groups: int, where: str = "layer", divides=()) -> int:
    """The largest g <= ``groups`` with ``channels % (4 g) == 0`` (each group a multiple of 4)
    that divides every grouped conv's group count in ``divides`` (a width then keeps whole
    conv groups: ResNeXt's 32, RegNet's channels / 16 or / 8). When ``groups`` is a multiple
    of 4 and that g is not, or g is under 4, a finer count (see below) so that widths 1/4 and
    1/2 cut as close to what they ask as the channels allow (goal 3)."""
    if channels % 4:
        raise ConfigError(f"{where}: {channels} output channels cannot be nested: each ordering "
                          "group must hold a multiple of 4 channels")
    g = min(groups, channels // 4)
    while channels % (4 * g) or any(d % g for d in divides):
        g -= 1
    if (groups % 4 == 0 and g % 4) or g < min(groups, 4):
        # the cap is a multiple of 4 (widths 1/4 and 1/2 on group boundaries) but no group
        # count under it is, with groups of 4k channels whole conv groups (144 channels: 6
        # groups of 24; RegNet's 10, 13, 25, 26 or 55 conv groups), or too few groups to nest
        # at all (104 channels: 2 groups of 52): take the group count that overshoots widths
        # 1/4 and 1/2 least, finer than the cap (down to 4 channels a group) rather than
        # coarse or none (144: 12 groups, 3/12 at width 0.25 where 6 groups keep 2/6; 25 conv
        # groups: 7/25 = 0.28 where 5 keep 2/5; 104 channels: 26 groups, 7/26)
        common = int(np.gcd.reduce(np.asarray(divides))) if divides else channels // 4
        more = [d for d in range(max(g, 1), common + 1)
                if common % d == 0 and channels % (4 * d) == 0]
        g = min(more, key=lambda d: (_overshoot(d), d)) if more else g
    if divides and g < min(groups, 4):
        # whole conv groups are too coarse to nest (RegNet-X's first stage: 32 channels in 2
        # conv groups of 16): the unit's own groups instead, the last kept conv group partial
        # (exact: the conv's input is masked with the same unit, see partial_groups)
        g = max(g, pick_groups(channels, groups, where))
    return g


def partial_groups(unit_groups: int, divides) -> bool:
    """Whether a unit of ``unit_groups`` cuts inside conv groups (one of ``divides`` is not a
    multiple of it): then a width's last conv group is partial, and the grouped conv's input
    must be masked too, so that the cut-off channels of that group read as zeros in training,
    as the truncated conv (which drops them) computes."""
    return any(d % unit_groups for d in divides)


def _overshoot(g: int) -> float:
    """Channels kept beyond widths 1/4 and 1/2 with ``g`` ordering groups (each width rounds
    up to a group boundary)."""
    return sum(math.ceil(w * g - 1e-9) / g - w for w in (0.25, 0.5))


def nest(module: nn.Module, groups: int = 8, frozen: int = 1, residual: str = "inner",
         nest_stem: bool = False, prior_pi: float = 0.9, init_mubar: float = 3.0,
         log_alpha_init: float = -4.0, verbose: bool = False) -> NestedGraphModel:
    """Convert ``module`` (a plain ``nn.Module``) into a :class:`NestedGraphModel` (see the module
    docstring for the rules). ``groups`` / ``frozen`` are each unit's maximum groups and its
    always-kept groups; ``prior_pi`` / ``init_mubar`` as in :class:`DownhillOrdering`;
    ``log_alpha_init`` sets the initial posterior spread around the user's weights.
    ``verbose`` prints the per-layer summary (``model.summary()``)."""
    if residual not in ("inner", "stage"):
        raise ConfigError(f"residual must be 'inner' or 'stage', got {residual!r}")
    if not isinstance(groups, int) or groups < 1:
        raise ConfigError(f"groups must be an integer >= 1, got {groups!r}")
    # traced in eval mode: the inference graph is what exports (torchvision's GoogLeNet returns
    # its auxiliary logits only in training; stochastic depth freezes the mode it was traced in)
    was = module.training
    module.eval()
    try:
        gm = fx.symbolic_trace(module)
    except Exception as e:  # data-dependent control flow, unsupported Python constructs
        raise ConfigError(f"torch.fx cannot trace {type(module).__name__}: {e}") from None
    finally:
        module.train(was)
    plan = analyse(gm, residual, nest_stem)
    _drop_coarse_units(plan, groups, frozen)
    _mask_before_partial_groups(plan, groups)
    units: dict[int, DownhillOrdering] = {}
    summary = []
    new_modules: dict[str, nn.Module] = {}
    for b in plan.blocks:
        unit = None
        root = plan.unit_of(b)
        if root is not None:
            if root not in units:
                g = pick_groups(b.out_channels, groups, f"fx node {b.node.name!r}",
                                plan.divides_of(root))
                units[root] = DownhillOrdering(g, min(frozen, g), prior_pi, init_mubar)
            unit = units[root]
        layer = _build(b, unit, plan, units, log_alpha_init)
        new_modules[b.node.target] = layer
        summary.append({"layer": b.node.target, "kind": b.kind, "out": b.out_channels,
                        "groups": unit.groups if unit else 0,
                        "ordering": plan.describe(b, units)})
    body = _rewrite(gm, plan, new_modules)
    head = plan.classifier
    model = NestedGraphModel(body, summary, None if head is None else head.node.target)
    # a fresh network has never been trained with sampled masks: its keep probabilities are
    # the prior's, and scaling kept channels by them would make width 1.0 differ from the
    # network nested. Training sets the rescale from its regime (trainer.train),
    # a checkpoint from its config (trainer.checkpoint).
    model.set_rescale(False)
    if verbose:
        print(model.summary())
    return model


def _build(b: Block, unit, plan: Plan, units: dict, log_alpha_init: float) -> nn.Module:
    m = b.module
    if b.kind == "norm":
        return _build_norm(b, plan, units, log_alpha_init)
    in_ch = m.in_features if isinstance(m, nn.Linear) else m.in_channels
    # the network input's channel count is known only from the layer reading it
    segments = [(units.get(plan.root(s)), in_ch if ch is None else ch, plan.folds(src))
                for s, ch, src in b.inputs]
    if isinstance(m, nn.Linear):
        layer = NestLinear(m.in_features, m.out_features, ordering=unit,
                           apply_mask=b.apply_mask, batch_norm=False, activation=None,
                           log_alpha_init=log_alpha_init)
        spatial = _spatial(b, segments)
    else:
        # square windows stay ints (what the built-in models and their exports always had)
        sq = [v[0] if len(set(v)) == 1 else tuple(v) for v in (m.kernel_size, m.stride,
                                                                m.padding)]
        layer = NestConv2d(m.in_channels, m.out_channels, *sq,
                           depthwise=b.kind == "depthwise",
                           groups=m.groups if b.kind == "grouped" else 1, ordering=unit,
                           apply_mask=b.apply_mask, batch_norm=b.bn is not None,
                           activation=None, log_alpha_init=log_alpha_init)
        spatial = 1
    # set after construction: the base class refuses a masked relu6 block because its rescale
    # cannot fold backwards; nest() checked that every consumer folds it forwards
    layer.activation = b.activation
    layer.forward_fold = b.forward_fold and layer.apply_mask
    layer.set_input(segments, spatial)
    with torch.no_grad():
        layer.weight_mu.copy_(m.weight)
        bias = m.bias.detach() if m.bias is not None else None
        if b.bn is not None:
            _copy_bn(layer, b, bias)
        elif bias is not None:
            layer.bias.copy_(bias)
        layer.reset_sigma(log_alpha_init)  # sigma = |mu| sqrt(alpha) around the user's weights
    return layer


def _build_norm(b: Block, plan: Plan, units: dict, log_alpha_init: float) -> nn.Module:
    """A pre-activation batch norm as a 1x1 depthwise block of weight 1 (trainer.nest_graph's
    ``_norm_block``): the BN folds into it at export, like any conv's."""
    c = b.out_channels
    segments = [(units.get(plan.root(s)), c if ch is None else ch, plan.folds(src))
                for s, ch, src in b.inputs]
    layer = NestNorm(c, c, 1, 1, 0, depthwise=True, ordering=None, apply_mask=False,
                     batch_norm=True, activation=None, log_alpha_init=log_alpha_init)
    layer.activation = b.activation
    layer.forward_fold = False
    layer.set_input(segments, 1)
    _copy_bn(layer, b, None)
    with torch.no_grad():
        layer.weight_mu.fill_(1.0)
        layer.reset_sigma(log_alpha_init)
    return layer


def _copy_bn(layer, b: Block, bias) -> None:
    """The user's BN (affine and running statistics) into the block's; a conv bias before it
    moves into its running mean: bn(z + b) = bn'(z) with running_mean' = running_mean - b
    (the batch mean cancels b in training)."""
    bn = b.bn
    if bn.running_mean is None:
        raise fail(b.bn_node, "a BatchNorm2d without running statistics "
                              "(track_running_stats=False) cannot fold at export")
    with torch.no_grad():
        layer.bn.eps, layer.bn.momentum = bn.eps, bn.momentum
        if bn.affine:
            layer.bn.weight.copy_(bn.weight); layer.bn.bias.copy_(bn.bias)
        layer.bn.running_mean.copy_(bn.running_mean - (0 if bias is None else bias))
        layer.bn.running_var.copy_(bn.running_var)
        layer.bn.num_batches_tracked.copy_(bn.num_batches_tracked)


def _drop_coarse_units(plan: Plan, groups: int, frozen: int) -> None:
    """A space whose channels split into fewer than min(groups, 4) groups of 4 (8 channels: 2)
    would raise the whole model's smallest width to frozen / g (0.5): it stays full width
    instead, so every width down to frozen / groups stays reachable in training and export
    alike."""
    for r in sorted(plan.nested):
        b = next(x for x in plan.blocks if plan.root(x.out_space) == r)
        g = pick_groups(b.out_channels, groups, f"fx node {b.node.name!r}",
                        plan.divides_of(r))
        if g < min(groups, 4) and min(frozen, g) / g > min(frozen, groups) / groups:
            plan.nested.discard(r)
            whole = f" whole conv groups of {plan.divides_of(r)}" if plan.divides_of(r) else ""
            plan.fixed[r] = (f"{b.out_channels} channels make only {g} group(s) of 4{whole}: "
                             f"nesting would raise the smallest width to {min(frozen, g) / g:.3g}")
            for x in plan.blocks:
                if plan.root(x.out_space) == r:
                    x.forward_fold = False
                    x.apply_mask = True


def _mask_before_partial_groups(plan: Plan, groups: int) -> None:
    """A grouped conv whose unit cuts inside its conv groups (``partial_groups``): the layer
    feeding it masks its output too (not only after the grouped conv), so a partial conv
    group reads zeros where the truncated conv has no inputs."""
    for b in plan.blocks:
        r = plan.unit_of(b)
        if b.kind != "grouped" or r is None:
            continue
        g = pick_groups(b.out_channels, groups, f"fx node {b.node.name!r}", plan.divides_of(r))
        if not partial_groups(g, plan.divides_of(r)):
            continue
        for x in plan.blocks:
            if x.kind in ("conv", "linear") and not x.apply_mask and not x.gate and \
                    plan.unit_of(x) == r:
                if x.activation is not None and not HOMOGENEOUS[x.activation]:
                    raise fail(b.node, f"cuts inside its {b.module.groups} conv groups, so "
                                       f"its input {x.node.name!r} must be masked too, and "
                                       f"that layer's {x.activation} rescale cannot fold into "
                                       "a grouped conv; use ReLU before a grouped conv")
                x.apply_mask = True


def _spatial(b: Block, segments: list) -> int:
    """H*W of a flattened input: a linear layer's in_features per input channel."""
    ch = sum(c for _, c, _ in segments)
    if b.module.in_features % ch:
        raise fail(b.node, f"{b.module.in_features} input features are not a multiple of the "
                           f"{ch} channels flattened into it")
    return b.module.in_features // ch


def _rewrite(gm: fx.GraphModule, plan: Plan, new_modules: dict[str, nn.Module]) -> fx.GraphModule:
    """A graph where each block is one call_module node (its BN and activation nodes gone)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    absorbed = {n: b for b in plan.blocks for n in b.absorbed}
    heads = {b.node: b for b in plan.blocks}
    modules = dict(gm.named_modules())
    root: dict[str, nn.Module] = {}
    for node in gm.graph.nodes:
        if node in heads:
            b = heads[node]
            new = graph.call_module(node.target, (env[node.args[0]],))
            new.name = node.name
            env[b.last] = new
            root[node.target] = new_modules[node.target]
        elif node in absorbed:
            continue
        elif is_stochastic_depth(node):
            # its training flag was frozen at trace time: an identity here (what it computes at
            # inference), so the nested network's eval pass equals the source's
            env[node] = env[node.args[0]]
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
            if node.op == "call_module":
                root[node.target] = modules[node.target]
    graph.lint()
    return fx.GraphModule(root, graph, class_name="NestedBody")

