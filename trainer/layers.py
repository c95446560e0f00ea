"""Bayesian nested layers (BN³ §3.2–3.4, App. 8.1).

A layer is a *block*: Bayesian conv/linear -> optional batch norm -> activation -> ordering mask.
The mask comes after batch norm and the activation so a dropped channel is exactly zero for the
next layer (a mask before BN would leave BN's shift in the "dropped" channel). Nested blocks use
ReLU, which is positive-homogeneous: the keep-probability rescaling of App. 8.2 then folds
exactly into the batch norm's affine parameters at export.

Weights are mean-field Gaussians ``N(mu, sigma^2)`` with ``sigma = softplus(rho)``. In training
the pre-activation is sampled by local reparameterisation (eq. 21–22): mean ``x * mu`` and
variance ``x^2 * sigma^2``, one draw per output element.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from edge_sdk.errors import ConfigError
from trainer.ordering import DownhillOrdering

# BN³ eq. (20): -KL[q(w | theta, alpha) || log-uniform] ~ a1 exp(-e^{a4} (a2 + a3 log alpha)^2)
#               - 0.5 log(1 + 1/alpha) + C
_A1, _A2, _A3, _A4 = 0.7294, -0.2041, 0.3492, 0.5387


def _neg_kl_log_uniform(log_alpha: torch.Tensor) -> torch.Tensor:
    return (_A1 * torch.exp(-math.exp(_A4) * (_A2 + _A3 * log_alpha) ** 2)
            - 0.5 * F.softplus(-log_alpha))  # 0.5 log(1 + 1/alpha), stable


# The constant C is unknown; we choose it so the approximation's minimum over alpha is 0 (the
# maximum of -KL sits near alpha ~ 1.8). A constant has no gradient, it only keeps reported KLs
# non-negative and comparable.
_LOG_UNIFORM_C = float(_neg_kl_log_uniform(torch.linspace(-10.0, 10.0, 200001)).max())

WeightKL = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def log_uniform_kl(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Elementwise KL to the log-uniform prior via the paper's eq. (20), alpha = sigma^2 / mu^2."""
    log_alpha = 2.0 * torch.log(sigma) - torch.log(mu * mu + 1e-16)
    return _LOG_UNIFORM_C - _neg_kl_log_uniform(log_alpha)


