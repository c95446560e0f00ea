"""The special rules of :func:`trainer.nest`'s analysis (trainer/nest_graph.py): pre-activation
batch norms, squeeze-excitation gates, shortcut pads, reshapes refused with the reason, the
exporter's pooling / resize rules, and the forward-fold path check (the rules themselves are
stated in :mod:`trainer.nesting`)."""
from __future__ import annotations

from torch import fx, nn

from trainer.nest_ops import GATES, MUL, activation_of
from trainer.nest_plan import (_ADD, _RESHAPES, Block, Plan, _arg, _only_user, fail)


def _norm_block(node: fx.Node, m: nn.BatchNorm2d, modules: dict, env: dict,
                plan: Plan) -> Block:
    """A pre-activation batch norm (DenseNet's norm -> relu -> conv over a concatenation): a
    1x1 depthwise block initialised to the identity, with this BN and the activation after it
    (:class:`trainer.nest_model.NestNorm`). It has no unit of its own: its channels follow its
    input's segments (each branch of the concatenation keeps its prefix, so the norm keeps an
    index set), and its output carries the same segments to the layers reading it; it masks
    its output again with the segments' masks (bn(0) != 0). A norm of the network input keeps
    that input full width."""
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
    b.out_space = plan.new_space()
    plan.fixed[b.out_space] = "pre-activation batch norm (identity 1x1 depthwise, no unit)"
    plan.blocks.append(b)
    if any(ch is None for _, ch, _ in b.inputs):  # the network input: channels unknown
        for s, _, _ in b.inputs:
            plan.fixed.setdefault(s, "read by a pre-activation batch norm")
        env[b.last] = [(b.out_space, b.out_channels, b)]
    else:
        env[b.last] = [(s, ch, b) for s, ch, _ in b.inputs]
    return b


def _refuse_reshape(node: fx.Node, modules: dict) -> None:
    """Shape reads and channel rearrangements, with the reason."""
    if node.op in ("call_function", "call_method"):
        fn = node.target
        name = fn if isinstance(fn, str) else getattr(fn, "__name__", "")
        if name == "getattr" and node.args[1:2] == ("shape",):
            name = "shape"  # x.shape, traced as getattr(x, "shape")
        if name in _RESHAPES | {"shape"}:
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


def _check_forward_folds(plan: Plan, modules: dict, relu6_nodes: set) -> None:
    """Every path from a masked non-homogeneous output (ReLU6, Hardswish, SiLU) must reach a
    conv / depthwise / linear layer through ops that commute with a positive per-channel
    scale; the rescale folds into its inputs. An add of a nested stream (``residual="stage"``:
    MobileNetV3's Hardswish stem summed in its first block) is passed by folding every summand
    forwards: ``s h + s p = s (h + p)``, so each masked layer of that stream leaves its scale to
    the layers reading the sum (:class:`Sum`), and the path goes on from the add."""
    heads = {b.node: b for b in plan.blocks}
    queue = [b for b in plan.blocks if b.forward_fold]
    while queue:
        b = queue.pop()
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
                r = plan.root(b.out_space)
                if r not in plan.nested:
                    what = "an add (the summed branches would need the same scale folded backwards)"
                else:
                    for x in plan.blocks:  # the other summands of this stream fold forwards too
                        if plan.root(x.out_space) == r and x.apply_mask and not x.forward_fold \
                                and x.kind != "norm" and not x.gate:
                            x.forward_fold = True
                            queue.append(x)
            elif n in relu6_nodes:
                what = "a non-homogeneous activation (f(s z) != s f(z))"
            elif n.target in MUL and all(a in seen for a in n.args[:2]
                                         if isinstance(a, fx.Node)):
                what = "a product of two scaled values (the scale would be squared)"
            if what is not None:
                raise fail(n, f"the keep-probability rescale of the masked {b.activation} layer "
                              f"{b.node.name!r} cannot pass {what}; use ReLU there, or "
                              f"residual='inner'")
            todo.extend(n.users)


class Sum:
    """The producer of an add's output, as a segment records it (trainer.nest_graph): its
    keep-probability scale is folded forwards into its readers when its summands' are."""

    activation = None
    last = None

    def __init__(self, operands: list) -> None:
        self.operands = operands

    @property
    def forward_fold(self) -> bool:
        return any(o is not None and o.forward_fold for o in self.operands)
