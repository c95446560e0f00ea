"""What every nested architecture shares: its layers, ordering units, width context, KL terms and
truncation to a fixed width."""
from __future__ import annotations

import copy
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from edge_sdk.errors import ConfigError
from trainer.layers import BayesNestedLayer, WeightKL
from trainer.ordering import DownhillOrdering


def round_channels(channels: float, groups: int) -> int:
    """Round up to a multiple of 4 * groups, so every group's channel count is a multiple of 4."""
    step = 4 * groups
    return max(step, int(-(-channels // step)) * step)


class NestedModel(nn.Module):
    """Base of registered models. Subclasses build their layers and implement ``forward``.

    ``arch`` (registry name + keyword arguments) is set by :func:`trainer.models.create_model`
    and is what a checkpoint stores to rebuild the model without pickled code.
    """

    arch: dict

    def bayes_layers(self) -> list[BayesNestedLayer]:
        return [m for m in self.modules() if isinstance(m, BayesNestedLayer)]

    def nested_layers(self) -> list[BayesNestedLayer]:
        """Layers whose output channels are ordered (and masked or truncated with a width)."""
        return [m for m in self.bayes_layers() if m.ordering is not None]

    def orderings(self) -> list[DownhillOrdering]:
        """The distinct ordering units (a unit may be shared by two layers)."""
        seen: dict[int, DownhillOrdering] = {}
        for m in self.modules():
            if isinstance(m, DownhillOrdering):
                seen.setdefault(id(m), m)
        return list(seen.values())

    def min_width(self) -> float:
        units = self.orderings()
        return max((u.frozen / u.groups for u in units), default=1.0)

    # ---- state switches -------------------------------------------------------------------
    @contextmanager
    def width(self, width: float | None, scaled: bool = True) -> Iterator["NestedModel"]:
        """Run at a fixed width: the first groups of every nested layer, rescaled by their keep
        probability (BN³ App. 8.2). ``None`` restores sampling in training / full width in eval.
        ``scaled=False`` keeps the plain 0/1 mask, as a training sample has (the sandwich rule's
        fixed-width passes train exactly what a sampled mask of that width would run)."""
        if width is not None:
            self.check_width(width)
        with ExitStack() as stack:
            for unit in self.orderings():
                stack.enter_context(unit.fixed(width, scaled))
            yield self

    def set_rescale(self, rescale: bool) -> None:
        """Whether fixed widths rescale kept channels by their keep probability, every unit
        (``ordering.rescale``; :func:`trainer.ordering.rescale_of`)."""
        for unit in self.orderings():
            unit.rescale = bool(rescale)

    def set_mask_scope(self, scope: str) -> None:
        """One training mask per ``"batch"`` (forward pass) or per ``"example"``, every unit."""
        for unit in self.orderings():
            unit.scope = scope

    def check_width(self, width: float) -> None:
        """Raise ConfigError if ``width`` is outside (0, 1] or below a unit's frozen groups,
        naming the layers of that unit (training and export both call this: one rule, one
        message)."""
        for unit in self.orderings():
            try:
                unit.groups_for_width(width)
            except ConfigError as e:
                names = [n for n, m in self.named_modules()
                         if isinstance(m, BayesNestedLayer) and m.ordering is unit]
                if not names:
                    raise
                more = f" (and {len(names) - 1} more sharing its unit)" if len(names) > 1 else ""
                raise ConfigError(f"layer {names[0]!r}{more}: {e}; the model's smallest width "
                                  f"is {self.min_width():.4g}") from None

    @contextmanager
    def weight_mode(self, mode: str | None) -> Iterator["NestedModel"]:
        """``mean`` | ``sample`` | ``sample_weights`` | ``None`` (auto) for every Bayesian layer."""
        layers = self.bayes_layers()
        previous = [m.mode for m in layers]
        for m in layers:
            m.mode = mode
        try:
            yield self
        finally:
            for m, p in zip(layers, previous):
                m.mode = p

    def set_tau(self, tau: float, hard: bool | None = None) -> None:
        for unit in self.orderings():
            unit.tau = tau
            if hard is not None:
                unit.hard = hard

    def set_weight_kl(self, fn: WeightKL | None) -> None:
        """Replace every layer's weight KL (the PWFN hook: None switches it off)."""
        for m in self.bayes_layers():
            m.weight_kl_fn = fn

    # ---- regularisers --------------------------------------------------------------------
    def _zero(self) -> torch.Tensor:
        p = next(self.parameters(), None)
        return torch.zeros((), device=None if p is None else p.device)

    def ordering_kl(self) -> torch.Tensor:
        return sum((u.kl() for u in self.orderings()), self._zero())

    def ordered_l0(self) -> torch.Tensor:
        """sum_j j beta_j per unit (eq. 16), the deterministic special case of ordering_kl."""
        return sum((u.expected_tail() for u in self.orderings()), self._zero())

    def weight_kl(self) -> torch.Tensor:
        return sum((m.weight_kl() for m in self.bayes_layers()), self._zero())

    # ---- truncation ----------------------------------------------------------------------
    def _width_state(self, width: float) -> tuple[dict, dict]:
        """(kept groups per unit id, keep probabilities per unit id) at ``width``: what every
        truncation plan starts from."""
        self.check_width(width)
        units = self.orderings()
        return ({id(u): u.groups_for_width(width) for u in units},
                {id(u): u.rescale_probability().detach() for u in units})

    def truncation_plan(self, width: float) -> dict[str, "LayerCut"]:
        """Per Bayesian layer (module name), what the width-``width`` slice keeps of it: the one
        definition :meth:`truncate` applies and the weight store records
        (docs/store.md §2): a prefix of the output channels, a prefix of the input channels
        (the producer's kept groups), and the kept channels' keep probabilities."""
        kept, keep_prob = self._width_state(width)
        plan = {}
        for name, layer in self.named_modules():
            if not isinstance(layer, BayesNestedLayer):
                continue
            out_keep = scale = in_ranges = None
            unit = layer.ordering
            if unit is not None:
                size = layer.out_channels // unit.groups
                out_keep = kept[id(unit)] * size
                if layer.apply_mask:
                    scale = keep_prob[id(unit)][: kept[id(unit)]].repeat_interleave(size)
            src = layer.input_ordering
            if src is not None and not getattr(layer, "depthwise", False):
                in_channels = _input_channels(layer)
                in_ranges = [(0, kept[id(src)] * (in_channels // src.groups))]
            plan[name] = LayerCut(out_keep, in_ranges, scale)
        return plan

    def truncate(self, width: float) -> "NestedModel":
        """A copy with every nested layer cut to ``width`` (its next layer's inputs follow),
        as :meth:`truncation_plan` says.

        The copy has no ordering units; each formerly masked layer multiplies its kept channels
        by their keep probabilities, so in eval it computes exactly what the masked full model
        computes under ``with model.width(width)``.
        """
        new = copy.deepcopy(self)
        new._apply_plan(new.truncation_plan(width))
        new.truncated_width = width
        return new

    def _apply_plan(self, plan: dict[str, "LayerCut"]) -> None:
        for name, layer in self.named_modules():
            if isinstance(layer, BayesNestedLayer):
                cut = plan[name]
                in_keep = None if cut.in_ranges is None else cut.in_ranges[0][1]
                layer.truncate_(cut.out_keep, in_keep, cut.out_scale)


@dataclass
class LayerCut:
    """One layer of a width's truncation plan (:meth:`NestedModel.truncation_plan`).

    ``out_keep``: kept output channels, a prefix (None: all); ``in_ranges``: kept input
    channels as ``[start, stop)`` ranges in torch input-channel units (None: all; one prefix
    range in the built-in models, one range per concatenated segment in ``trainer.nest``
    models); ``out_scale``: the kept outputs' keep probabilities (folded into the layer);
    ``in_scale``: per kept input channel, a ReLU6 producer's keep probability folded forward
    (``trainer.nest``), None otherwise."""

    out_keep: int | None
    in_ranges: list[tuple[int, int]] | None
    out_scale: torch.Tensor | None = None
    in_scale: torch.Tensor | None = None


def _input_channels(layer: BayesNestedLayer) -> int:
    if hasattr(layer, "in_features"):
        return layer.in_features // layer.input_spatial
    return layer.in_channels
