"""Sparse Quantized Sub-distributions (SQS; §3.1, Appendix C and D.2 of the paper) on the nested
Bayesian network: joint pruning and low-bit per-tensor codebooks with Bayesian averaging.

Every conv/linear weight tensor gets a spike-and-GMM variational posterior (eq. 6):

    q(w_i) = lambda_i sum_k phi_k(theta_i) N(mu_k, sigma_k^2) + (1 - lambda_i) delta_0,

with the components living in *windows* of the tensor's initial weight range (App. C), a latent
theta_i per weight, responsibilities as in DGMS (which SQS builds on) computed in log space
``r = softmax_k(log pi_k + log N(theta_i | mu_k, sigma_k^2))`` over the weight's window and
sharpened to ``phi = softmax(r / tau)`` (eq. 2), and a keep probability
``lambda_i = sigmoid(s_i / tau')`` (eq. 33). Training minimises eq. 8 per sample:

    CE at the mean weight lambda_i sum_k mu_k phi_k
    + (1/N) [sum_i KL(Bern(lambda_i) || Bern(lambda_t)) + sum_i lambda_i KL(N(mu_k*, s_k*^2) || N(0, s_0^2))]

where the prior keep probability lambda_t follows a polynomial schedule from 1 down to the
target non-zero rate (we move the *prior*, as the spike-and-slab formulation suggests; the hard
top-k prune happens once, at the end). Inference prunes deterministically to exactly
floor(nonzero * T) weights ranked by s_i, then either takes the arg-max component (greedy,
eq. 34) or averages M networks whose weights are drawn from the categorical posterior (eq. 9-10),
so every sampled network is itself sparse and quantized.

Biases and batch norm stay float. ``sqs_(model, SQSConfig(...), data)`` quantizes in place.
"""
from __future__ import annotations

import contextlib
import copy
import math
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn.utils import parametrize

from edge_sdk.answers import metrics as M
from edge_sdk.errors import ConfigError
from trainer.config import Config, SQSConfig, validate
from trainer.data import DataSplits, subset
from trainer.evaluate import batches, predict_probs, recollect_bn
from trainer.layers import BayesNestedLayer
from trainer.models import NestedModel
from trainer.quantize.sqs_posterior import SQSTensor
from trainer.device import model_device
from trainer.regime import regime_step
from trainer.train import ordering_regularizer

__all__ = ["SQSConfig", "SQSResult", "compression_rate", "prune_mask", "sqs_"]


# ------------------------------------------------------------------------- inference rules
def prune_mask(scores: list[torch.Tensor], nonzero: float, scope: str = "global"
               ) -> list[torch.Tensor]:
    """Keep exactly floor(nonzero * T) weights with the largest s_i (ties: lower index first),
    over the whole network (``global``) or floor(nonzero * n) within each tensor (``layer``).
    Ranking by s rather than lambda: lambda = sigmoid(s / tau') saturates at 1.0 in fp32."""
    def top(flat: torch.Tensor, keep: int) -> torch.Tensor:
        order = torch.sort(-flat.double(), stable=True).indices  # stable: ties by index
        mask = torch.zeros(len(flat), dtype=torch.bool, device=flat.device)
        mask[order[:keep]] = True
        return mask

    if scope == "layer":
        return [top(s.detach().flatten(), _floor(nonzero * s.numel())) for s in scores]
    if scope != "global":
        raise ConfigError(f"prune_scope must be global or layer, got {scope!r}")
    flat = torch.cat([s.detach().flatten() for s in scores])
    mask = top(flat, _floor(nonzero * len(flat)))
    return list(torch.split(mask, [s.numel() for s in scores]))


def _floor(x: float) -> int:
    """floor() that reads 0.29 * 100 = 28.999999999999996 as the 29 the user meant."""
    return math.floor(x + 1e-9)


def compression_rate(bits: int, nonzero: float) -> float:
    """The paper's rate, eq. 14: 32 / Bits x 1 / Non-zero (Bits = log2 K)."""
    return 32.0 / bits / nonzero


