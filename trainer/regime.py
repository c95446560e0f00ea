"""One training step: which widths it trains and against which targets (the nesting regime, docs/training.md).

BN³ (§3, eq. 7–8) trains one forward pass per step with Downhill-sampled masks. Measured on
cifar10_dev, that regime alone underfits (~12 of ~16 pt lost to a plain VGG come from
the ordering's sampling, not from the KL or the weight noise), so a step can add:

- ``ordering.mask_scope: batch``: one mask per unit per pass instead of one per example;
- ``ordering.coupling: network``: the units share their Gumbel noise, so a pass runs a coherent
  network of one width class instead of independent per-layer widths
  (:func:`trainer.ordering.coupled_gumbel`);
- ``train.sandwich``: the sandwich rule of US-Nets (Yu & Huang, 2019, §3.2): besides the
  Downhill sample, the full width and the smallest width are trained every step, with 0/1 masks
  (what a sample of that width runs);
- ``train.sampled_width: uniform``: the sampled pass runs one width drawn uniformly from the
  group boundaries strictly between the sandwich's narrowest and the full width (US-Nets'
  random widths) instead of a Downhill draw, which at the learned keep probabilities (~0.96
  per group) stops at a middle width a few percent of the steps;
- ``train.sampled_passes``: how many sampled passes a step runs (US-Nets trains two random
  widths besides the largest and the smallest);
- ``train.distill``: in-place distillation (US-Nets §3.3): the full width learns the labels,
  the sampled and smallest widths its detached soft predictions;
- ``train.nested_start``: the first fraction of the epochs trains the full width alone (one
  pass per step, labels only); the nested regime follows (Once-for-All's progressive shrinking);
- ``bayes.noise_start``: the first fraction of the epochs runs the posterior means (one
  convolution per layer instead of two, no weight KL); the variational phase follows.

Each pass is back-propagated as soon as it is computed (gradients accumulate; one optimizer step
per batch), so memory holds one pass's graph and DDP reduces per pass.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from trainer.config import Config
from trainer.device import as_channels_last
from trainer.models import NestedModel
from trainer.ordering import clear_coupling, coupled_gumbel


@dataclass
class StepResult:
    loss: float  # the summed loss of every pass (for logging)
    logits: torch.Tensor  # the Downhill-sampled pass (training accuracy is measured on it)
    full_logits: torch.Tensor | None  # the full-width pass, with the sandwich rule


def distillation_loss(student_logits: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the student against the teacher's soft predictions (mean over the batch).

    The teacher's probabilities must be detached by the caller: distillation trains the
    student towards the teacher, never the teacher towards the student.
    """
    return -(teacher_probs * F.log_softmax(student_logits, -1)).sum(-1).mean()


def train_step(net: torch.nn.Module, model: NestedModel, x: torch.Tensor, y: torch.Tensor, *,
               mask_coupling: str, sandwich: bool, distill: bool, noise: bool,
               regularizer: Callable[[], torch.Tensor],
               min_width: float | None = None, sampled_width: str = "downhill",
               sampled_passes: int = 1, subnet_weight: float = 1.0,
               narrow_pass: bool = True) -> StepResult:
    """Forward and backward every pass of one step (the caller zeroes grads and steps).

    ``net`` is ``model`` or its DDP wrapper; ``regularizer()`` is added once per step (to the
    first pass); ``noise=False`` runs every Bayesian layer at its posterior mean;
    ``min_width`` is the sandwich rule's narrowest width (default: the model's minimum);
    ``sampled_width`` is ``"downhill"`` (the ordering's own draw) or ``"uniform"``
    (:func:`uniform_width`); ``sampled_passes`` is how many such passes a step runs (US-Nets'
    sandwich: 2 random widths besides the largest and smallest); ``subnet_weight`` scales the
    sampled and narrowest passes' losses when the sandwich runs (1: US-Nets' plain sum);
    ``narrow_pass=False`` drops the sandwich's narrowest pass (the full and sampled ones stay).
    """
    means = contextlib.nullcontext() if noise else model.weight_mode("mean")
    total = 0.0
    teacher = full_logits = None
    with means:
        reg = regularizer()
        if sandwich:
            with model.width(1.0, scaled=False):
                full_logits = net(x)
            loss = F.cross_entropy(full_logits, y) + reg
            loss.backward()
            total += loss.item()
            reg = None
            if distill:
                teacher = torch.softmax(full_logits.detach(), -1)

        # with the sandwich, the narrower passes' losses are weighted (the full width's is 1)
        weight = subnet_weight if sandwich else 1.0

        def target_loss(logits: torch.Tensor) -> torch.Tensor:
            if teacher is not None:
                return weight * distillation_loss(logits, teacher)
            return weight * F.cross_entropy(logits, y)

        units = model.orderings()
        logits = None
        for _ in range(sampled_passes):
            if sampled_width == "uniform":
                with model.width(uniform_width(model, min_width or model.min_width()),
                                 scaled=False):
                    out = net(x)
            else:
                if mask_coupling == "network":
                    coupled_gumbel(units, len(x))
                try:
                    out = net(x)
                finally:
                    clear_coupling(units)
            loss = target_loss(out) + (reg if reg is not None else 0.0)
            loss.backward()
            total += loss.item()
            reg = None
            logits = out if logits is None else logits
        if sandwich and narrow_pass:
            with model.width(min_width or model.min_width(), scaled=False):
                loss = target_loss(net(x))
            loss.backward()
            total += loss.item()
    return StepResult(total, logits.detach(), None if full_logits is None else full_logits.detach())


