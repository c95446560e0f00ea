"""PWFN's clustering maths on flat tensors (Subia-Waud & Dasmahapatra, §3 and Algorithm 1 of
the appendix): the candidate centres C^omega of additive powers of two (eq. 5), the
powers-of-two sigma initialisation (appendix eq. 8-9 / main eq. 4), and one round of fixing
free weights to centres by ``D_prob(w_i, c) = |mu_i - c| / sigma_i`` (eq. 6, the prefix rule
of eq. 8), each fixed group keeping the population std of its means.

Split out of trainer/quantize/pwfn.py, which applies these rounds to a network and retrains
between them (``fix_weights_``); moved as it was.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from edge_sdk.errors import ConfigError

__all__ = ["MIN_SIGMA", "RoundStats", "candidate_centres", "cluster_round", "nearest", "pow2_sigma"]

MIN_SIGMA = 1e-12  # D_prob's denominator floor: a fixed singleton has sigma exactly 0


# --------------------------------------------------------------------------------- centres
def candidate_centres(max_abs: float, precision: int = 7, max_order: int = 4
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """All centres of C^omega for omega <= max_order (eq. 5), sorted, with each one's order.

    R holds the powers 2^J, 2^(J-1), ..., 2^-b, where 2^J is the largest power not above
    ``max_abs`` (the largest needed: sums of smaller powers stay below 2^(J+1)). A centre of
    order omega is a same-sign sum of omega distinct elements of R, so C^omega = {c : order(c)
    <= omega}; 0 has order 0. Built once by enumerating subsets as bit masks.
    """
    # frexp is exact: max_abs = m * 2^e with 0.5 <= m < 1, so the largest power <= max_abs is 2^(e-1)
    top = max(math.frexp(max_abs)[1] - 1, -precision) if max_abs > 0 else -precision
    exponents = torch.arange(top, -precision - 1, -1, dtype=torch.float64, device="cpu")
    powers = torch.pow(2.0, exponents)
    n = len(powers)
    if n > 24:
        raise ConfigError(f"{n} powers of two between 2^{top} and 2^-{precision}: too many; "
                          "lower quantize.pwfn.precision")
    masks = torch.arange(1, 2 ** n, dtype=torch.int64, device="cpu")
    bits = (masks[:, None] >> torch.arange(n, device="cpu")) & 1
    order = bits.sum(1)
    keep = order <= max_order
    values = (bits[keep].double() * powers).sum(1)
    order = order[keep]
    values = torch.cat([-values, torch.zeros(1, dtype=torch.float64, device="cpu"), values])
    order = torch.cat([order, torch.zeros(1, dtype=torch.int64, device="cpu"), order])
    idx = torch.argsort(values)
    return values[idx], order[idx]


def nearest(sorted_centres: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centre for every x (ties go to the smaller centre)."""
    hi = torch.searchsorted(sorted_centres, x).clamp(1, len(sorted_centres) - 1)
    lo = hi - 1
    pick_hi = (sorted_centres[hi] - x).abs() < (x - sorted_centres[lo]).abs()
    return torch.where(pick_hi, hi, lo)


# ----------------------------------------------------------------------------- sigma init
def pow2_sigma(mu: torch.Tensor) -> torch.Tensor:
    """The paper's powers-of-two sigma initialisation (appendix eq. 8-9 / main eq. 4).

    On |mu| in [2^x, 2^(x+1)]: D_d = (|mu| - 2^x) / 2^x and D_u = (2^(x+1) - |mu|) / 2^(x+1)
    are the relative distances to the lower and upper powers of two;
    ``sigma = clamp(0.0025 * D_u * D_d / Q_0.75(D_u), 2^-30, 0.05)``. The appendix prints the
    clamp as ``max(0.1, min(f, 2^-30))``, which would make every sigma 0.1; the text says
    "clamp to [2^-30, 0.05]", the only reading consistent with sigma vanishing at powers of
    two, so that is what this does. mu = 0 gets 2^-30.
    """
    a = mu.abs().double()
    nz = a > 0
    x = torch.floor(torch.log2(torch.where(nz, a, torch.ones_like(a))))
    lower, upper = torch.pow(2.0, x), torch.pow(2.0, x + 1)
    d_down = (a - lower) / lower
    d_up = (upper - a) / upper
    q = torch.quantile(d_up[nz], 0.75) if bool(nz.any()) else torch.tensor(1.0, device=mu.device)
    f = 0.0025 * d_up * d_down / q.clamp_min(1e-12)
    sigma = f.clamp(2.0 ** -30, 0.05)
    return torch.where(nz, sigma, torch.full_like(sigma, 2.0 ** -30)).to(mu.dtype)