def gaussian_kl(prior_sigma: float) -> WeightKL:
    """KL[N(mu, sigma^2) || N(0, prior_sigma^2)] elementwise.

    Departs from the paper (which uses the log-uniform prior); offered because its KL is exact
    and it is the usual choice in Bayes-by-backprop baselines.
    """
    def kl(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return (math.log(prior_sigma) - torch.log(sigma)
                + (sigma * sigma + mu * mu) / (2.0 * prior_sigma ** 2) - 0.5)
    return kl


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


# relu and None are positive-homogeneous (the keep-probability rescale folds backwards through
# them); the others only appear in trainer.nest's blocks, whose rescale folds forwards
_ACTIVATIONS = {"relu": F.relu, "relu6": F.relu6, None: None, "hardswish": F.hardswish,
                "hardsigmoid": F.hardsigmoid, "silu": F.silu, "sigmoid": torch.sigmoid}


class BayesNestedLayer(nn.Module):
    """Shared machinery of :class:`BayesNestedConv2d` and :class:`BayesNestedLinear`.

    ``ordering`` groups the output channels (for the KL weighting and truncation);
    ``apply_mask`` says whether this block multiplies its output by the ordering mask (a unit
    shared by two layers, e.g. MobileNetV2's expand + depthwise pair, masks only once, after the
    depthwise block; the expand channel c only feeds depthwise channel c, so that is exact).
    ``input_ordering`` names the unit that orders this layer's *input* channels, so truncation
    can slice them; ``input_spatial`` is H*W when the input was flattened from (C, H, W).

    ``mode``: ``None`` (sample in training, mean in eval), ``"mean"``, ``"sample"`` (local
    reparameterisation) or ``"sample_weights"`` (one weight draw shared by the whole batch:
    a coherent posterior network, what the exporter ships).
    """

    def __init__(self, weight_shape: tuple[int, ...], out_channels: int, *,
                 ordering: Optional[DownhillOrdering], apply_mask: bool, batch_norm: str | None,
                 activation: str | None, bias: bool, log_alpha_init: float):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ConfigError(f"activation must be one of {', '.join(map(str, _ACTIVATIONS))}; "
                              f"got {activation!r}")
        if ordering is not None:
            if out_channels % ordering.groups:
                raise ConfigError(f"{out_channels} output channels do not split into "
                                  f"{ordering.groups} equal groups")
            if (out_channels // ordering.groups) % 4:
                raise ConfigError(
                    f"group size {out_channels // ordering.groups} ({out_channels} channels / "
                    f"{ordering.groups} groups) must be a multiple of 4: TFLite/XNNPACK run odd "
                    f"channel counts up to 2x slower")
            if apply_mask and activation == "relu6":
                raise ConfigError("a nested (masked) block must use relu, not relu6: the keep-"
                                  "probability scale only folds through a positive-homogeneous "
                                  "activation")
        self.out_channels = out_channels
        self.ordering = ordering
        self.apply_mask = apply_mask and ordering is not None
        self.activation = activation
        self.mode: str | None = None
        self.weight_kl_fn: WeightKL | None = log_uniform_kl
        self.weight_mu = nn.Parameter(torch.empty(weight_shape))
        self.weight_rho = nn.Parameter(torch.empty(weight_shape))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.bn = self._make_bn(batch_norm, out_channels)
        self.register_buffer("out_scale", None)  # set by truncation: the folded keep probability
        object.__setattr__(self, "input_ordering", None)  # a reference, not a submodule
        self.input_spatial = 1
        self.reset_parameters(log_alpha_init)

    @staticmethod
    def _make_bn(kind: str | None, channels: int) -> nn.Module | None:
        if kind is None:
            return None
        return {"2d": nn.BatchNorm2d, "1d": nn.BatchNorm1d}[kind](channels)

    def reset_parameters(self, log_alpha_init: float) -> None:
        nn.init.kaiming_normal_(self.weight_mu, nonlinearity="relu")
        self.reset_sigma(log_alpha_init)

    @torch.no_grad()
    def reset_torch_default(self, log_alpha_init: float) -> None:
        """nn.Conv2d / nn.Linear's own initialisation (``model.init: torch``): weights
        U(+-1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5)), a bias U(+-1/sqrt(fan_in))."""
        nn.init.kaiming_uniform_(self.weight_mu, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.weight_mu[0].numel())
            self.bias.uniform_(-bound, bound)
        self.reset_sigma(log_alpha_init)

    @torch.no_grad()
    def reset_sigma(self, log_alpha: float) -> None:
        """sigma = |mu| sqrt(alpha) (BN³ App. 9.1 initialises log alpha), floored so a weight
        near zero still has some spread. Called again when the variational phase starts after a
        deterministic warm-up (``bayes.noise_start``): the means have moved since initialisation."""
        sigma = (self.weight_mu.detach().abs() * math.exp(0.5 * log_alpha)).clamp_min(1e-5)
        self.weight_rho.copy_(_inverse_softplus(sigma))

    def follows(self, ordering: DownhillOrdering | None, spatial: int = 1) -> "BayesNestedLayer":
        """Declare that this layer's input channels are ordered by ``ordering``."""
        object.__setattr__(self, "input_ordering", ordering)
        self.input_spatial = spatial
        return self

    @property
    def weight_sigma(self) -> torch.Tensor:
        return F.softplus(self.weight_rho)

    def _op(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _channel_view(self, t: torch.Tensor, ndim: int) -> torch.Tensor:
        return t.view(t.shape[0], -1, *([1] * (ndim - 2)))

    def kept_outputs(self) -> int | None:
        """Output channels computed in this pass: the kept prefix when the ordering unit runs a
        fixed width (``model.width(w)``), ``None`` (all) otherwise.

        A fixed width's mask is 0 on every dropped group, so computing only the kept prefix is
        exact -- it is what the truncated slice runs -- and a narrow pass costs what the narrow
        network costs (the sandwich rule's smallest width: ~1/64 of the full pass's MACs in the
        deep layers, instead of a full pass multiplied by zeros). Layers reading this output
        take only the channels they receive (:meth:`_active_weight`). A Downhill-*sampled* mask
        is not sliced: its straight-through gradient on the ordering logits needs the dropped
        channels' activations.
        """
        u = self.ordering
        if u is None or u.fixed_groups is None or u.fixed_groups == u.groups:
            return None
        return u.fixed_groups * (self.out_channels // u.groups)

    def _active_weight(self, w: torch.Tensor, x: torch.Tensor, out_keep: int | None) -> torch.Tensor:
        """``w`` cut to the computed outputs and to the input channels ``x`` carries (fewer than
        the layer's when the layer before ran a fixed narrow width)."""
        if out_keep is not None:
            w = w[:out_keep]
        if self.input_ordering is not None and w.shape[1] > 1:
            have = x.shape[1]
            if have < w.shape[1]:
                w = w[:, :have]
        return w

    def _batch_norm(self, y: torch.Tensor, k: int | None) -> torch.Tensor:
        """``self.bn`` on the first ``k`` channels (statistics updated in place on that prefix,
        as nn.BatchNorm's own forward does on all of them)."""
        bn = self.bn
        if k is None:
            return bn(y)
        factor = 0.0
        if bn.training and bn.track_running_stats:
            bn.num_batches_tracked.add_(1)
            factor = (1.0 / float(bn.num_batches_tracked) if bn.momentum is None
                      else bn.momentum)
        use_batch = bn.training or bn.running_mean is None
        track = not bn.training or bn.track_running_stats
        return F.batch_norm(y, bn.running_mean[:k] if track else None,
                            bn.running_var[:k] if track else None, bn.weight[:k], bn.bias[:k],
                            use_batch, factor, bn.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mode = self.mode or ("sample" if self.training else "mean")
        k = self.kept_outputs()
        mu = self._active_weight(self.weight_mu, x, k)
        if mode == "mean":
            y = self._op(x, mu)
        elif mode == "sample":
            sigma = self._active_weight(self.weight_sigma, x, k)
            mean = self._op(x, mu)
            var = self._op(x * x, sigma ** 2)
            y = mean + torch.sqrt(var + 1e-12) * torch.randn_like(mean)
        elif mode == "sample_weights":
            sigma = self._active_weight(self.weight_sigma, x, k)
            y = self._op(x, mu + sigma * torch.randn_like(mu))
        else:
            raise ConfigError(f"mode must be mean, sample or sample_weights, got {mode!r}")
        if self.bias is not None:
            y = y + self._channel_view(self.bias[:y.shape[1]].unsqueeze(0), y.ndim)
        if self.bn is not None:
            y = self._batch_norm(y, k)
        act = _ACTIVATIONS[self.activation]
        if act is not None:
            y = act(y)
        u = self.ordering
        # a fixed unscaled width computed as its kept prefix (or the full width) has a mask of 1
        # on every channel: skip the multiply (~3 % of a training pass at nested_vgg 0.5)
        ones = (u is not None and u.fixed_groups is not None and not u.fixed_scaled
                and (k is not None or u.fixed_groups == u.groups))
        if self.apply_mask and not ones:
            group_mask = self.ordering.forward_mask(y.shape[0])
            channel_mask = group_mask.repeat_interleave(self.out_channels // self.ordering.groups, -1)
            y = y * self._channel_view(channel_mask[:, :y.shape[1]], y.ndim)
        if self.out_scale is not None:
            y = y * self._channel_view(self.out_scale.unsqueeze(0), y.ndim)
        return y

    # ---- KL -----------------------------------------------------------------------------
    def weight_kl(self) -> torch.Tensor:
        """Weight KL, each output group weighted by its keep probability (eq. 15 as reduced in
        §3.4: e^T K^1 J_L^T beta, and (J_L^T beta)_j = P(tail >= j) = E[z_j])."""
        if self.weight_kl_fn is None:
            return self.weight_mu.new_zeros(())
        per_out = self.weight_kl_fn(self.weight_mu, self.weight_sigma).flatten(1).sum(1)
        if self.ordering is None:
            return per_out.sum()
        per_group = per_out.view(self.ordering.groups, -1).sum(1)
        return (per_group * self.ordering.keep_probability()).sum()

    # ---- truncation ---------------------------------------------------------------------
    def truncate_(self, out_keep: int | None, in_keep: int | None,
                  out_scale: torch.Tensor | None) -> None:
        """Keep the first ``out_keep`` output and ``in_keep`` input channels, in place.

        The layer stops being nested: its ordering is dropped and ``out_scale`` (the kept
        channels' keep probabilities) takes the mask's place.
        """
        out_sl = slice(None) if out_keep is None else slice(0, out_keep)
        in_sl = self._input_slice(in_keep)
        with torch.no_grad():
            for name in ("weight_mu", "weight_rho"):
                w = getattr(self, name)[out_sl][:, in_sl].clone()
                setattr(self, name, nn.Parameter(w))
            if self.bias is not None:
                self.bias = nn.Parameter(self.bias[out_sl].clone())
            if self.bn is not None:
                bn = self.bn
                n = bn.num_features if out_keep is None else out_keep
                new = type(bn)(n, eps=bn.eps, momentum=bn.momentum, device=bn.weight.device,
                               dtype=bn.weight.dtype)
                new.weight.copy_(bn.weight[out_sl]); new.bias.copy_(bn.bias[out_sl])
                new.running_mean.copy_(bn.running_mean[out_sl])
                new.running_var.copy_(bn.running_var[out_sl])
                new.num_batches_tracked.copy_(bn.num_batches_tracked)
                new.train(bn.training)  # a truncated eval model stays in eval mode
                self.bn = new
        if out_keep is not None:
            self.out_channels = out_keep
        self._after_truncate(out_keep, in_keep)
        self.ordering = None
        self.apply_mask = False
        object.__setattr__(self, "input_ordering", None)
        self.out_scale = None if out_scale is None else out_scale.detach().clone()

    def _input_slice(self, in_keep: int | None) -> slice:
        return slice(None) if in_keep is None else slice(0, in_keep * self.input_spatial)

    def _after_truncate(self, out_keep: int | None, in_keep: int | None) -> None:
        pass


class BayesNestedConv2d(BayesNestedLayer):
    """Bayesian conv block with nested output channels (App. 8.1). ``depthwise=True`` makes a
    depthwise conv whose input channels are its output channels. ``groups`` > 1 (trainer.nest:
    ResNeXt, RegNet) is a grouped conv with in == out channels that is cut by whole
    groups: its kept outputs are the first groups, which read the first input groups.
    ``kernel_size`` / ``stride`` / ``padding`` may be (h, w) pairs (Inception's 1x7, 7x1)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size=3, stride=1,
                 padding=None, *, depthwise: bool = False, groups: int = 1,
                 ordering: DownhillOrdering | None = None, apply_mask: bool = True,
                 batch_norm: bool = True, activation: str | None = "relu",
                 log_alpha_init: float = -4.0):
        if depthwise and in_channels != out_channels:
            raise ConfigError("a depthwise conv needs in_channels == out_channels, got "
                              f"{in_channels} and {out_channels}")
        if groups > 1 and (depthwise or in_channels != out_channels or in_channels % groups):
            raise ConfigError(f"a grouped conv needs in == out channels divisible by groups="
                              f"{groups}, got {in_channels} -> {out_channels}")
        self.in_channels = in_channels
        self.kernel_size, self.stride = kernel_size, stride
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
        self.padding = (kh // 2 if kh == kw else (kh // 2, kw // 2)) if padding is None \
            else padding
        self.depthwise = depthwise
        self.group_size = in_channels // groups  # channels per group (inputs and outputs)
        self.grouped = groups > 1  # its input channels follow its output groups
        shape = (out_channels, 1 if depthwise else in_channels // groups, kh, kw)
        super().__init__(shape, out_channels, ordering=ordering, apply_mask=apply_mask,
                         batch_norm="2d" if batch_norm else None, activation=activation,
                         bias=not batch_norm, log_alpha_init=log_alpha_init)

    @property
    def conv_groups(self) -> int:
        if self.depthwise:
            return self.out_channels
        return self.out_channels // self.group_size if self.grouped else 1

    def _op(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # depthwise / grouped: one group per computed group of outputs (fewer under a fixed
        # narrow width, which keeps whole groups)
        groups = weight.shape[0] if self.depthwise else \
            weight.shape[0] // self.group_size if self.grouped else 1
        return F.conv2d(x, weight, None, self.stride, self.padding, 1, groups)

    def _input_slice(self, in_keep: int | None) -> slice:
        # A depthwise / grouped kernel's inputs are its own group's: nothing to slice on dim 1.
        return slice(None) if self.depthwise or self.grouped else \
            super()._input_slice(in_keep)

    def _after_truncate(self, out_keep: int | None, in_keep: int | None) -> None:
        if self.depthwise or self.grouped:
            self.in_channels = self.out_channels
        elif in_keep is not None:
            self.in_channels = in_keep

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, depthwise={self.depthwise}, act={self.activation}")


class BayesNestedLinear(BayesNestedLayer):
    """Bayesian fully connected block with nested output features (BN³ §3.4, eq. 21–22)."""

    def __init__(self, in_features: int, out_features: int, *,
                 ordering: DownhillOrdering | None = None, apply_mask: bool = True,
                 batch_norm: bool = False, activation: str | None = "relu",
                 log_alpha_init: float = -4.0):
        self.in_features = in_features
        super().__init__((out_features, in_features), out_features, ordering=ordering,
                         apply_mask=apply_mask, batch_norm="1d" if batch_norm else None,
                         activation=activation, bias=not batch_norm, log_alpha_init=log_alpha_init)

    def _op(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)

    def _after_truncate(self, out_keep: int | None, in_keep: int | None) -> None:
        if in_keep is not None:
            self.in_features = in_keep * self.input_spatial

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, act={self.activation}"

    @property
    def out_features(self) -> int:
        return self.out_channels