# ------------------------------------------------------------------------------- the verb
@dataclass
class SQSResult:
    before: dict
    greedy: dict
    bayes: dict
    rate: float
    bits_per_weight: float
    packed_bytes: int
    nonzero_kept: int
    total_weights: int
    uncertain_fraction: dict
    posterior: dict = field(default_factory=dict)
    per_tensor: dict = field(default_factory=dict)


def _layers(model: NestedModel) -> list[tuple[str, BayesNestedLayer]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, BayesNestedLayer)]


def _evaluate(model: NestedModel, calib: list, test: list, widths, weight_sets: list[dict]
              ) -> dict[float, dict[str, float]]:
    """Average the predictions of networks given as {layer name: weight tensor}; each network's
    BN statistics are re-collected at each width with its own weights (what an exported sampled
    slice runs). One set = the point network."""
    work = copy.deepcopy(model)  # BN re-collection must not touch the model's own statistics
    layers = dict(_layers(work))
    results = {}
    for w in widths:
        probs = []
        for ws in weight_sets:
            with torch.no_grad():
                for n, t in ws.items():
                    layers[n].weight_mu.copy_(t)
            recollect_bn(work, calib, w)
            p, labels = predict_probs(work, test, w)
            probs.append(p[0])
        stack = np.stack(probs)
        row = M.summarize(stack.mean(0), labels)
        if len(weight_sets) > 1:
            row["mutual_info"] = float(M.mutual_information(stack).mean())
        results[float(w)] = {k: float(v) for k, v in row.items()}
    return results


def sqs_(model: NestedModel, cfg: SQSConfig, data: DataSplits, train_config: Config | None = None,
         *, progress: bool = True, log=print) -> SQSResult:
    """Quantize ``model`` in place with SQS; returns metrics and the checkpoint posterior."""
    cfg = validate(cfg, "quantize.sqs")
    train_config = train_config or Config()
    widths = train_config.train.eval_widths
    calib = batches(data.train, train_config.data.calib_samples, train_config.seed)
    test = batches(data.test)
    layers = _layers(model)
    before = _evaluate(model, calib, test, widths, [{n: l.weight_mu.detach().clone() for n, l in layers}])

    model.set_weight_kl(None)  # the Gaussian posterior's KL is replaced by eq. 8's terms
    post = {}
    for name, layer in layers:
        post[name] = SQSTensor(layer.weight_mu, cfg)
        parametrize.register_parametrization(layer, "weight_mu", post[name])
    try:
        _train(model, post, layers, cfg, data, train_config, progress)
        thetas = {n: l.parametrizations.weight_mu.original.detach().clone() for n, l in layers}
    finally:
        for _, layer in layers:
            parametrize.remove_parametrizations(layer, "weight_mu", leave_parametrized=True)
    return _finalise(model, post, thetas, layers, cfg, calib, test, widths, before)


def fine_tuning_set(train, size: int | None, seed: int):
    """The training split, or a seeded random ``size`` of it (``SQSConfig.subset``)."""
    if size is None or size >= len(train):
        return train
    return subset(train, np.random.default_rng(seed).permutation(len(train))[:size])


