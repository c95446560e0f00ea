"""The SQS mean weight of one window, fused and chunked (SQS eq. 2 and eq. 6's mean).

For the weights ``x`` of one window with components (mu_k, sigma_k, pi_k):

    r_ik  = softmax_k(log pi_k - log sigma_k - log(2 pi) / 2 - (x_i - mu_k)^2 / (2 sigma_k^2))
    phi_ik = softmax_k(r_ik / tau)
    m_i   = sum_k mu_k phi_ik

Why a hand-written backward: written as tensor expressions over [weights x K], this is ~12
[n x K] temporaries forward and as many backward, each a trip through main memory (nested_vgg
at width_mult 0.5: 2.4 M weights x 16 components = 150 MB per temporary; 3.5 s forward and
backward on one core, twice the training passes of an SQS step). Here the weights run in chunks
whose [chunk x K] temporaries stay in cache, nothing of size [n x K] is saved (the backward
recomputes a chunk's r and phi from x), the gradients are the closed forms below, and weights
whose phi is exactly one-hot skip them (see ``backward``): 0.46 s on one core, 0.33 s on two,
with 10x less error against float64 than the expression (`benchmarks/sqs_phi.py`).

Backward, with g = dL/dm_i:  dL/dphi_ik = g mu_k, so through phi's softmax
dL/d(r_ik / tau) = g phi_ik (mu_k - m_i); through r's softmax
dL/dlj_ik = r_ik (g_r_ik - sum_j r_ij g_r_ij); and lj = C_k - z^2 / 2 with
z_ik = (x_i - mu_k) / sigma_k gives dlj/dz = -z.
"""
from __future__ import annotations

import math

import torch

# rows per chunk on the CPU: 8192 x 16 components x 4 B = 512 KB per temporary, inside L2
# (2k: 0.74 s, 8k: 0.67 s, 32k: 0.70 s for 2.4 M weights on one core, before the one-hot skip)
CPU_CHUNK = 8192


class WindowMean(torch.autograd.Function):
    """(m, k*) for one window: the mean weights (differentiable in x, mu, inv_sigma and C =
    log pi - log sigma - log(2 pi) / 2) and each weight's arg-max component (eq. 34)."""

    @staticmethod
    def forward(ctx, x, mu, inv_sigma, c, tau: float, chunk: int):
        m = torch.empty_like(x)
        k_star = torch.empty(x.shape, dtype=torch.long, device=x.device)
        support = torch.empty(x.shape, dtype=torch.long, device=x.device)
        for a in range(0, x.shape[0], chunk):
            lj, _ = _log_joint(x[a:a + chunk], mu, inv_sigma, c)
            phi = torch.softmax(torch.softmax(lj, -1).mul_(1.0 / tau), -1)
            torch.mv(phi, mu, out=m[a:a + chunk])
            torch.argmax(phi, -1, out=k_star[a:a + chunk])  # k* (eq. 34)
            support[a:a + chunk] = torch.count_nonzero(phi, dim=-1)
        soft_rows = torch.nonzero(support > 1).squeeze(1)
        ctx.save_for_backward(x, mu, inv_sigma, c, m, k_star, soft_rows)
        ctx.tau, ctx.chunk = tau, chunk
        ctx.mark_non_differentiable(k_star)
        return m, k_star

    @staticmethod
    def backward(ctx, g_m, _g_k):
        """A weight whose phi is exactly one-hot (every other component underflowed to 0: at
        the default tau = 5e-4 most of them) has m = mu_k* exactly, so dL/d(r / tau) =
        g phi (mu - m) = 0 exactly and its only gradient is g on mu_k*: the closed forms run on
        the other ("soft") weights only. Exactly one-hot, not "max phi = 1": a phi_j of 1e-9
        still gives theta a gradient, and Adam rescales small gradients to full steps."""
        x, mu, inv_sigma, c, m, k_star, soft_rows = ctx.saved_tensors
        tau, chunk = ctx.tau, ctx.chunk
        g_x = torch.zeros_like(x)
        g_mu, g_inv, g_c = torch.zeros_like(mu), torch.zeros_like(inv_sigma), torch.zeros_like(c)
        hard = torch.ones(x.shape, dtype=torch.bool, device=x.device)
        hard[soft_rows] = False
        g_mu.index_add_(0, k_star[hard], g_m[hard])  # m = mu_k*: the direct term only
        xs, gs, ms = x[soft_rows], g_m[soft_rows], m[soft_rows]
        g_xs = torch.empty_like(xs)
        for a in range(0, xs.shape[0], chunk):
            g = gs[a:a + chunk, None]
            lj, z = _log_joint(xs[a:a + chunk], mu, inv_sigma, c)
            r = torch.softmax(lj, -1)
            phi = torch.softmax(r * (1.0 / tau), -1)
            g_mu += g.squeeze(1) @ phi  # m = phi @ mu, directly
            g_r = phi.mul_(mu - ms[a:a + chunk, None]).mul_(g * (1.0 / tau))
            g_lj = r.mul_(g_r - (r * g_r).sum(-1, keepdim=True))
            g_c += g_lj.sum(0)
            g_z = g_lj.mul_(z).neg_()
            g_xs[a:a + chunk] = g_z @ inv_sigma
            g_mu -= g_z.sum(0) * inv_sigma  # z = (x - mu) inv_sigma
            g_inv += (g_z * z).sum(0) / inv_sigma
        g_x[soft_rows] = g_xs
        return g_x, g_mu, g_inv, g_c, None, None


def _log_joint(x: torch.Tensor, mu: torch.Tensor, inv_sigma: torch.Tensor, c: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    z = (x[:, None] - mu) * inv_sigma
    return torch.addcmul(c, z, z, value=-0.5), z


def window_mean(x: torch.Tensor, mu: torch.Tensor, log_sigma: torch.Tensor,
                log_pi: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, k*) of one window's weights ``x`` [n] over its K valid components (all [K])."""
    c = log_pi - log_sigma - 0.5 * math.log(2 * math.pi)
    chunk = CPU_CHUNK if x.device.type == "cpu" else max(x.shape[0], 1)
    return WindowMean.apply(x, mu, torch.exp(-log_sigma), c, tau, chunk)
