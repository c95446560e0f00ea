"""Training loop for the Bayesian nested network (BN³ §3, eq. 7–8).

Loss per mini-batch (the negative ELBO divided by N, with BN³ App. 9.1's kappa):

    mean cross-entropy + (kappa / N) * (ordering KL + keep-probability-weighted weight KL)

With ``ordering.regularizer: l0`` the ordering KL is replaced (never joined) by the ordered-l0
term ``l0_lambda * sum_j j beta_j`` (eq. 16), the deterministic special case.

Runs as one process or under ``torchrun --nproc_per_node=N`` (gloo on CPU): DDP, a
DistributedSampler, logging, evaluation and checkpoints on rank 0 only.
"""
from __future__ import annotations

import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from edge_sdk.errors import CheckpointError
from trainer import checkpoint as ckpt_io
from trainer.config import Config, config_to_dict
from trainer.data import DataSplits, load_data
from trainer.device import channels_last_, ddp_backend, resolve_device
from trainer.evaluate import batches, evaluate_widths, format_table
from trainer.layers import gaussian_kl, log_uniform_kl
from trainer.models import NestedModel, create_model
from trainer.models.factory import is_factory_path
from trainer.ordering import rescale_of, tau_schedule
from trainer.regime import regime_step

CHECKPOINT_NAME = "checkpoint.pt"


@dataclass
class TrainResult:
    checkpoint: Path
    model: NestedModel
    val: dict  # per-width metrics (rank 0 only; empty on other ranks)
    test: dict
    seconds: float


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(cfg: Config, data: DataSplits) -> NestedModel:
    """The registry model for this config and data (classes, channels and size from the spec)."""
    _, h, _, c = data.spec.shape
    kwargs = dict(num_classes=len(data.spec.classes), in_channels=c, input_size=h,
                  width_mult=cfg.model.width_mult, groups=cfg.model.groups,
                  frozen=cfg.model.frozen, prior_pi=cfg.ordering.prior_pi,
                  init_mubar=cfg.ordering.init_mubar, log_alpha_init=cfg.bayes.log_alpha_init)
    kwargs.update(cfg.model.kwargs)
    if cfg.model.weights is not None:  # a pretrained start, loaded before nesting
        kwargs["weights"] = cfg.model.weights
    model = create_model(cfg.model.name, **kwargs)
    if cfg.model.init == "torch" and not is_factory_path(cfg.model.name) and not cfg.model.weights:
        for layer in model.bayes_layers():
            layer.reset_torch_default(cfg.bayes.log_alpha_init)
    apply_weight_prior(model, cfg)
    model.set_rescale(rescale_of(config_to_dict(cfg)))
    for w in cfg.train.eval_widths:
        model.check_width(w)
    return model


def apply_weight_prior(model: NestedModel, cfg: Config) -> None:
    prior = cfg.bayes.prior
    model.set_weight_kl({"log_uniform": log_uniform_kl, "none": None}.get(prior)
                        if prior != "gaussian" else gaussian_kl(cfg.bayes.prior_sigma))


def ordering_regularizer(model: NestedModel, cfg: Config, n_train: int) -> torch.Tensor:
    """The ordering units' term, per training sample: (kappa / N) KL, or the ordered-l0
    alternative (eq. 16) in its place. The quantizers keep training the units with it."""
    if cfg.ordering.regularizer == "kl":
        return cfg.bayes.kappa / n_train * model.ordering_kl()
    return cfg.ordering.l0_lambda * model.ordered_l0()


def regularizer(model: NestedModel, cfg: Config, n_train: int) -> torch.Tensor:
    """Everything in the loss except the data term, already scaled per training sample."""
    return cfg.bayes.kappa / n_train * model.weight_kl() + ordering_regularizer(model, cfg, n_train)


