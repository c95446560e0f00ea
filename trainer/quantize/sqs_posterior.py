"""SQS's variational posterior of one weight tensor (§3.1 and Appendix C of the paper; the
equal-window ablation of Appendix D.2): the windows of the tensor's initial weight range, each
window's 1-D k-means and GMM initialisation (App. C), and ``SQSTensor``, the spike-and-GMM
posterior (eq. 6) with its responsibilities, sharpened phi (eq. 2), keep probability (eq. 33),
mean weight and arg-max component (eq. 34), and eq. 8's KL terms.

Split out of trainer/quantize/sqs.py, which fine-tunes these posteriors, prunes and samples
from them (``sqs_``); moved as it was.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from edge_sdk.errors import ConfigError
from trainer.config import SQSConfig
from trainer.quantize.sqs_mean import window_mean

__all__ = ["SQSTensor", "kmeans_1d", "make_windows"]

_LOG_2PI = math.log(2 * math.pi)


# ------------------------------------------------------------------------------- windows
def make_windows(x: torch.Tensor, mode: str = "outlier", iqr_factor: float = 5.0
                 ) -> tuple[torch.Tensor, list[tuple[float, float]]]:
    """Window index per value and each non-empty window's [lo, hi] range.

    ``outlier`` (App. C): tails below q1 - f*IQR and above q3 + f*IQR (f = 5 in the appendix;
    the main text's 1.5 is the textbook rule), and the bulk between the fences split at 0 into
    a negative and a non-negative window. The paper does not say where the bulk is split; 0
    keeps every component's sign fixed (no component straddles zero, where pruning already puts
    a spike). ``equal``: four equal-width windows over [min, max] (the ablation). Empty windows
    (small CNNs often have empty tails) are dropped and the rest renumbered.
    """
    x = x.detach().double()
    if mode == "outlier":
        q1, q3 = torch.quantile(x, 0.25), torch.quantile(x, 0.75)
        lo, hi = q1 - iqr_factor * (q3 - q1), q3 + iqr_factor * (q3 - q1)
        bulk = torch.where(x < 0, 1, 2)
        raw = torch.where(x < lo, 0, torch.where(x > hi, 3, bulk))
    elif mode == "equal":
        edges = torch.linspace(float(x.min()), float(x.max()), 5, dtype=torch.float64,
                               device=x.device)
        raw = torch.bucketize(x, edges[1:-1], right=True)
    else:
        raise ConfigError(f"windows must be outlier or equal, got {mode!r}")
    present = torch.unique(raw)
    remap = torch.full((4,), -1, dtype=torch.int64, device=x.device)
    remap[present] = torch.arange(len(present), device=x.device)
    index = remap[raw]
    bounds = [(float(x[index == w].min()), float(x[index == w].max())) for w in range(len(present))]
    return index, bounds


def kmeans_1d(x: torch.Tensor, k: int, iters: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's k-means in one dimension, vectorised: (sorted centres [k'], assignment [n]).

    k' <= min(k, number of distinct values): clusters left empty are dropped. Centres start at evenly spaced quantiles; an
    assignment is a ``searchsorted`` against the midpoints of the sorted centres.
    """
    x = x.detach().double()
    k = min(k, int(torch.unique(x).numel()))
    centres = torch.unique(torch.quantile(
        x, (torch.arange(k, dtype=torch.float64, device=x.device) + 0.5) / k))
    while len(centres) < k:  # repeated quantiles on clumped data: pad with unused distinct values
        extra = torch.unique(x)[~torch.isin(torch.unique(x), centres)][: k - len(centres)]
        centres = torch.sort(torch.cat([centres, extra])).values
    assign = torch.zeros(len(x), dtype=torch.int64, device=x.device)
    for _ in range(iters):
        assign = torch.searchsorted((centres[1:] + centres[:-1]) / 2, x)
        counts = torch.bincount(assign, minlength=k).double()
        sums = torch.zeros(k, dtype=torch.float64, device=x.device).index_add_(0, assign, x)
        new = torch.where(counts > 0, sums / counts.clamp_min(1), centres)
        new = torch.sort(new).values
        if torch.equal(new, centres):
            break
        centres = new
    # a cluster that ended empty is no codebook entry: drop it and reassign
    assign = torch.searchsorted((centres[1:] + centres[:-1]) / 2, x)
    centres = centres[torch.bincount(assign, minlength=len(centres)) > 0]
    return centres, torch.searchsorted((centres[1:] + centres[:-1]) / 2, x)


