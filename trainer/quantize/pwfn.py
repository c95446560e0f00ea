"""Probabilistic Weight Fixing (PWFN; Subia-Waud & Dasmahapatra, §3 and Algorithm 1 of the appendix)
on the nested Bayesian network.

T rounds; in round t enough free weights are *fixed* that a fraction p_t of all weights sits
exactly on one whole-network codebook of additive powers of two, then the free weights retrain
for E epochs under the large-sigma regulariser (eq. 2-3). Distances are in sigmas,
``D_prob(w_i, c) = |mu_i - c| / sigma_i`` (eq. 6), so a weight the network tolerates noise on
moves further. Every fixed weight keeps an uncertainty: the population std of the means that
moved to its centre together, so posterior sampling still works after quantization.

Everything runs on flat tensors holding every quantized entry of the network at once (no
per-weight Python loop): one search costs a ``searchsorted`` and a sort over the free weights
(the centres, sigma init and clustering: :mod:`trainer.quantize.pwfn_cluster`).

``fix_weights_(model, PWFNConfig(...), data)`` quantizes a model in place.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from edge_sdk.answers.metrics import weight_entropy_bits  # one definition, shared with the exporter
from trainer.config import Config, PWFNConfig, validate
from trainer.data import DataSplits
from trainer.evaluate import batches, evaluate_widths
from trainer.layers import BayesNestedLayer, _inverse_softplus
from trainer.models import NestedModel
from trainer.device import model_device
from trainer.quantize.pwfn_cluster import MIN_SIGMA, candidate_centres, cluster_round, pow2_sigma
from trainer.regime import regime_step
from trainer.train import ordering_regularizer

__all__ = ["PWFNConfig", "PWFNResult", "candidate_centres", "cluster_round", "fix_weights_",
           "pow2_sigma", "weight_entropy_bits"]


# ------------------------------------------------------------------------ network plumbing
@dataclass
class _Entry:
    """One quantized tensor: a layer's weight (Bayesian: mu, rho) or bias (point value)."""
    name: str
    layer: BayesNestedLayer
    kind: str  # "weight" | "bias"
    offset: int
    numel: int

    @property
    def mu(self) -> torch.nn.Parameter:
        return self.layer.weight_mu if self.kind == "weight" else self.layer.bias

    def sigma(self) -> torch.Tensor:
        return self.layer.weight_sigma.detach()

    def sigma_or_mu(self) -> torch.Tensor:
        """The weight's sigma; for a bias (which has none) a placeholder of the right size."""
        return self.sigma() if self.kind == "weight" else self.mu


def _entries(model: NestedModel, include_bias: bool) -> list[_Entry]:
    out, offset = [], 0
    for lname, layer in model.named_modules():
        if not isinstance(layer, BayesNestedLayer):
            continue
        kinds = ["weight"] + (["bias"] if include_bias and layer.bias is not None else [])
        for kind in kinds:
            numel = (layer.weight_mu if kind == "weight" else layer.bias).numel()
            out.append(_Entry(f"{lname}.{kind}", layer, kind, offset, numel))
            offset += numel
    return out


def _flat(entries: list[_Entry], fn) -> torch.Tensor:
    """One flat host (CPU) vector over every entry: clustering is host-side bookkeeping, the
    parameters may live on any device."""
    return torch.cat([fn(e).detach().flatten().float().cpu() for e in entries])


def _initial_sigma(entries: list[_Entry], cfg: PWFNConfig) -> torch.Tensor:
    """Per-entry sigma used for D_prob. Biases have no posterior: they take the pow2 prior
    (or the uniform value in the ablation)."""
    parts = []
    for e in entries:
        mu = e.mu.detach().flatten().float().cpu()
        if cfg.sigma_init == "uniform":
            parts.append(torch.full_like(mu, cfg.uniform_sigma))
        elif cfg.sigma_init == "posterior" and e.kind == "weight":
            parts.append(e.sigma().detach().flatten().float().cpu())
        else:
            parts.append(pow2_sigma(mu))
    return torch.cat(parts)


def _set_weight_sigma_(entries: list[_Entry], sigma: torch.Tensor) -> None:
    with torch.no_grad():
        for e in entries:
            if e.kind == "weight":
                s = sigma[e.offset: e.offset + e.numel].view_as(e.layer.weight_rho)
                rho = _inverse_softplus(s.clamp_min(MIN_SIGMA).double()).float()
                e.layer.weight_rho.copy_(rho.to(e.layer.weight_rho.device))


# ------------------------------------------------------------------------------ the verb
@dataclass
class PWFNResult:
    codebook: list[float]
    unique_values: int
    entropy_bits: float
    per_tensor: dict[str, dict]
    rounds: list[dict]
    before: dict = field(default_factory=dict)
    after_point: dict = field(default_factory=dict)
    after_ensemble: dict = field(default_factory=dict)
    packed_bytes: int = 0
    posterior: dict = field(default_factory=dict)