def _loader(ds, batch_size: int, shuffle: bool, seed: int, sampler=None, workers: int = 0):
    g = torch.Generator().manual_seed(seed)
    # workers kept across epochs: a photo folder's decoders would otherwise re-fork each epoch
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle and sampler is None,
                      sampler=sampler, generator=g, num_workers=workers,
                      persistent_workers=workers > 0,
                      drop_last=shuffle and len(ds) > batch_size)  # no 1-sample BN batches


def _scheduler(opt: torch.optim.Optimizer, cfg: Config, total_steps: int, steps_per_epoch: int):
    t = cfg.train
    if t.schedule == "cosine":
        return torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    if t.schedule == "onecycle":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: onecycle(s, total_steps,
                                                                          t.warmup_fraction))
    if t.schedule == "step":
        return torch.optim.lr_scheduler.StepLR(opt, t.step_size * steps_per_epoch, t.gamma)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def onecycle(step: int, total: int, warmup: float, div: float = 25.0,
             final_div: float = 1e4) -> float:
    """The lr factor of OneCycleLR's two cosine phases (torch defaults: start at 1/div, peak 1
    after ``warmup`` of the steps, end at 1/(div * final_div)); momentum is not cycled."""
    peak = max(1.0, warmup * total)
    lo, end = 1.0 / div, 1.0 / (div * final_div)
    if step < peak:
        return lo + (1.0 - lo) * 0.5 * (1 - math.cos(math.pi * step / peak))
    frac = min(1.0, (step - peak) / max(1.0, total - peak))
    return end + (1.0 - end) * 0.5 * (1 + math.cos(math.pi * frac))


def param_groups(model: NestedModel, cfg: Config) -> list[dict]:
    """Optimizer groups: with ``train.decay_scope: weights`` only the weight means decay (not
    weight_rho, whose decay would shrink sigma toward softplus(0); not the ordering logits, whose
    decay pulls every keep probability toward 0.5; not biases or batch norm)."""
    if cfg.train.decay_scope == "all":
        return [{"params": list(model.parameters()), "weight_decay": cfg.train.weight_decay}]
    decay, rest = [], []
    for name, p in model.named_parameters():
        # weight means, and the weight matrices of a plain network (the benchmarks' baselines
        # share this recipe); never 1-D parameters (biases, batch norm) or weight_rho
        is_weight = name.endswith("weight_mu") or (name.endswith("weight") and p.ndim > 1)
        (decay if is_weight else rest).append(p)
    return [{"params": decay, "weight_decay": cfg.train.weight_decay},
            {"params": rest, "weight_decay": 0.0}]


def _optimizer(model: NestedModel, cfg: Config) -> torch.optim.Optimizer:
    t = cfg.train
    groups = param_groups(model, cfg)
    if t.optimizer == "adam":
        return torch.optim.Adam(groups, lr=t.lr)
    return torch.optim.SGD(groups, lr=t.lr, momentum=t.momentum, nesterov=t.momentum > 0)


def noise_epoch(cfg: Config) -> int:
    """The first epoch of the variational phase (``epochs`` = never: deterministic)."""
    return round(cfg.bayes.noise_start * cfg.train.epochs)


def nested_epoch(cfg: Config) -> int:
    """The first epoch of the nested regime (before it, the full width trains alone)."""
    return round(cfg.train.nested_start * cfg.train.epochs)


def start_variational_phase(model: NestedModel, cfg: Config) -> None:
    """Re-initialise every sigma from the current means (alpha = exp(log_alpha_init))."""
    for layer in model.bayes_layers():
        layer.reset_sigma(cfg.bayes.log_alpha_init)


def _dist_info(device: torch.device) -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(ddp_backend(device))
    return (dist.get_rank(), world) if world > 1 else (0, 1)


