"""The layers and the model that :func:`trainer.nest` (trainer/nesting.py) builds (BN³ §3.2-3.4, App. 8.1-8.2).

:class:`NestConv2d` and :class:`NestLinear` are the Bayesian nested blocks of
:mod:`trainer.layers` plus two facts about their *input* that a hand-written model never needs:

- ``in_segments``: the input's channels as segments ``(unit or None, channels, fold)``, one per
  branch of a ``torch.cat`` (one segment otherwise). A concatenation of two nested branches is
  not a prefix-ordered tensor: at width w the kept input channels are the first kept channels
  of *each* segment, at its own offset;
- ``fold`` on a segment: the producer's keep-probability rescale (BN³ App. 8.2) could not fold
  into the producer (its output went through ReLU6: ``relu6(z) * s != relu6(s z)``), so
  truncation folds it *forward* into this layer's input weights: ``W[:, c] * s_c`` computes
  ``W (s * x)`` exactly because the layer is linear in its input (pooling and ReLU between the
  two commute with a positive per-channel scale; :mod:`trainer.nesting` checks the path).

:class:`NestedGraphModel` runs the rewritten ``torch.fx`` graph and truncates with both facts.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import fx, nn

from trainer.layers import (_ACTIVATIONS, BayesNestedConv2d, BayesNestedLayer, BayesNestedLinear,
                            _inverse_softplus)
from trainer.models.base import LayerCut, NestedModel
Segment = tuple  # (DownhillOrdering | None, channels: int, fold: bool)


class _Segmented:
    """Mixin: input channels described by segments (see the module docstring)."""

    def set_input(self, segments: list[Segment], spatial: int = 1) -> None:
        # plain attributes, not submodules: the units are registered by their own layers
        object.__setattr__(self, "in_segments", list(segments))
        units = {id(u): u for u, _, _ in segments if u is not None}
        # one prefix-ordered input: the base class's slicing (input_ordering) is exact
        single = len(segments) == 1 and len(units) == 1
        self.follows(next(iter(units.values())) if single else None, spatial)

    def kept_input_index(self, width_of) -> torch.Tensor | None:
        """Indices of the input channels kept when each segment's unit keeps ``width_of(unit)``
        groups (None: all of them)."""
        segs = getattr(self, "in_segments", None) or []
        parts, off, cut = [], 0, False
        for unit, ch, _ in segs:
            k = ch if unit is None or width_of(unit) is None else \
                width_of(unit) * (ch // unit.groups)
            cut |= k < ch
            parts.append(torch.arange(off, off + k))
            off += ch
        return torch.cat(parts) if cut else None

    def _active_weight(self, w: torch.Tensor, x: torch.Tensor, out_keep):
        segs = getattr(self, "in_segments", None) or []
        if len(segs) < 2 or getattr(self, "depthwise", False):
            return super()._active_weight(w, x, out_keep)
        if out_keep is not None:
            w = w[:out_keep]
        # a fixed narrow width: each nested branch of the concatenation computed only its kept
        # prefix (BayesNestedLayer.kept_outputs), so read the matching columns of each segment
        idx = self.kept_input_index(lambda u: u.fixed_groups)
        if idx is not None and w.shape[1] > x.shape[1]:
            w = w[:, _expand(idx, self.input_spatial).to(w.device)]
        return w


def _expand(idx: torch.Tensor, spatial: int) -> torch.Tensor:
    """Channel indices -> flattened (C, H, W) column indices."""
    if spatial == 1:
        return idx
    return (idx[:, None] * spatial + torch.arange(spatial)).flatten()


class NestConv2d(_Segmented, BayesNestedConv2d):
    def _op(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """A grouped conv cut inside a conv group (trainer.nesting.partial_groups): the whole
        groups as one grouped conv, the partial last one (its first ``r`` outputs reading its
        first ``r`` inputs) as a plain conv."""
        gs = getattr(self, "group_size", 0)
        if not getattr(self, "grouped", False) or (weight.shape[0] % gs == 0 and
                                                   weight.shape[1] == gs):
            return super()._op(x, weight)
        whole = weight.shape[0] // gs
        r = weight.shape[0] - whole * gs
        parts = []
        if whole:
            parts.append(F.conv2d(x[:, :whole * gs], weight[:whole * gs, :gs], None,
                                  self.stride, self.padding, 1, whole))
        parts.append(F.conv2d(x[:, whole * gs:whole * gs + r], weight[whole * gs:, :r], None,
                              self.stride, self.padding))
        return torch.cat(parts, 1)


class NestNorm(NestConv2d):
    """A pre-activation batch norm (DenseNet's norm -> relu before each conv over the growing
    concatenation) as a 1x1 depthwise block of weight 1, whose channels follow its input's
    segments: at a width it keeps each segment's kept prefix (an index set over the
    concatenation, not a prefix), and it masks its own output with the segments' masks again,
    since bn(0) is not 0: a dropped channel then reads as zero downstream, as the truncated
    network (which has no such channel) computes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        segs = getattr(self, "in_segments", None) or []
        if not any(u is not None for u, _, _ in segs):
            return super().forward(x)
        idx = None
        if x.shape[1] < self.out_channels:  # a fixed narrow width: each segment's kept prefix
            idx = self.kept_input_index(lambda u: u.fixed_groups).to(x.device)
        mode = self.mode or ("sample" if self.training else "mean")
        mu = self.weight_mu if idx is None else self.weight_mu[idx]
        if mode == "mean":
            y = x * mu.view(1, -1, 1, 1)
        else:
            sigma = self.weight_sigma if idx is None else self.weight_sigma[idx]
            if mode == "sample":
                var = (x * x) * (sigma ** 2).view(1, -1, 1, 1)
                y = x * mu.view(1, -1, 1, 1) + torch.sqrt(var + 1e-12) * torch.randn_like(x)
            else:
                y = x * (mu + sigma * torch.randn_like(mu)).view(1, -1, 1, 1)
        y = self.bn(y) if idx is None else self._norm_at(y, idx)
        act = _ACTIVATIONS[self.activation]
        if act is not None:
            y = act(y)
        if idx is None:  # sampled masks: zero what the producers dropped
            y = y * self._segment_mask(y.shape[0]).to(y).view(-1, self.out_channels, 1, 1)
        return y

    def _segment_mask(self, batch: int) -> torch.Tensor:
        parts = []
        rows = 1
        for unit, ch, _ in self.in_segments:
            if unit is None:
                parts.append(torch.ones(1, ch))
                continue
            m = (unit.forward_mask(batch) > 0).float()  # [1 or batch, G]
            rows = max(rows, m.shape[0])
            parts.append(m.repeat_interleave(ch // unit.groups, -1))
        return torch.cat([p.expand(rows, -1) for p in parts], 1)

    def _norm_at(self, y: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """``self.bn`` on the channels ``idx`` (running statistics updated there)."""
        bn = self.bn
        factor = 0.0
        if bn.training and bn.track_running_stats:
            bn.num_batches_tracked.add_(1)
            factor = (1.0 / float(bn.num_batches_tracked) if bn.momentum is None
                      else bn.momentum)
        mean, var = bn.running_mean[idx].clone(), bn.running_var[idx].clone()
        out = F.batch_norm(y, mean, var, bn.weight[idx], bn.bias[idx], bn.training, factor,
                           bn.eps)
        if bn.training and bn.track_running_stats:
            # through .data: the full-width pass of this step saved these buffers for its
            # backward (as batch_norm's own in-place update, this is not a tracked change)
            bn.running_mean.data[idx] = mean
            bn.running_var.data[idx] = var
        return out

    @torch.no_grad()
    def keep_channels_(self, idx: torch.Tensor) -> None:
        """Truncation: keep the channels ``idx`` (the segments' kept prefixes)."""
        self.weight_mu = nn.Parameter(self.weight_mu.detach()[idx].clone())
        self.weight_rho = nn.Parameter(self.weight_rho.detach()[idx].clone())
        bn = self.bn
        new = type(bn)(len(idx), eps=bn.eps, momentum=bn.momentum, device=bn.weight.device,
                       dtype=bn.weight.dtype)
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(new, name).copy_(getattr(bn, name)[idx])
        new.num_batches_tracked.copy_(bn.num_batches_tracked)
        new.train(bn.training)
        self.bn = new
        self.out_channels = self.in_channels = len(idx)


class NestLinear(_Segmented, BayesNestedLinear):
    pass


class NestedGraphModel(NestedModel):
    """A user's network after :func:`trainer.nest` (trainer/nesting.py): the rewritten fx graph
    (``body``) and the per-layer summary (``nest_summary``)."""

    def __init__(self, body: fx.GraphModule, summary: list[dict], classifier: str | None):
        super().__init__()
        self.body = body
        self.nest_summary = summary
        if classifier is not None:  # the head scope's sampled layer (exporters.slice)
            self.classifier_name = f"body.{classifier}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def summary(self) -> str:
        rows = [f"{'layer':<28} {'kind':<9} {'out':>5} {'groups':>6}  ordering"]
        for r in self.nest_summary:
            rows.append(f"{r['layer']:<28} {r['kind']:<9} {r['out']:>5} "
                        f"{r['groups'] if r['groups'] else '-':>6}  {r['ordering']}")
        return "\n".join(rows)

    def truncation_plan(self, width: float) -> dict[str, LayerCut]:
        """As :meth:`NestedModel.truncation_plan`, with concatenated inputs cut per segment (one
        input range per segment) and a ReLU6 producer's keep probabilities folded forward into
        its consumers' input weights (``in_scale``)."""
        kept, keep_prob = self._width_state(width)
        plan = {}
        for name, layer in self.named_modules():
            if not isinstance(layer, BayesNestedLayer):
                continue
            out_keep = scale = None
            unit = layer.ordering
            if unit is not None:
                size = layer.out_channels // unit.groups
                out_keep = kept[id(unit)] * size
                if layer.apply_mask and not getattr(layer, "forward_fold", False):
                    scale = keep_prob[id(unit)][: kept[id(unit)]].repeat_interleave(size)
            ranges, in_scale = _input_plan(layer, kept, keep_prob)
            if (getattr(layer, "depthwise", False) or getattr(layer, "grouped", False)) and \
                    not isinstance(layer, NestNorm):
                ranges = None  # its input channels follow its outputs (cut with them)
            plan[name] = LayerCut(out_keep, ranges, scale, in_scale)
        return plan

    def truncate(self, width: float) -> "NestedGraphModel":
        """As :meth:`NestedModel.truncate`, applying :meth:`truncation_plan`."""
        new = copy.deepcopy(self)
        new._apply_plan(new.truncation_plan(width))
        new.truncated_width = width
        return new

    def _apply_plan(self, plan: dict[str, LayerCut]) -> None:
        for name, layer in self.named_modules():
            if not isinstance(layer, BayesNestedLayer):
                continue
            cut = plan[name]
            depthwise = getattr(layer, "depthwise", False)
            if isinstance(layer, NestNorm) and cut.in_ranges is not None:
                # its channels are its input's: each segment's kept prefix
                layer.keep_channels_(torch.cat([torch.arange(a, b) for a, b in cut.in_ranges]))
            if not depthwise:
                idx = None if cut.in_ranges is None else torch.cat(
                    [torch.arange(a, b) for a, b in cut.in_ranges])
                _cut_inputs(layer, idx, cut.in_scale)
            layer.truncate_(cut.out_keep, None, cut.out_scale)
            if depthwise and cut.in_scale is not None:
                # a depthwise kernel's input channel is its output channel: scale its rows
                # (after the cut: it follows its input's unit, so both keep the same channels)
                _scale_rows(layer, cut.in_scale)
            object.__setattr__(layer, "in_segments", None)


def _input_plan(layer: BayesNestedLayer, kept: dict, keep_prob: dict):
    """(kept input channel ranges or None (all), forward-folded scale per kept input channel
    or None)."""
    segs = getattr(layer, "in_segments", None)
    if not segs:
        return None, None
    ranges, scales, fold, off, cut = [], [], False, 0, False
    for unit, ch, f in segs:
        k = ch if unit is None else kept[id(unit)] * (ch // unit.groups)
        cut |= k < ch
        if k:
            ranges.append((off, off + k))
        off += ch
        if f and unit is not None:
            fold = True
            size = ch // unit.groups
            scales.append(keep_prob[id(unit)][: kept[id(unit)]].repeat_interleave(size))
        else:
            scales.append(torch.ones(k))
    return (ranges if cut else None), (torch.cat(scales) if fold else None)


@torch.no_grad()
def _cut_inputs(layer: BayesNestedLayer, idx, in_scale) -> None:
    spatial = layer.input_spatial
    cols = None if idx is None else _expand(idx, spatial)
    for name in ("weight_mu", "weight_rho"):
        w = getattr(layer, name).detach()
        if cols is not None:
            w = w[:, cols.to(w.device)]
        if in_scale is not None:
            s = in_scale.to(w).repeat_interleave(spatial).view(1, -1, *([1] * (w.ndim - 2)))
            # sigma scales with the mean (s * W has the posterior of W scaled by s)
            w = w * s if name == "weight_mu" else _inverse_softplus(F.softplus(w) * s)
        setattr(layer, name, nn.Parameter(w.clone()))
    if cols is not None:
        if isinstance(layer, BayesNestedLinear):
            layer.in_features = len(cols)
        else:
            layer.in_channels = len(idx)


@torch.no_grad()
def _scale_rows(layer: BayesNestedLayer, s: torch.Tensor) -> None:
    view = (-1,) + (1,) * (layer.weight_mu.ndim - 1)
    layer.weight_mu = nn.Parameter(layer.weight_mu.detach() * s.to(layer.weight_mu).view(view))
    layer.weight_rho = nn.Parameter(_inverse_softplus(
        F.softplus(layer.weight_rho.detach()) * s.to(layer.weight_rho).view(view)))


__all__ = ["NestConv2d", "NestLinear", "NestNorm", "NestedGraphModel"]