def _train(model, post, layers, cfg: SQSConfig, data: DataSplits, train_config: Config,
           progress: bool) -> None:
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(train_config.seed)
    train_set = fine_tuning_set(data.train, cfg.subset, train_config.seed)
    loader = torch.utils.data.DataLoader(train_set, batch_size=train_config.train.batch_size,
                                         shuffle=True, generator=gen,
                                         drop_last=len(train_set) > train_config.train.batch_size)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    total = cfg.epochs * len(loader)
    n = len(train_set)  # the KL per fine-tuning sample (as with a subset split)
    model.set_tau(train_config.ordering.tau_end, hard=train_config.ordering.hard)
    model.set_mask_scope(train_config.ordering.mask_scope)
    device = model_device(model)
    step = 0
    bar = tqdm(total=total, desc="SQS", disable=None if progress else True, file=sys.stderr)
    with model.weight_mode("mean"):  # eq. 8: the data term at the mean weight
        for _ in range(cfg.epochs):
            model.train()
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                frac = step / max(total - 1, 1)
                prior_keep = cfg.nonzero + (1 - cfg.nonzero) * (1 - frac) ** cfg.schedule_power
                tau_prune = cfg.tau_prune if step < total // 2 else cfg.tau_prune / 2
                for name, _ in layers:
                    post[name].tau_prune = tau_prune

                opt.zero_grad(set_to_none=True)
                with step_parametrization(post, layers) as k_stars:
                    def reg(prior_keep=prior_keep) -> torch.Tensor:
                        kl = sum(post[name].kl(layer.parametrizations.weight_mu.original,
                                               prior_keep, cfg.prior_sigma, k_stars[name])
                                 for name, layer in layers)
                        return kl / n + ordering_regularizer(model, train_config, n)

                    # the training regime's passes (sandwich, mask scope, coupling)
                    logits = regime_step(model, model, x, y, train_config, noise=False,
                                         regularizer=reg).logits
                opt.step()
                step += 1
                bar.update()
                if step % 10 == 0:
                    sparsity = _expected_sparsity(post)
                    acc = (logits.argmax(1) == y).float().mean().item()
                    bar.set_postfix(prior=f"{prior_keep:.3f}", E_nonzero=f"{sparsity:.3f}",
                                    acc=f"{acc:.3f}", refresh=False)
    bar.close()


@contextlib.contextmanager
def step_parametrization(post: dict, layers):
    """Evaluate every tensor's parametrization once for a training step's several passes.

    The sandwich regime runs 3-4 forward/backward passes per step, each of which would
    re-evaluate phi over [weights x K] (nested_vgg at width_mult 0.5: 2.4 M x 16, ~5 s forward
    and backward on one core, ~10x a pass). Inside the block each layer's ``weight_mu`` is a
    detached leaf holding the mean weight; the passes accumulate their gradients on it, and
    leaving the block back-propagates the sum once through phi to theta and the GMM: the same
    gradient as re-evaluating per pass (up to summation order). Yields {name: k*} for the KL.
    """
    graphs, k_stars = [], {}
    for name, layer in layers:
        w, k_stars[name] = post[name].mean_and_mode(layer.parametrizations.weight_mu.original)
        post[name].step_weight = w.detach().requires_grad_()
        graphs.append((w, post[name].step_weight))
    try:
        yield k_stars
        live = [(w, leaf.grad) for w, leaf in graphs if leaf.grad is not None]
        if live:
            torch.autograd.backward([w for w, _ in live], [g for _, g in live])
    finally:
        for name, _ in layers:
            post[name].step_weight = None


def _expected_sparsity(post: dict) -> float:
    with torch.no_grad():
        kept = sum(float(t.keep_probability().sum()) for t in post.values())
        return kept / sum(t.s.numel() for t in post.values())