# ----------------------------------------------------------------------------- clustering
@dataclass
class RoundStats:
    searches: int = 0  # cluster searches (one centre each)
    escalations: int = 0  # omega/delta escalations because no prefix qualified
    seconds: float = 0.0
    max_order_used: int = 0


def cluster_round(mu: torch.Tensor, sigma: torch.Tensor, free: torch.Tensor, target: int,
                  centres: torch.Tensor, order: torch.Tensor, *, delta0: float = 1.0,
                  max_order: int = 4, rule: str = "mean", assign: str = "centre"
                  ) -> tuple[torch.Tensor, torch.Tensor, RoundStats]:
    """Fix free weights until ``target`` weights are fixed in total (Algorithm 1, one round).

    Each search: with omega = 1 and delta = delta0, every free weight's nearest centre in
    C^omega by D_prob (sigma_i is constant across centres, so that is the Euclidean-nearest
    centre); the most popular centre c_k*; free weights sorted by D_prob to c_k*; the longest
    prefix whose running mean D_prob <= delta (``rule="mean"``, eq. 8) or whose every D_prob
    <= delta (``rule="strict"``), capped at what the round still needs, moves to c_k*. An
    empty prefix escalates omega <- min(omega + 1, max_order), delta <- 2 delta.

    ``assign="centre"`` moves the whole prefix to c_k* (§3's text); ``assign="nearest"`` moves
    each selected weight to its own nearest centre in C^omega (Algorithm 1's last step, "assign
    ... to cluster centre c*_omega(i)"). The two readings differ only for prefix members whose
    nearest centre is not c_k*, which is exactly what happens once delta has escalated.

    Returns (value, group_sigma, stats): for newly fixed entries, their centre and the
    population std of the means that moved to that centre together (0 for a singleton); NaN
    elsewhere. ``free`` is updated in place.
    """
    if rule not in ("mean", "strict"):
        raise ConfigError(f"rule must be mean or strict, got {rule!r}")
    if assign not in ("centre", "nearest"):
        raise ConfigError(f"assign must be centre or nearest, got {assign!r}")
    t0 = time.perf_counter()
    stats = RoundStats()
    value = torch.full_like(mu, float("nan"))
    group_sigma = torch.full_like(mu, float("nan"))
    mu64, sig = mu.double(), sigma.double().clamp_min(MIN_SIGMA)
    if not 0 <= target <= len(mu):
        raise ConfigError(f"target must be between 0 and the {len(mu)} entries, got {target}")
    need = target - int((~free).sum())
    while need > 0:
        free_idx = torch.nonzero(free).squeeze(1)
        m, s = mu64[free_idx], sig[free_idx]
        omega, delta = 1, delta0
        while True:
            stats.searches += 1
            cands = centres[order <= omega]
            near = nearest(cands, m)
            k_star = int(torch.bincount(near, minlength=len(cands)).argmax())
            c = cands[k_star]
            d = (m - c).abs() / s
            d_sorted, perm = torch.sort(d, stable=True)
            if rule == "mean":
                # the running mean of an ascending list never decreases: a count suffices
                running = torch.cumsum(d_sorted, 0) / torch.arange(1, len(d) + 1, dtype=d.dtype,
                                                                   device=d.device)
                length = int((running <= delta).sum())
            else:
                length = int((d_sorted <= delta).sum())
            length = min(length, need)
            if length > 0:
                break
            stats.escalations += 1
            omega, delta = min(omega + 1, max_order), 2 * delta
        chosen = free_idx[perm[:length]]
        if assign == "centre":
            dest = c.expand(length)
        else:
            dest = cands[near[perm[:length]]]
        value[chosen] = dest.to(mu.dtype)
        group_sigma[chosen] = _group_std(mu64[chosen], dest).to(mu.dtype)
        free[chosen] = False
        need -= length
        stats.max_order_used = max(stats.max_order_used, omega)
    stats.seconds = time.perf_counter() - t0
    return value, group_sigma, stats


def _group_std(x: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Population std of x within each group (same destination), broadcast back; 0 for a
    singleton and never NaN."""
    _, inv, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    n = counts.to(x.dtype)
    mean = torch.zeros_like(n).index_add_(0, inv, x) / n
    var = torch.zeros_like(n).index_add_(0, inv, (x - mean[inv]) ** 2) / n
    return var.sqrt()[inv]