class _FixedState:
    """Fixed entries: their codebook value and sigma, restored after every optimizer step, and
    gradient hooks that zero their gradients (so they cannot move)."""

    def __init__(self, entries: list[_Entry], total: int):
        self.entries = entries
        # host-side: the clustering reads and writes these; apply_ copies them to the device
        self.fixed = torch.zeros(total, dtype=torch.bool, device="cpu")
        self.value = torch.zeros(total, device="cpu")
        self.sigma = torch.zeros(total, device="cpu")
        self.hooks = []
        for e in entries:
            params = [e.mu] + ([e.layer.weight_rho] if e.kind == "weight" else [])
            for p in params:
                self.hooks.append(p.register_hook(self._mask_hook(e)))

    def _mask_hook(self, e: _Entry):
        def hook(grad: torch.Tensor) -> torch.Tensor:
            mask = self.fixed[e.offset: e.offset + e.numel].view_as(grad).to(grad.device)
            return grad.masked_fill(mask, 0.0)
        return hook

    def apply_(self) -> None:
        """Write fixed means (exact codebook values) and sigmas into the parameters."""
        with torch.no_grad():
            for e in self.entries:
                sl = slice(e.offset, e.offset + e.numel)
                dev = e.mu.device
                mask = self.fixed[sl].view_as(e.mu).to(dev)
                e.mu.copy_(torch.where(mask, self.value[sl].view_as(e.mu).to(dev), e.mu))
                if e.kind == "weight":
                    rho = _inverse_softplus(self.sigma[sl].clamp_min(MIN_SIGMA).double()).float()
                    e.layer.weight_rho.copy_(
                        torch.where(mask, rho.view_as(mask).to(dev), e.layer.weight_rho))

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


def _retrain(model: NestedModel, data: DataSplits, cfg: PWFNConfig, train_cfg: Config,
             state: _FixedState, epochs: int, generator: torch.Generator, bar) -> None:
    """E epochs on the free weights: CE + alpha sum (S - sigma)_+ + ordering KL (eq. 2-3).

    The Gaussian/log-uniform weight KL is off: it would fight the large-sigma regulariser.
    A fresh optimizer each round: fixed entries carry no stale Adam moments.
    """
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loader = torch.utils.data.DataLoader(data.train, batch_size=train_cfg.train.batch_size,
                                         shuffle=True, generator=generator,
                                         drop_last=len(data.train) > train_cfg.train.batch_size)
    n_train = len(data.train)
    model.set_tau(train_cfg.ordering.tau_end, hard=train_cfg.ordering.hard)
    model.set_mask_scope(train_cfg.ordering.mask_scope)
    device = model_device(model)
    weights = [e for e in state.entries if e.kind == "weight"]

    def reg() -> torch.Tensor:
        sig_reg = sum(F.relu(cfg.sigma_target - e.layer.weight_sigma).sum() for e in weights)
        return cfg.alpha * sig_reg + ordering_regularizer(model, train_cfg, n_train)

    for _ in range(epochs):
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            # the training regime's passes (sandwich, mask scope, coupling), with weight noise
            out = regime_step(model, model, x, y, train_cfg, noise=True, regularizer=reg)
            opt.step()
            state.apply_()  # belt and braces: Adam cannot drift a fixed entry either way
            bar.set_postfix_str(f"loss {out.loss:.3f}", refresh=False)