@torch.no_grad()
def _finalise(model, post, thetas, layers, cfg: SQSConfig, calib, test, widths, before
              ) -> SQSResult:
    names = [n for n, _ in layers]
    masks = dict(zip(names, prune_mask([post[n].s for n in names], cfg.nonzero, cfg.prune_scope)))
    greedy, tensors, per_tensor = {}, {}, {}
    uncertain = {"tau": 0, f"sample_tau={cfg.sample_tau:g}": 0}
    packed, real_bits_sum, total = 0, 0.0, 0
    for name in names:
        t, theta, mask = post[name], thetas[name], masks[name]
        log_r = torch.log(t.responsibilities(theta).clamp_min(1e-30))
        k_star = t.phi(theta).argmax(-1)  # greedy, eq. 34
        codebook = t.mu.detach()  # [windows, K]; invalid slots unused
        w = torch.where(mask, codebook[t.window, k_star], torch.zeros((), device=codebook.device))
        greedy[name] = w.view(t.shape)
        uncertain["tau"] += int(((t.phi(theta).max(-1).values < 0.99) & mask).sum())
        uncertain[f"sample_tau={cfg.sample_tau:g}"] += int(
            ((t.phi(theta, cfg.sample_tau).max(-1).values < 0.99) & mask).sum())
        distinct = int(t.valid.sum())  # every window's components: up to 4K values (+ zero)
        bits = math.ceil(math.log2(distinct)) if distinct > 1 else 1
        n_keep = int(mask.sum())
        nbytes = math.ceil(mask.numel() / 8) + math.ceil(n_keep * bits / 8) + 4 * distinct
        packed += nbytes
        real_bits_sum += bits * mask.numel()
        total += mask.numel()
        per_tensor[name] = {"windows": len(t.bounds), "components": distinct, "index_bits": bits,
                            "nonzero": n_keep, "numel": mask.numel(), "packed_bytes": nbytes}
        tensors[name] = {
            "codebook": codebook.clone(), "valid": t.valid.clone(),
            "window": t.window.to(torch.uint8).view(t.shape).clone(),
            "index": k_star.to(torch.uint8).view(t.shape).clone(),
            "mask": mask.view(t.shape).clone(),
            # compact form: log-responsibilities of the surviving weights only, fp16
            # (n_keep x K x 2 bytes); pruned weights never sample
            "log_resp": log_r[mask].to(torch.float16).clone(),
        }
    layer_by_name = dict(layers)
    for name in names:
        layer_by_name[name].weight_mu.copy_(greedy[name])
    gen = torch.Generator().manual_seed(0)
    samples = [sample_weights(post, thetas, masks, cfg.sample_tau, gen) for _ in range(cfg.samples)]
    greedy_res = _evaluate(model, calib, test, widths, [greedy])
    bayes_res = _evaluate(model, calib, test, widths, samples) if samples else {}
    kept = sum(int(m.sum()) for m in masks.values())
    resp_bytes = sum(t["log_resp"].numel() * 2 for t in tensors.values())
    posterior = {"kind": "sqs", "version": cfg.version, "bits": cfg.bits, "nonzero": cfg.nonzero,
                 "tau": cfg.tau, "sample_tau": cfg.sample_tau, "tensors": tensors,
                 "packed_bytes": packed, "log_resp_bytes": resp_bytes}
    return SQSResult(before=before, greedy=greedy_res, bayes=bayes_res,
                     rate=compression_rate(cfg.bits, cfg.nonzero),
                     bits_per_weight=real_bits_sum / total, packed_bytes=packed,
                     nonzero_kept=kept, total_weights=total,
                     uncertain_fraction={k: v / max(kept, 1) for k, v in uncertain.items()},
                     posterior=posterior, per_tensor=per_tensor)


def sample_weights(post: dict, thetas: dict, masks: dict, sample_tau: float,
                   generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One network from eq. 9: each surviving weight takes mu_k with probability phi_k at
    ``sample_tau``; pruned weights are 0. Every sample stays on the codebook."""
    out = {}
    for name, t in post.items():
        # drawn on the host with the host generator (reproducible on any device), then moved
        phi = t.phi(thetas[name], sample_tau).detach().cpu()
        k = torch.multinomial(phi, 1, generator=generator).squeeze(1).to(t.mu.device)
        w = t.mu.detach()[t.window, k]
        out[name] = torch.where(masks[name], w, torch.zeros((), device=w.device)).view(t.shape)
    return out


def sample_from_posterior(posterior: dict, sample_tau: float, generator: torch.Generator
                          ) -> dict[str, torch.Tensor]:
    """eq. 9 from a checkpoint's SQS posterior (codebook, windows, mask, fp16 log-responsibilities)
    at any sampling temperature: what an exporter needs, without the training-time modules."""
    out = {}
    for name, t in posterior["tensors"].items():
        mask = t["mask"].flatten()
        window = t["window"].flatten().long()[mask]
        valid = t["valid"][window]
        r = t["log_resp"].float().exp() / sample_tau
        phi = torch.softmax(r.masked_fill(~valid, -math.inf), -1)
        k = torch.multinomial(phi, 1, generator=generator).squeeze(1)
        w = torch.zeros(mask.shape, device=mask.device)
        w[mask] = t["codebook"][window, k]
        out[name] = w.view(t["mask"].shape)
    return out