def train(cfg: Config, out_dir: str | os.PathLike | None = None, resume: bool = False,
          progress: bool = True, log=print) -> TrainResult:
    """Train ``cfg`` and write ``<out_dir>/checkpoint.pt`` (every epoch, atomically)."""
    started = time.perf_counter()
    device = resolve_device(cfg.train.device)
    rank, world = _dist_info(device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed_everything(cfg.seed + rank)
    out = Path(out_dir or Path("runs") / cfg.name)
    path = out / CHECKPOINT_NAME
    data = load_data(cfg.data)
    # Same initial weights on every rank: build the model from the shared seed.
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, data).to(device)
    # NHWC weights too when no pass ever samples weight noise (the shipped recipes): a grey
    # (N, 1, H, W) batch is contiguous in both layouts, so only NHWC weights make its passes
    # NHWC; handed back in the standard layout at the end (the quantizers' noisy passes)
    nhwc_weights = cfg.train.channels_last and noise_epoch(cfg) >= cfg.train.epochs
    channels_last_(model, nhwc_weights)
    opt = _optimizer(model, cfg)
    n_train = len(data.train)
    sampler = DistributedSampler(data.train, world, rank, shuffle=True, seed=cfg.seed,
                                 drop_last=True) if world > 1 else None
    train_loader = _loader(data.train, cfg.train.batch_size, True, cfg.seed, sampler,
                           cfg.train.num_workers)
    shuffle_gen = train_loader.generator
    calib = batches(data.train, cfg.data.calib_samples, cfg.seed, batch=256)
    val = batches(data.val)
    steps_per_epoch = len(train_loader)
    total_steps = steps_per_epoch * cfg.train.epochs
    sched = _scheduler(opt, cfg, total_steps, steps_per_epoch)

    start_epoch, history, train_state, last_val = 0, [], None, None
    if resume and path.is_file():
        state = ckpt_io.load_checkpoint(path)
        if state["arch"] != model.arch:
            raise CheckpointError(f"cannot resume from {path}: it holds {state['arch']}, the "
                                  f"config builds {model.arch}")
        model.load_state_dict(state["state_dict"])  # copies CPU tensors onto the device
        ts = state.get("train_state") or {}
        if ts.get("epoch") is None:
            raise CheckpointError(f"cannot resume from {path}: it has no training state "
                                  "(is it a quantized checkpoint?)")
        opt.load_state_dict(ts["optimizer"])
        sched.load_state_dict(ts["scheduler"])
        start_epoch, history = ts["epoch"] + 1, list(ts.get("history", []))
        torch.set_rng_state(ts["rng"])
        if rank == 0:
            log(f"resumed from {path} at epoch {start_epoch}")

    model.set_mask_scope(cfg.ordering.mask_scope)
    net = model
    if world > 1:
        # Fixed-width passes (the sandwich rule's, the full-width warm-up's) leave the ordering
        # logits without a gradient.
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=cfg.train.sandwich or cfg.train.nested_start > 0)
    if rank == 0 and data.note:
        log(data.note)
    if rank == 0:
        log(f"training {model.arch['name']} on {data.source}: {n_train} train / {len(data.val)} "
            f"val / {len(data.test)} test samples, {cfg.train.epochs} epochs, world size {world}, "
            f"device {device}")

    from tqdm import tqdm
    step = start_epoch * steps_per_epoch
    first_noisy = noise_epoch(cfg)
    first_nested = nested_epoch(cfg)
    for epoch in range(start_epoch, cfg.train.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        noise = epoch >= first_noisy
        if epoch == first_noisy and first_noisy > 0:
            start_variational_phase(model, cfg)
            if rank == 0:
                log(f"epoch {epoch + 1}: variational phase starts (sigma re-initialised)")
        reg_fn = ((lambda: regularizer(model, cfg, n_train)) if noise
                  else (lambda: ordering_regularizer(model, cfg, n_train)))
        # Seeded per epoch, so a resumed run shuffles exactly as an uninterrupted one.
        shuffle_gen.manual_seed(cfg.seed * 100_003 + epoch)
        net.train()
        epoch_started = time.perf_counter()
        seen = correct = 0
        loss_sum = 0.0
        # disable=None: tqdm turns itself off when stderr is not a terminal (CI logs, pipes)
        bar = tqdm(train_loader, desc=f"epoch {epoch + 1}/{cfg.train.epochs}", leave=False,
                   disable=True if not progress or rank != 0 else None, file=sys.stderr)
        for x, y in bar:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            model.set_tau(tau_schedule(step, total_steps, cfg.ordering.tau_start,
                                       cfg.ordering.tau_end), hard=cfg.ordering.hard)
            opt.zero_grad(set_to_none=True)
            # the config's regime (the quantizers' fine-tuning runs the same one)
            out = regime_step(net, model, x, y, cfg, noise=noise, regularizer=reg_fn,
                              nested=epoch >= first_nested)
            logits = out.logits
            if cfg.train.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
            opt.step()
            sched.step()
            step += 1
            seen += len(y)
            correct += int((logits.argmax(1) == y).sum())
            loss_sum += out.loss * len(y)
            bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc=f"{correct / seen:.3f}")
        if rank == 0:
            row = {"epoch": epoch + 1, "loss": loss_sum / seen, "train_acc": correct / seen,
                   "seconds": time.perf_counter() - epoch_started}
            last = epoch + 1 == cfg.train.epochs
            if (epoch + 1) % cfg.train.eval_every == 0 or last:
                res = evaluate_widths(model, calib, val, cfg.train.eval_widths)
                row["val"] = _keyed(res)
                if last:
                    last_val = res  # the final validation figures: not evaluated twice
                log(f"epoch {epoch + 1}: loss {row['loss']:.4f} train acc {row['train_acc']:.4f} "
                    + " ".join(f"| w={w:g} acc {r['accuracy']:.4f} nll {r['nll']:.4f} "
                               f"ece {r['ece']:.4f}" for w, r in res.items()))
            history.append(row)
            train_state = {"epoch": epoch, "optimizer": opt.state_dict(),
                           "scheduler": sched.state_dict(), "rng": torch.get_rng_state(),
                           "history": history}
            ckpt_io.save_checkpoint(_checkpoint(model, cfg, data, {"history": history},
                                                train_state), path)
        if world > 1:
            dist.barrier()

    if first_noisy >= cfg.train.epochs and start_epoch < cfg.train.epochs:
        # Never variational: sigma = |mu| exp(log_alpha_init / 2) around the final means, so the
        # posterior the quantizers and the exporter sample is centred where training ended.
        start_variational_phase(model, cfg)
    result_val = result_test = {}
    if rank == 0:
        # the variational phase's sigma does not change the posterior mean evaluated here
        result_val = last_val or evaluate_widths(model, calib, val, cfg.train.eval_widths)
        result_test = evaluate_widths(model, calib, batches(data.test),
                                      cfg.train.eval_widths)
        metrics = {"history": history, "val": _keyed(result_val), "test": _keyed(result_test),
                   "train_seconds": time.perf_counter() - started}
        # Keeps the optimizer state, so `--resume` with more epochs continues a finished run.
        ckpt_io.save_checkpoint(_checkpoint(model, cfg, data, metrics, train_state), path)
        log(format_table(result_test, "test split (BN re-collected per width, posterior mean):"))
    if world > 1:
        dist.barrier()
    model.to(memory_format=torch.contiguous_format)
    return TrainResult(path, model, result_val, result_test, time.perf_counter() - started)


def _keyed(res: dict[float, dict]) -> dict[str, dict]:
    return {f"{w:g}": row for w, row in res.items()}


def _checkpoint(model: NestedModel, cfg: Config, data: DataSplits, metrics: dict,
                train_state: dict | None) -> dict:
    return ckpt_io.build_checkpoint(model, input_spec=data.spec.to_dict(),
                                    config=config_to_dict(cfg), split_seed=data.split_seed,
                                    metrics=metrics, train_state=train_state)

