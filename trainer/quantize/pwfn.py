"""Probabilistic Weight Fixing (PWFN; Subia-Waud & Dasmahapatra, §3 and Algorithm 1 of the appendix)
on the nested Bayesian network.

T rounds; in round t enough free weights are *fixed* that a fraction p_t of all weights sits
exactly on one whole-network codebook of additive powers of two, then the free weights retrain
for E epochs under the large-sigma regulariser (eq. 2-3). Distances are in sigmas,
``D_prob(w_i, c) = |mu_i - c| / sigma_i`` (eq. 6), so a weight the network tolerates noise on
moves further. Every fixed weight keeps an uncertainty: the population std of the means that
moved to its centre together, so posterior sampling still works after quantization.

Everything runs on flat tensors holding every quantized entry of the network at once (no
per-weight Python loop): one search costs a ``searchsorted`` and a sort over the free weights.

``fix_weights_(model, PWFNConfig(...), data)`` quantizes a model in place.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from edge_sdk.errors import ConfigError
from edge_sdk.metrics import weight_entropy_bits  # one definition, shared with the exporter
from trainer.config import Config, PWFNConfig, validate
from trainer.data import DataSplits
from trainer.evaluate import batches, evaluate_widths
from trainer.layers import BayesNestedLayer, _inverse_softplus
from trainer.models import NestedModel
from trainer.device import model_device
from trainer.regime import regime_step
from trainer.train import ordering_regularizer

__all__ = ["PWFNConfig", "PWFNResult", "candidate_centres", "cluster_round", "fix_weights_",
           "pow2_sigma", "weight_entropy_bits"]

_MIN_SIGMA = 1e-12  # D_prob's denominator floor: a fixed singleton has sigma exactly 0


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
    mu64, sig = mu.double(), sigma.double().clamp_min(_MIN_SIGMA)
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
                rho = _inverse_softplus(s.clamp_min(_MIN_SIGMA).double()).float()
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
                    rho = _inverse_softplus(self.sigma[sl].clamp_min(_MIN_SIGMA).double()).float()
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
