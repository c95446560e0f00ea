"""The variational ordering unit of BN³ (Bayesian Nested Neural Networks, §2.2–2.3, App. 7–8.2).

A layer's output channels are split into G groups. The unit holds a *Downhill* posterior over
ordered masks ``z = v_j`` (j ones then zeros): ``q(z = v_j) = beta_j``, with ``beta`` built from
conditional keep probabilities ``mu_j = sigmoid(mubar_j)`` (App. 8.2's parameterisation):

    beta_j = (1 - mu_{j+1}) * prod_{k<=j} mu_k,   mu_1..mu_F = 1 (frozen),  mu_{G+1} = 0.

Only ``mu_{F+1..G}`` are learnable, so beta is a normalised distribution over the tail index
j in {F..G}: the first F groups are always kept. The prior is the Bernoulli chain of eq. (1)
with conditional keep probabilities ``pi`` and the same boundary conventions, so that
``p(v_j) = (1 - pi_{j+1}) prod_{k<=j} pi_k`` (eq. 12; the paper's "sum pi_k" in one place is a
typo for this product, which is what App. 7.2 derives).

Indices in code are 0-based: group g in 0..G-1 is the paper's j = g + 1; tail vectors have
G - F + 1 entries, entry t being the paper's tail j = F + t (groups 1..j kept).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.errors import ConfigError


def _log_chain(logit: torch.Tensor) -> torch.Tensor:
    """log q(v_j) for tails j = F..G from the logits of mu_{F+1..G} (length G - F).

    log beta_j = logsigmoid(-mubar_{j+1}) + sum_{k<=j} logsigmoid(mubar_k), with the frozen
    mu_{<=F} = 1 contributing log 1 = 0 and mu_{G+1} = 0 contributing log(1 - 0) = 0.
    """
    zero = logit.new_zeros(1)
    kept = torch.cat([zero, torch.cumsum(F.logsigmoid(logit), 0)])  # sum_{k<=j} log mu_k
    stop = torch.cat([F.logsigmoid(-logit), zero])  # log(1 - mu_{j+1})
    return kept + stop


def gumbel_noise(shape: tuple[int, ...], device=None) -> torch.Tensor:
    """Standard Gumbel(0, 1) draws, -log(-log u), u clamped away from 0 and 1."""
    u = torch.rand(shape, device=device).clamp_(1e-10, 1 - 1e-10)
    return -torch.log(-torch.log(u))


def coupled_gumbel(units: list["DownhillOrdering"], batch: int) -> None:
    """Give every unit the same Gumbel noise for the next forward pass (``coupling: network``).

    Each unit keeps its own Downhill posterior (its marginal over widths is unchanged: the noise
    is still standard Gumbel), but the arg-max tails of units with similar posteriors now agree,
    so a pass runs a *coherent* narrow or wide network instead of independent per-layer widths
    (US-Nets trains one width for the whole network). Units with a different number of tails
    share a draw per tail count. ``None`` for ``units`` entries' ``gumbel`` restores
    independent noise (see :func:`clear_coupling`).
    """
    by_tails: dict[int, torch.Tensor] = {}
    for u in units:
        t = u.groups - u.frozen + 1
        n = batch if u.scope == "example" else 1
        if t not in by_tails:
            by_tails[t] = gumbel_noise((n, t), u.mubar.device)
        u.gumbel = by_tails[t]


def clear_coupling(units: list["DownhillOrdering"]) -> None:
    for u in units:
        u.gumbel = None


def exclusive_cumsum(c: torch.Tensor) -> torch.Tensor:
    """``out_j = sum_{k<j} c_k`` along the last axis (Property 1's cumsum')."""
    return torch.cumsum(c, -1) - c


class DownhillOrdering(nn.Module):
    """Downhill posterior + Bernoulli-chain prior over the ordered masks of one layer.

    Args:
        groups: G, the number of channel groups ordered by importance.
        frozen: F >= 1 leading groups that are always kept (the "base features").
        prior_pi: the prior's conditional keep probability pi_{F+1..G} (scalar or length G - F),
            strictly inside (0, 1) so every tail has prior mass and the KL is finite.
        init_mubar: initial logit of the learnable mu (the paper initialises all to 3, so
            mu ~ 0.95 and training starts close to the full network).

    State used by the layers (not parameters): ``tau`` and ``hard`` for training samples,
    ``scope`` (one mask per ``"batch"`` or per ``"example"``), ``gumbel`` (noise shared with the
    other units of the network for one forward pass, see :func:`coupled_gumbel`), and
    ``fixed_groups`` which, when set, replaces sampling by the fixed width's mask, scaled by the
    keep probability (BN³ App. 8.2) when ``fixed_scaled``, in train mode (BN re-collection, the
    sandwich rule's passes) and eval mode alike.
    """

    def __init__(self, groups: int, frozen: int = 1, prior_pi: float | list[float] = 0.9,
                 init_mubar: float = 3.0):
        super().__init__()
        if not isinstance(groups, int) or groups < 1:
            raise ConfigError(f"ordering groups must be an integer >= 1, got {groups!r}")
        if not isinstance(frozen, int) or not 1 <= frozen <= groups:
            raise ConfigError(
                f"ordering frozen must be an integer in [1, groups={groups}] (at least one group "
                f"is always kept), got {frozen!r}")
        pi = torch.as_tensor(prior_pi, dtype=torch.float32).flatten()
        if pi.numel() == 1:
            pi = pi.expand(groups - frozen).clone()
        if pi.numel() != groups - frozen:
            raise ConfigError(
                f"prior_pi must be a scalar or have groups - frozen = {groups - frozen} entries, "
                f"got {pi.numel()}")
        if not bool(((pi > 0) & (pi < 1)).all()):
            raise ConfigError(f"prior_pi must lie strictly inside (0, 1), got {pi.tolist()}")
        self.groups = groups
        self.frozen = frozen
        self.mubar = nn.Parameter(torch.full((groups - frozen,), float(init_mubar)))
        self.register_buffer("prior_logit", torch.log(pi) - torch.log1p(-pi))
        self.tau = 1.0
        self.hard = True
        self.scope = "example"
        self.gumbel: torch.Tensor | None = None
        self.fixed_groups: int | None = None
        self.fixed_scaled = True

    # ---- distributions -------------------------------------------------------------------
    def log_beta(self) -> torch.Tensor:
        """log q(v_j) over the tails j = F..G (length G - F + 1)."""
        return _log_chain(self.mubar)

    def beta(self) -> torch.Tensor:
        return self.log_beta().exp()

    def log_prior(self) -> torch.Tensor:
        """log p(v_j) of the Bernoulli-chain prior over the same tails (eq. 12)."""
        return _log_chain(self.prior_logit)

    def kl(self) -> torch.Tensor:
        """Closed-form KL[q(z) || p(z)] = sum_j beta_j log(beta_j / p(v_j)) (eq. 31, Φ1)."""
        log_q = self.log_beta()
        return (log_q.exp() * (log_q - self.log_prior())).sum()

    def expected_tail(self) -> torch.Tensor:
        """E[j] of the tail (1-based); ``lambda * expected_tail()`` is the ordered-l0 term (eq. 16)."""
        tails = torch.arange(self.frozen, self.groups + 1, dtype=self.mubar.dtype,
                             device=self.mubar.device)
        return (self.beta() * tails).sum()

    rescale = True  # the App. 8.2 rescale at fixed widths (trainer.ordering.rescale_of)

    def rescale_probability(self) -> torch.Tensor:
        """What a kept group is multiplied by at a fixed width: its keep probability (App. 8.2)
        or, for a network trained only at fixed 0/1 widths (``rescale`` False), 1."""
        keep = self.keep_probability()
        return keep if self.rescale else torch.ones_like(keep)

    def keep_probability(self) -> torch.Tensor:
        """E[z_j] = P(tail >= j) = prod_{k<=j} mu_k = 1 - sum_{k<j} beta_k (eq. 43–44), length G."""
        logit = self.mubar
        kept = torch.cumsum(F.logsigmoid(logit), 0).exp()
        return torch.cat([logit.new_ones(self.frozen), kept])

    # ---- masks ---------------------------------------------------------------------------
    def sample(self, tau: float | None = None, hard: bool = False,
               shape: tuple[int, ...] = (), gumbel: torch.Tensor | None = None) -> torch.Tensor:
        """Draw Downhill masks z of shape ``shape + (G,)`` (Property 1).

        c ~ GumbelSoftmax(log beta, tau) over the tails, z = 1 - cumsum'(c). ``hard`` uses the
        straight-through estimator: the forward value is the exactly ordered 0/1 mask of the
        arg-max tail, the gradient is the relaxed one. ``gumbel`` supplies the Gumbel(0, 1)
        noise (shape ``shape + (G - F + 1,)``) instead of drawing it, so several units can share it.
        """
        tau = self.tau if tau is None else tau
        log_beta = self.log_beta()
        if gumbel is None:
            gumbel = gumbel_noise(shape + log_beta.shape, log_beta.device)
        c = torch.softmax((log_beta + gumbel) / tau, dim=-1)
        if hard:
            one_hot = F.one_hot(c.argmax(-1), c.shape[-1]).to(c.dtype)
            c = one_hot - c.detach() + c
        # Tails start at group F: the frozen groups carry no tail mass, so their z is exactly 1.
        c = torch.cat([c.new_zeros(shape + (self.frozen - 1,)), c], dim=-1)
        return 1.0 - exclusive_cumsum(c)

    def groups_for_width(self, width: float) -> int:
        """Number of kept groups for a width fraction, snapped up to a group boundary.

        Training only ever cut at group boundaries, so a width inside a group is rounded up
        (never run a narrower network than asked). Widths below F/G cannot be honoured.
        """
        if not isinstance(width, (int, float)) or math.isnan(width) or not 0 < width <= 1:
            raise ConfigError(f"width must be a number in (0, 1], got {width!r}")
        if width * self.groups < self.frozen - 1e-6:
            raise ConfigError(
                f"width {width} is below this layer's {self.frozen} frozen of {self.groups} "
                f"groups; the smallest width for this layer is {self.frozen / self.groups:.4g}")
        return math.ceil(width * self.groups - 1e-6)

    def mask(self, width: float) -> torch.Tensor:
        """The ordered 0/1 mask v_k of length G for a fixed width."""
        k = self.groups_for_width(width)
        m = torch.zeros(self.groups, device=self.mubar.device)
        m[:k] = 1.0
        return m

    def forward_mask(self, batch: int) -> torch.Tensor:
        """The group mask a layer multiplies its output by: [batch or 1, G]."""
        if self.fixed_groups is not None:
            keep = self.rescale_probability()
            m = torch.zeros_like(keep)
            m[: self.fixed_groups] = 1.0
            return (m * keep if self.fixed_scaled else m.detach()).unsqueeze(0)
        if self.training:
            # "batch": one mask per forward pass, as the authors' code does. Measured on
            # cifar10_dev (docs/ablations.md): per example, a batch mixes widths inside
            # every batch norm and an example almost never sees the full network; it trained
            # ~4 pt worse at every width.
            shape = (batch,) if self.scope == "example" else (1,)
            gumbel = self.gumbel
            if gumbel is not None and gumbel.shape[0] != shape[0]:
                gumbel = gumbel[:1].expand(shape + gumbel.shape[1:])
            return self.sample(hard=self.hard, shape=shape, gumbel=gumbel)
        return self.rescale_probability().unsqueeze(0)  # full width, rescaled (App. 8.2)

    @contextmanager
    def fixed(self, width: float | None, scaled: bool = True) -> Iterator[None]:
        """Run at ``width`` (0/1 mask of its groups; times the keep probability if ``scaled``)."""
        previous = self.fixed_groups, self.fixed_scaled
        self.fixed_groups = None if width is None else self.groups_for_width(width)
        self.fixed_scaled = scaled
        try:
            yield
        finally:
            self.fixed_groups, self.fixed_scaled = previous

    def extra_repr(self) -> str:
        return f"groups={self.groups}, frozen={self.frozen}"


def tau_schedule(step: int, total_steps: int, tau_start: float, tau_end: float) -> float:
    """Exponential annealing from tau_start to tau_end over training (BN³ §3.3: tau -> 0)."""
    if total_steps <= 1:
        return tau_end
    frac = min(max(step / (total_steps - 1), 0.0), 1.0)
    return float(tau_start * (tau_end / tau_start) ** frac)


def rescale_of(config: dict | None) -> bool:
    """``ordering.rescale`` of a checkpoint's (or a Config's dict) training config: as set, or
    (null) on exactly when a training pass draws Downhill masks (``train.sampled_width``
    ``downhill``). A checkpoint without a config keeps the paper's rescale."""
    if not config:
        return True
    set_ = (config.get("ordering") or {}).get("rescale")
    if set_ is not None:
        return bool(set_)
    return (config.get("train") or {}).get("sampled_width", "downhill") == "downhill"