def full_width_step(net: torch.nn.Module, model: NestedModel, x: torch.Tensor, y: torch.Tensor,
                    *, noise: bool, regularizer: Callable[[], torch.Tensor]) -> StepResult:
    """One pass at the full width against the labels (``train.nested_start``'s warm-up)."""
    means = contextlib.nullcontext() if noise else model.weight_mode("mean")
    with means, model.width(1.0, scaled=False):
        logits = net(x)
        loss = F.cross_entropy(logits, y) + regularizer()
    loss.backward()
    return StepResult(loss.item(), logits.detach(), logits.detach())


def regime_step(net: torch.nn.Module, model: NestedModel, x: torch.Tensor, y: torch.Tensor,
                cfg: Config, *, noise: bool, regularizer: Callable[[], torch.Tensor],
                nested: bool = True) -> StepResult:
    """:func:`train_step` with the regime of ``cfg`` (training and the quantizers' fine-tuning
    use the same one, so fine-tuning never drifts the widths training kept); ``nested=False``
    is the full-width warm-up of ``train.nested_start`` (:func:`full_width_step`)."""
    # NHWC images for passes at the posterior means only: with weight noise the variance
    # convolution (x^2 * sigma^2) runs 1.5x slower in NHWC than in NCHW (benchmarks/step_cost.py)
    x = as_channels_last(x, cfg.train.channels_last and not noise)
    if not nested:
        return full_width_step(net, model, x, y, noise=noise, regularizer=regularizer)
    return train_step(net, model, x, y, mask_coupling=cfg.ordering.coupling,
                      sandwich=cfg.train.sandwich, distill=cfg.train.distill, noise=noise,
                      regularizer=regularizer, min_width=sandwich_min_width(model, cfg),
                      sampled_width=cfg.train.sampled_width,
                      sampled_passes=cfg.train.sampled_passes,
                      subnet_weight=cfg.train.subnet_weight,
                      narrow_pass=cfg.train.narrow_pass)


def sandwich_min_width(model: NestedModel, cfg: Config) -> float:
    """The sandwich rule's narrowest width: ``train.min_width``, else the smallest width the
    model is evaluated and exported at (``train.eval_widths``), never below what it can run."""
    w = cfg.train.min_width or min(cfg.train.eval_widths)
    return max(w, model.min_width())


def uniform_width(model: NestedModel, min_width: float) -> float:
    """A width drawn uniformly (torch's global generator, so a seeded run repeats) from the
    group boundaries ``k / G`` strictly between ``min_width`` and 1 (G = the finest unit's
    groups); ``min_width`` itself when there is none between."""
    groups = max((u.groups for u in model.orderings()), default=1)
    lo = int(min_width * groups + 1e-9) + 1  # the first boundary above min_width
    if lo >= groups:
        return min_width
    return int(torch.randint(lo, groups, ())) / groups