def _gmm_init(x: torch.Tensor, assign: torch.Tensor, k: int, floor: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """App. C: mu_k, sigma_k (unbiased std) and pi_k = |G_k| / n of each k-means group."""
    x = x.double()
    n = torch.bincount(assign, minlength=k).double()
    mu = torch.zeros(k, dtype=torch.float64, device=x.device).index_add_(0, assign, x) / n.clamp_min(1)
    ss = torch.zeros(k, dtype=torch.float64, device=x.device).index_add_(
        0, assign, (x - mu[assign]) ** 2)
    sigma = torch.sqrt(ss / (n - 1).clamp_min(1)).clamp_min(floor)
    return mu, sigma, n / n.sum()


# ------------------------------------------------------------------ the per-tensor posterior
class SQSTensor(nn.Module):
    """Spike-and-GMM posterior of one weight tensor, used as a parametrization of the layer's
    ``weight_mu``: the parametrized tensor is the mean weight lambda sum_k mu_k phi_k(theta)."""

    # inside step_parametrization: this step's mean weight, a detached leaf the passes share
    step_weight: torch.Tensor | None = None

    def __init__(self, theta: torch.Tensor, cfg: SQSConfig):
        super().__init__()
        flat = theta.detach().flatten()
        index, self.bounds = make_windows(flat, cfg.windows, cfg.iqr_factor)
        n_windows, k = len(self.bounds), 2 ** cfg.bits
        dev = flat.device
        mu = torch.zeros(n_windows, k, dtype=torch.float64, device=dev)
        sigma = torch.ones(n_windows, k, dtype=torch.float64, device=dev)
        log_pi = torch.full((n_windows, k), -math.inf, dtype=torch.float64, device=dev)
        floor = max(float(flat.abs().max()) * 1e-4, 1e-8)  # a singleton group has no spread
        for w in range(n_windows):  # a loop over <= 4 windows, never over weights
            xw = flat[index == w]
            centres, assign = kmeans_1d(xw, k)
            kw = len(centres)  # K_w = min(K, distinct values in the window)
            m, s, p = _gmm_init(xw, assign, kw, floor)
            mu[w, :kw], sigma[w, :kw], log_pi[w, :kw] = m, s, p.clamp_min(1e-12).log()
        self.register_buffer("window", index)
        # each window's weights (a partition of the tensor) and its valid components (a prefix
        # of the K slots: kmeans_1d fills min(K, distinct values))
        self.window_index = [torch.nonzero(index == w).squeeze(1) for w in range(n_windows)]
        self.window_order = torch.cat(self.window_index)
        self.register_buffer("valid", torch.isfinite(log_pi))
        self.mu = nn.Parameter(mu.float())
        self.log_sigma = nn.Parameter(sigma.log().float())
        self.pi_logit = nn.Parameter(torch.where(self.valid, log_pi, 0.0).float())
        self.window_components = [int(v) for v in self.valid.sum(1)]
        # keep-score from magnitude: lambda = sigmoid(2 |theta| / mean|theta|) starts large
        # weights near 1 and tiny ones near 1/2; learning then re-ranks them
        scale = flat.abs().mean().clamp_min(1e-12)
        self.s = nn.Parameter((cfg.tau_prune * 2 * flat.abs() / scale).float())
        self.tau = cfg.tau
        self.tau_prune = cfg.tau_prune
        self.shape = tuple(theta.shape)

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        """log pi_k + log N(theta_i | mu_k, sigma_k^2) over the weight's window, [n, K]."""
        w = self.window
        log_pi = torch.log_softmax(self.pi_logit.masked_fill(~self.valid, -math.inf), -1)[w]
        mu, log_sigma = self.mu[w], self.log_sigma[w]
        z = (theta.flatten()[:, None] - mu) / log_sigma.exp()
        lj = log_pi - 0.5 * z * z - log_sigma - 0.5 * _LOG_2PI
        return lj.masked_fill(~self.valid[w], -math.inf)

    def responsibilities(self, theta: torch.Tensor) -> torch.Tensor:
        """r_ik in [0, 1] (DGMS), computed from log densities: raw densities underflow."""
        return torch.softmax(self.log_joint(theta), -1)

    def phi(self, theta: torch.Tensor, tau: float | None = None) -> torch.Tensor:
        """eq. 2: phi = softmax(r / tau) over the weight's window components."""
        r = self.responsibilities(theta) / (self.tau if tau is None else tau)
        return torch.softmax(r.masked_fill(~self.valid[self.window], -math.inf), -1)

    def keep_probability(self) -> torch.Tensor:
        return torch.sigmoid(self.s / self.tau_prune)  # eq. 33

    def mean_and_mode(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean weight lambda sum_k mu_k phi_k (shaped like the tensor) and each weight's
        arg-max component k* (eq. 34), from one evaluation of phi -- window by window, fused
        (:mod:`trainer.quantize.sqs_mean`: 7-9x faster than :meth:`phi`'s [n x K] expression)."""
        flat = theta.flatten()
        log_pi = torch.log_softmax(self.pi_logit.masked_fill(~self.valid, -math.inf), -1)
        means, modes = [], []
        for w, (index, k) in enumerate(zip(self.window_index, self.window_components)):
            m, k_star = window_mean(flat[index], self.mu[w, :k], self.log_sigma[w, :k],
                                    log_pi[w, :k], self.tau)
            means.append(m)
            modes.append(k_star)
        # the windows partition the tensor: put each window's results back at its weights
        at = (self.window_order,)
        mean = flat.new_empty(flat.shape).index_put(at, torch.cat(means))
        mode = torch.empty(flat.shape, dtype=torch.long, device=flat.device).index_put(
            at, torch.cat(modes))
        return (self.keep_probability() * mean).view(self.shape), mode

    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        if self.step_weight is not None:  # see step_parametrization
            return self.step_weight
        return self.mean_and_mode(theta)[0]

    def kl(self, theta: torch.Tensor, prior_keep: float, prior_sigma: float,
           k_star: torch.Tensor | None = None) -> torch.Tensor:
        """eq. 8's two KL terms for this tensor (``k_star``: the components, if known; the
        term has no gradient through them)."""
        lam = self.keep_probability().clamp(1e-6, 1 - 1e-6)
        p = min(max(prior_keep, 1e-6), 1 - 1e-6)
        bern = lam * torch.log(lam / p) + (1 - lam) * torch.log((1 - lam) / (1 - p))
        if k_star is None:
            k_star = self.phi(theta).argmax(-1)
        mu = self.mu[self.window, k_star]
        sig = self.log_sigma[self.window, k_star].exp()
        gauss = (math.log(prior_sigma) - torch.log(sig)
                 + (sig * sig + mu * mu) / (2 * prior_sigma ** 2) - 0.5)
        return bern.sum() + (lam * gauss).sum()