def fix_weights_(model: NestedModel, cfg: PWFNConfig, data: DataSplits,
                 train_config: Config | None = None, *, progress: bool = True,
                 log=print) -> PWFNResult:
    """Quantize ``model`` in place with PWFN and return the codebook, posterior and metrics.

    ``train_config`` supplies the batch size, kappa, ordering regulariser and evaluation
    widths of the nested training (defaults when omitted).
    """
    from tqdm import tqdm

    cfg = validate(cfg, "quantize.pwfn")  # a config built in code gets the YAML's checks
    train_config = train_config or Config()
    widths = train_config.train.eval_widths
    calib = batches(data.train, train_config.data.calib_samples, train_config.seed)
    val = batches(data.val)
    test = batches(data.test)
    before = evaluate_widths(model, calib, test, widths)

    model.set_weight_kl(None)
    entries = _entries(model, cfg.include_bias)
    total = sum(e.numel for e in entries)
    mu_all = _flat(entries, lambda e: e.mu)
    init_sigma = _initial_sigma(entries, cfg)
    _set_weight_sigma_(entries, init_sigma)  # pow2/uniform replace the learned sigma as the start
    is_bias = torch.cat([torch.full((e.numel,), e.kind == "bias", device="cpu") for e in entries])
    centres, order = candidate_centres(float(mu_all.abs().max()), cfg.precision, cfg.max_order)
    state = _FixedState(entries, total)
    gen = torch.Generator().manual_seed(train_config.seed)
    rounds = []
    bar = tqdm(cfg.schedule, desc="PWFN", disable=None if progress else True,
               file=sys.stderr)
    try:
        for t, p in enumerate(bar):
            mu_all = _flat(entries, lambda e: e.mu)
            # weight sigmas are trained between rounds; bias sigmas keep their initial values
            sigma = torch.where(is_bias, init_sigma, _flat(entries, _Entry.sigma_or_mu))
            free = ~state.fixed
            # (the epsilon keeps 0.3 * 10 = 3.0000000000000004 from asking for 4)
            target = total if p >= 1.0 else math.ceil(p * total - 1e-9)
            value, gsig, stats = cluster_round(mu_all, sigma, free, target, centres, order,
                                               delta0=cfg.delta, max_order=cfg.max_order,
                                               rule=cfg.rule, assign=cfg.assign)
            new = ~torch.isnan(value)
            state.value[new], state.sigma[new], state.fixed[new] = value[new], gsig[new], True
            state.apply_()
            epoch_t0 = time.perf_counter()
            epochs = cfg.epochs_per_round if p < 1.0 else 0
            _retrain(model, data, cfg, train_config, state, epochs, gen, bar)
            epoch_seconds = (time.perf_counter() - epoch_t0) / max(epochs, 1)
            fixed_vals = state.value[state.fixed]
            acc = evaluate_widths(model, calib, val, [max(widths)])[float(max(widths))]["accuracy"]
            row = {"round": t + 1, "fraction": float(state.fixed.float().mean()),
                   "target": p, "unique": int(torch.unique(fixed_vals).numel()),
                   "searches": stats.searches, "escalations": stats.escalations,
                   "max_order": stats.max_order_used, "cluster_seconds": stats.seconds,
                   "epoch_seconds": epoch_seconds if epochs else None, "val_accuracy": acc}
            rounds.append(row)
            bar.set_postfix(fixed=f"{row['fraction']:.3f}", unique=row["unique"], acc=f"{acc:.3f}")
            if bar.disable:  # no bar (not a terminal, or asked for none): log the round
                log(f"PWFN round {t + 1}/{len(cfg.schedule)}: fixed {row['fraction']:.3f}, "
                    f"unique {row['unique']}, val acc {acc:.4f}, clustering {stats.seconds:.2f} s")
    finally:
        state.remove()
        bar.close()

    state.apply_()
    return _summarise(model, cfg, train_config, entries, state, rounds, before, calib, test)


def _summarise(model: NestedModel, cfg: PWFNConfig, train_config: Config,
               entries: list[_Entry], state: _FixedState, rounds: list[dict], before: dict,
               calib: list, test: list) -> PWFNResult:
    values = state.value
    codebook = torch.unique(values)
    index = torch.searchsorted(codebook, values)
    per_tensor, tensors = {}, {}
    for e in entries:
        sl = slice(e.offset, e.offset + e.numel)
        v = values[sl]
        per_tensor[e.name] = {"unique": int(torch.unique(v).numel()),
                              "entropy_bits": weight_entropy_bits(v.numpy())}
        tensors[e.name] = {"indices": index[sl].view_as(e.mu).to(torch.int32).clone(),
                           "sigma": state.sigma[sl].view_as(e.mu).clone()}
    k = len(codebook)
    sigma_table = torch.unique(state.sigma)
    bits_idx = max(1, math.ceil(math.log2(k))) if k > 1 else 1
    bits_sig = max(1, math.ceil(math.log2(len(sigma_table)))) if len(sigma_table) > 1 else 1
    n = len(values)
    packed = math.ceil(n * bits_idx / 8) + 4 * k + math.ceil(n * bits_sig / 8) + 4 * len(sigma_table)
    widths = train_config.train.eval_widths
    result = PWFNResult(
        codebook=codebook.tolist(), unique_values=k,
        entropy_bits=weight_entropy_bits(values.numpy()), per_tensor=per_tensor, rounds=rounds,
        before=before,
        after_point=evaluate_widths(model, calib, test, widths),
        after_ensemble=evaluate_widths(model, calib, test, widths, samples=cfg.samples),
        packed_bytes=packed)
    result.posterior = {
        "kind": "pwfn", "version": cfg.version, "codebook": codebook.clone(),
        "tensors": tensors, "packed_bytes": packed, "sigma_table_size": len(sigma_table),
        "index_bits": bits_idx, "sigma_index_bits": bits_sig,
        "unique_values": k, "entropy_bits": result.entropy_bits, "per_tensor": per_tensor,
        "rounds": rounds}
    return result
