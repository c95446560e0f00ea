"""Training configuration: YAML files -> validated dataclasses.

A config file states only what differs from the defaults below; every other key takes
the dataclass default. Constraints live next to each field as ``dataclasses.field``
metadata (:func:`_opt`), and ONE generic validator (:func:`validate`, in
:mod:`trainer.config_validate`, which lists the metadata keys it understands) walks the
dataclasses, so a new section (say ``quantize``) gets key, type and range checking just by
adding a dataclass-typed field to :class:`Config`. Reading files and applying ``a.b=value``
overrides: :mod:`trainer.config_overrides`.

A section dataclass may define ``_cross_check(self, path: str) -> None`` for checks that
involve several of its fields; it runs after the fields themselves are valid.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import yaml

from edge_sdk.errors import ConfigError
from trainer.config_overrides import (_apply_override, _parse_yaml, _read_config_text,
                                      list_builtin_configs)
from trainer.config_validate import _build, _join, _opt, _value_desc, validate

__all__ = [
    "BUILTIN_SOURCES",
    "PATH_SOURCES",
    "BayesConfig",
    "Config",
    "DataConfig",
    "ModelConfig",
    "OrderingConfig",
    "PWFNConfig",
    "QuantizeConfig",
    "SQSConfig",
    "TrainConfig",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "dump_config",
    "list_builtin_configs",
    "load_config",
    "validate",
]

# Named data sources, and sources that take a path after the prefix (see trainer.data).
BUILTIN_SOURCES = ("digits", "mnist", "fashion_mnist", "cifar10", "svhn")
PATH_SOURCES = ("npz:", "imagefolder:")


# --------------------------------------------------------------------------- sections


@dataclass
class DataConfig:
    # digits is bundled with scikit-learn: the only source that works offline on a fresh checkout
    source: str = _opt("digits", choices=BUILTIN_SOURCES, prefix_choices=PATH_SOURCES)
    # torchvision's download/cache directory, shared across projects of this user
    root: str = "~/.cache/edge-sdk/data"
    # never touch the network unless the user asks for it
    download: bool = False
    # enough validation samples to fit a temperature / threshold, most data left for training
    val_fraction: float = _opt(0.1, min=0.0, max=0.5, min_exclusive=True, max_exclusive=True)
    # only used when the source has no test split (digits, imagefolder)
    test_fraction: float = _opt(0.2, min=0.0, max=0.5, min_exclusive=True, max_exclusive=True)
    # the split is part of the checkpoint: same seed -> same untouched test set
    split_seed: int = _opt(0, min=0)
    # auto = crop_flip for 32x32 RGB (CIFAR/SVHN practice), random_resized_crop for photo
    # folders, none for small grey images; crop_flip: zero-padded crop + flip per image;
    # crop_flip_batch: one reflect-padded crop offset per batch, flip per image (the reference
    # networks' recipe; vectorised over the batch); random_resized_crop (photo folders only):
    # torchvision's RandomResizedCrop(image_size, scale=crop_scale) + flip of each decoded photo
    augment: str = _opt("auto", choices=("auto", "none", "crop_flip", "crop_flip_batch",
                                         "random_resized_crop"))
    # BN re-collection subset of the training split (BN3 App. 9.2): ~1k samples suffice
    calib_samples: int = _opt(1024, min=1)
    # imagefolder: the model's input side, pixels (required there; photos differ in size)
    image_size: int | None = _opt(None, min=1)
    # imagefolder evaluation: shorter side -> round(image_size / crop_fraction), centre crop;
    # 0.875 is the ImageNet evaluation's ratio (224 from 256), recorded in the bundle
    crop_fraction: float = _opt(0.875, min=0.0, max=1.0, min_exclusive=True)
    # imagefolder training: RandomResizedCrop's area range. 0.25, not ImageNet's 0.08: a small
    # model at 128 px learns little from crops of 8 % of a photo (a garment's button)
    crop_scale: list[float] = _opt(factory=lambda: [0.25, 1.0], min_len=2,
                                   items={"min": 0.0, "max": 1.0, "min_exclusive": True})
    # imagefolder normalisation, raw 0..255 units per channel: null = measured on a seeded
    # sample of stats_samples training photos (evaluation transform); give ImageNet's
    # (mean [123.675, 116.28, 103.53], std [58.395, 57.12, 57.375]) with ImageNet weights
    mean: list[float] | None = _opt(None, min_len=1)
    std: list[float] | None = _opt(None, min_len=1, items={"min": 0.0, "min_exclusive": True})
    # enough photos for the mean and std to four digits; a fixed sample, so a later export
    # re-measures the same numbers without a pass over the folder
    stats_samples: int = _opt(512, min=1)
    # imagefolder training: memmap = decode every training photo once, resized to the shorter
    # side of the evaluation transform, into one memory-mapped file under cache_dir that the
    # workers read (trainer/photo_cache.py: on 2 cores, JPEG decoding starved the steps)
    cache: str = _opt("none", choices=("none", "memmap"))
    cache_dir: str = "~/.cache/edge-sdk/photos"

    def _cross_check(self, path: str) -> None:
        folder = self.source.startswith("imagefolder:")
        if folder and self.image_size is None:
            raise ConfigError(
                f"{_join(path, 'image_size')} is required when {_join(path, 'source')} is "
                f"imagefolder:<path> (photos are resized and cropped to image_size x "
                f"image_size), got null")
        if len(self.crop_scale) != 2 or not 0 < self.crop_scale[0] <= self.crop_scale[1]:
            raise ConfigError(f"{_join(path, 'crop_scale')} must be [lo, hi] with "
                              f"0 < lo <= hi <= 1, got {self.crop_scale}")
        if (self.mean is None) != (self.std is None) or (
                self.mean is not None and self.std is not None and len(self.mean) != len(self.std)):
            raise ConfigError(f"{_join(path, 'mean')} and {_join(path, 'std')} go together, one "
                              f"value per channel each; got {self.mean} and {self.std}")
        if not folder and (self.augment == "random_resized_crop" or self.mean is not None):
            raise ConfigError(f"{_join(path, 'augment')}: random_resized_crop and "
                              f"{_join(path, 'mean')} / std apply to imagefolder:<path> sources "
                              f"only (source {self.source!r})")


@dataclass
class ModelConfig:
    # small nested CNN: trains on CPU in seconds on digits
    name: str = "nested_cnn_small"
    # ordering groups per layer: 8 gives widths in steps of 1/8
    groups: int = _opt(8, min=1)
    # groups always kept (the smallest slice must be a working network)
    frozen: int = _opt(1, min=1)
    # scales every layer's channel count
    width_mult: float = _opt(1.0, min=0.0, min_exclusive=True)
    # weight initialisation of a registry model: kaiming_normal (He et al. 2015: N(0, 2/fan_in))
    # or torch (nn.Conv2d / nn.Linear's own, U(+-1/sqrt(fan_in)), what the baselines' stock
    # layers start from). A model.name factory keeps the weights of the network it returns.
    init: str = _opt("kaiming_normal", choices=("kaiming_normal", "torch"))
    # extra keyword arguments for create_model (architecture-specific)
    kwargs: dict[str, Any] = _opt(factory=dict)
    # a plain network's state dict (a .pt / .pth file, e.g. torchvision's ImageNet weights
    # downloaded once) loaded into the model before nesting; its classifier is resized to the
    # data's classes. Models built by nest() only: the zoo's and module:factory networks
    weights: str | None = None

    def _cross_check(self, path: str) -> None:
        if self.frozen > self.groups:
            raise ConfigError(
                f"{_join(path, 'frozen')} ({self.frozen}) must be <= {_join(path, 'groups')} "
                f"({self.groups}): cannot freeze more groups than a layer has"
            )


@dataclass
class OrderingConfig:
    # Bernoulli-chain prior keep probability: a high pi favours wide slices
    prior_pi: float = _opt(0.9, min=0.0, max=1.0, min_exclusive=True, max_exclusive=True)
    # initial Downhill mean: most units kept at the start of training
    init_mubar: float = 3.0
    # relaxation temperature annealed from tau_start to tau_end
    tau_start: float = _opt(1.0, min=0.0, min_exclusive=True)
    tau_end: float = _opt(0.1, min=0.0, min_exclusive=True)
    # straight-through hard masks: the trained network sees what the sliced one will
    hard: bool = True
    # kl = BN3's variational objective; l0 = a cheaper sparsity penalty
    regularizer: str = _opt("kl", choices=("kl", "l0"))
    # weight of the l0 penalty (unused with kl)
    l0_lambda: float = _opt(1e-3, min=0.0)
    # one training mask per forward pass ("batch", the authors' code) or per example
    mask_scope: str = _opt("example", choices=("batch", "example"))
    # layer = every unit draws its width independently (BN³); network = the units share their
    # Gumbel noise, so one pass runs a coherent narrow or wide network (marginals unchanged)
    coupling: str = _opt("layer", choices=("layer", "network"))
    # the keep-probability rescale at a fixed width (BN3 App. 8.2: a kept channel times E[z]).
    # It is the test-time match of *sampled* Downhill masks; a regime whose every pass runs a
    # fixed 0/1 width (train.sampled_width: uniform, with or without the sandwich) never sees
    # a scaled channel, and its keep probabilities get no data gradient (they stay at their
    # init), so rescaling there evaluates a network that was never trained (the
    # nested all-conv network, 9k images, 6 epochs, validation +0.4 / +0.3 / +0.9 / +0.45 pt
    # at 0.25..1 without it). null = on exactly when training draws Downhill masks
    rescale: bool | None = None

    def _cross_check(self, path: str) -> None:
        if self.tau_end > self.tau_start:
            raise ConfigError(
                f"{_join(path, 'tau_end')} ({self.tau_end}) must be <= {_join(path, 'tau_start')} "
                f"({self.tau_start}): the temperature is annealed downwards"
            )


@dataclass
class BayesConfig:
    # log-uniform (sparse variational dropout) prior; gaussian for a plain weight-decay-like prior
    prior: str = _opt("log_uniform", choices=("log_uniform", "gaussian", "none"))
    # std of the gaussian prior (unused otherwise)
    prior_sigma: float = _opt(0.1, min=0.0, min_exclusive=True)
    # small initial noise: start close to a deterministic network
    log_alpha_init: float = -4.0
    # KL weight (BN3 App. 9.1); 1.0 is the true ELBO, which over-regularises small data sets
    # (digits: 0.79 vs 0.97 test accuracy at width 0.25); the paper used 1e-5
    kappa: float = _opt(0.01, min=0.0)
    # fraction of the epochs trained deterministically (posterior means, no weight KL) before
    # the variational phase; sigma is re-initialised from the means when it starts. 0 = noise
    # from the first step (BN³), 1 = a deterministic nested network (sigma set at the end)
    noise_start: float = _opt(0.0, min=0.0, max=1.0)


@dataclass
class TrainConfig:
    # enough for digits on CPU; larger datasets set their own
    epochs: int = _opt(30, min=1)
    # small batches: better optimum and still fast on CPU for small images
    batch_size: int = _opt(64, min=1)
    # adam needs no tuning on small problems; sgd for CIFAR-scale recipes
    optimizer: str = _opt("adam", choices=("adam", "sgd"))
    # a safe Adam step for small CNNs
    lr: float = _opt(3e-3, min=0.0, min_exclusive=True)
    # only used by sgd
    momentum: float = _opt(0.9, min=0.0, max=1.0)
    # off by default: the Bayesian prior already regularises
    weight_decay: float = _opt(0.0, min=0.0)
    # cosine decays to ~0 at the last epoch without extra knobs; onecycle (Smith & Topin 2019,
    # torch's OneCycleLR with momentum held): lr/25 -> lr over warmup_fraction of the steps,
    # then down to lr/2.5e5, both phases cosine -- the schedule of the reference networks
    schedule: str = _opt("cosine", choices=("cosine", "onecycle", "step", "none"))
    # onecycle only: the fraction of the steps spent rising to lr (OneCycleLR's pct_start)
    warmup_fraction: float = _opt(0.3, min=0.0, max=1.0, max_exclusive=True)
    # step schedule: multiply lr by gamma every step_size epochs
    step_size: int = _opt(10, min=1)
    gamma: float = _opt(0.1, min=0.0, max=1.0, min_exclusive=True)
    # widths reported during training (fractions of every layer)
    eval_widths: list[float] = _opt(
        factory=lambda: [0.25, 0.5, 0.75, 1.0],
        min_len=1,
        items={"min": 0.0, "max": 1.0, "min_exclusive": True},
    )
    # epochs between evaluations; raise it when evaluating many widths is slow
    eval_every: int = _opt(1, min=1)
    # auto = CUDA when available, else CPU (mps only when asked for); training, the quantizers'
    # fine-tuning and the exporter's BN re-collection run there
    device: str = _opt("auto", choices=("auto", "cpu", "cuda", "mps"))
    # null = torch's default thread count
    threads: int | None = _opt(None, min=1)
    # NHWC images into every training / fine-tuning pass run at the posterior means (a
    # convolution with an NHWC input returns NHWC, so max-pool and batch norm vectorise over
    # channels on a CPU: nested_vgg at width_mult 0.5, one sandwich step, 2 threads: 339 ->
    # 260 ms; benchmarks/step_cost.py [--channels-last]). Passes with weight noise keep NCHW
    # (1.5x slower in NHWC). A recipe that never samples weight noise also trains NHWC weights,
    # which is what makes grey (one-channel) images run NHWC (Fashion-MNIST's sandwich step:
    # 116 -> 80 ms, benchmarks/step_cost.py --config fashion_mnist --width-mult 1); checkpoints
    # and the trained model handed on hold the standard layout
    channels_last: bool = True
    # in-memory datasets: worker processes rarely pay off
    num_workers: int = _opt(0, min=0)
    # null = no gradient clipping
    grad_clip: float | None = _opt(None, min=0.0, min_exclusive=True)
    # sandwich rule (US-Nets): every step also trains the full and the smallest width, besides
    # the Downhill sample, so both ends of the width range are trained, not traded
    sandwich: bool = False
    # the sandwich rule's narrowest width; null = the smallest of eval_widths (the narrowest
    # width the exporter serves), not the model's minimum (frozen / groups = 1/8), which left
    # the served 0.25 to the rare Downhill draws that stop there: Fashion-MNIST validation
    # (18k subset, 5 epochs) 80.3 -> 88.0 % at width 0.25, +0.7 / +0.5 / -0.1 pt at 0.5..1;
    # cifar10_dev (width_mult 0.25, 6 epochs) +7.7 / +2.4 / +0.5 / -2.6 pt at 0.25..1
    min_width: float | None = _opt(None, min=0.0, max=1.0, min_exclusive=True)
    # the sampled pass's width: the ordering's Downhill draw, or uniform over the group
    # boundaries between min_width and 1 (US-Nets' random widths; trainer/regime.py)
    sampled_width: str = _opt("downhill", choices=("downhill", "uniform"))
    # sampled passes per step (US-Nets' sandwich trains 2 random widths besides the extremes)
    sampled_passes: int = _opt(1, min=1)
    # with the sandwich: the weight of the sampled and narrowest passes' losses against the full
    # width's 1 (US-Nets sums them: 1)
    subnet_weight: float = _opt(1.0, min=0.0)
    # with the sandwich: the narrowest width's pass every step (US-Nets' "min" of the sandwich);
    # false leaves the narrowest width to the sampled passes
    narrow_pass: bool = True
    # the first fraction of the epochs trains the full width alone (one pass per step), the
    # nested regime follows (Once-for-All's progressive shrinking, Cai et al. 2020, §3.2: the
    # full width first, then the narrower ones share and distil from it); 0 = nested throughout
    nested_start: float = _opt(0.0, min=0.0, max=1.0, max_exclusive=True)
    # in-place distillation: with sandwich, the sampled and smallest widths learn the full
    # width's (detached) soft predictions instead of the labels
    distill: bool = True
    # weight decay on every parameter ("all") or only on the weight means ("weights": not on
    # weight_rho, ordering logits, biases or batch norm)
    decay_scope: str = _opt("all", choices=("all", "weights"))


@dataclass
class PWFNConfig:
    """Probabilistic Weight Fixing (PWFN paper §3, Algorithm 1). Versioned: a checkpoint records
    the version it was quantized with."""

    version: int = _opt(1, min=1, max=1)
    # where each weight's sigma comes from: our network is already Bayesian, so its learned
    # posterior sigma; pow2 = the paper's init for a deterministic net (appendix eq. 12-13);
    # uniform = Table 1's "no prior" ablation (every sigma = uniform_sigma)
    sigma_init: str = _opt("posterior", choices=("posterior", "pow2", "uniform"))
    uniform_sigma: float = _opt(0.01, min=0.0, min_exclusive=True)
    # eq. 2-3: weight of the large-sigma regulariser sum_i (S - sigma_i)_+ ; the paper's 2^-11
    alpha: float = _opt(2.0 ** -11, min=0.0)
    # S in eq. 3: sigmas are pushed up to this cutoff, no further (0.05 = the init clamp's max)
    sigma_target: float = _opt(0.05, min=0.0, min_exclusive=True)
    # fraction of weights fixed after each round: the WFN schedule the paper follows
    schedule: list[float] = _opt(
        factory=lambda: [0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 0.95, 0.975, 1.0],
        min_len=1, items={"min": 0.0, "max": 1.0, "min_exclusive": True})
    # E: retraining epochs of the free weights after each round (paper: 3 suffice, App. Fig. 3)
    epochs_per_round: int = _opt(2, min=0)
    # delta_0 of eq. 8, in sigmas (the paper fixes delta = 1)
    delta: float = _opt(1.0, min=0.0, min_exclusive=True)
    # omega cap: at most this many powers of two per centre (the authors' code uses 4)
    max_order: int = _opt(4, min=1, max=8)
    # b: the smallest power of two is 2^-b (the authors' code uses 7)
    precision: int = _opt(7, min=0, max=24)
    # mean = eq. 8's running-mean prefix; strict = every moved weight within delta sigmas
    # (the authors' code), which cannot admit far weights behind many near-zero ones
    rule: str = _opt("mean", choices=("mean", "strict"))
    # where a selected weight moves: centre = the popular centre c_k* (§3's text); nearest =
    # its own nearest centre in C^omega (Algorithm 1's last line). Measured on digits: centre
    # collapses to 0.17 test accuracy in the last rounds (escalated delta drags far weights to
    # c_k*), nearest keeps 0.99
    assign: str = _opt("nearest", choices=("centre", "nearest"))
    # Adam step for retraining between rounds (fine-tuning, so smaller than training's)
    lr: float = _opt(1e-3, min=0.0, min_exclusive=True)
    # posterior networks averaged for the ensemble metrics
    samples: int = _opt(8, min=1)
    # cluster biases too (one codebook for every conv/linear weight and bias; BN stays float)
    include_bias: bool = True

    def _cross_check(self, path: str) -> None:
        s = self.schedule
        if any(b <= a for a, b in zip(s, s[1:])) or s[-1] != 1.0:
            raise ConfigError(
                f"{_join(path, 'schedule')} must increase strictly and end at 1.0 (every weight "
                f"fixed after the last round), got {s}")


@dataclass
class SQSConfig:
    """Sparse Quantized Sub-distributions (SQS paper §3.1, App. C, D.2). Versioned."""

    version: int = _opt(1, min=1, max=1)
    # K = 2^bits Gaussian components per window (App. C's 16 = 4 bits)
    bits: int = _opt(4, min=1, max=8)
    # the exact fraction of weights kept non-zero after pruning (the paper's "Non-zero")
    nonzero: float = _opt(0.5, min=0.0, max=1.0, min_exclusive=True)
    # outlier = App. C's IQR-fenced tails + two bulk windows; equal = 4 equal-width windows (ablation)
    windows: str = _opt("outlier", choices=("outlier", "equal"))
    # App. C uses 5 x IQR for the tail fences (the main text says 1.5x; the appendix is the recipe)
    iqr_factor: float = _opt(5.0, min=0.0, min_exclusive=True)
    # responsibility temperature tau of eq. 2 (App. C default)
    tau: float = _opt(5e-4, min=0.0, min_exclusive=True)
    # tau' of eq. 33, halved after half the steps
    tau_prune: float = _opt(0.0125, min=0.0, min_exclusive=True)
    # slab std sigma_0 of the spike-and-slab prior (eq. 5)
    prior_sigma: float = _opt(1.0, min=0.0, min_exclusive=True)
    # fine-tuning epochs (the paper compresses ResNets within 10)
    epochs: int = _opt(5, min=1)
    # Adam's lr. App. D.2 uses 1e-3; on our SGD-trained networks it drifts the weights more the
    # more steps it takes. Chosen on cifar10_dev's validation split (10k images, 1 epoch): 1e-3
    # cost 4.2 .. 11.3 pt, 3e-4 0.5 .. 1.65, 1e-4 1.3 .. 1.65; confirmed on Fashion-MNIST's test
    # split afterwards (10k images, 1 epoch): 3e-4 -0.25 / +0.9 / +0.5 / +1.5 pt over 1e-3 at 0.25..1
    lr: float = _opt(3e-4, min=0.0, min_exclusive=True)
    # fine-tune on a seeded random subset of this many training samples (null = all of them):
    # the quantizer's cost is then fixed, whatever the data set's size (goal 4)
    subset: int | None = _opt(None, min=1)
    # exponent of the polynomial schedule taking the prior keep probability from 1 to nonzero
    schedule_power: float = _opt(3.0, min=1.0)
    # top-k over the whole network (global) or within each tensor (layer)
    prune_scope: str = _opt("global", choices=("global", "layer"))
    # networks averaged in the quantizer's own report of Bayesian averaging (eq. 10); each costs
    # a BN re-collection and a test pass per width (nested_vgg 0.5 on 5k images: ~40 s on one
    # core), and the exporter measures the sampled slices it writes anyway: 0 = report the
    # point (greedy) network only
    samples: int = _opt(8, min=0)
    # temperature of the categorical posterior when sampling (eq. 9); tau itself makes samples
    # ~ greedy (phi nearly one-hot), so a larger one exposes the posterior's spread
    sample_tau: float = _opt(0.05, min=0.0, min_exclusive=True)


@dataclass
class QuantizeConfig:
    # none = stop after nested training; pwfn / sqs run that quantizer after it
    method: str = _opt("none", choices=("none", "pwfn", "sqs"))
    pwfn: PWFNConfig = _opt(factory=PWFNConfig)
    sqs: SQSConfig = _opt(factory=SQSConfig)


@dataclass
class Config:
    # run name: used for the output directory and stored in the checkpoint
    name: str = "digits"
    # seeds model init and batch order (the data split has its own data.split_seed)
    seed: int = _opt(0, min=0)
    data: DataConfig = _opt(factory=DataConfig)
    model: ModelConfig = _opt(factory=ModelConfig)
    ordering: OrderingConfig = _opt(factory=OrderingConfig)
    bayes: BayesConfig = _opt(factory=BayesConfig)
    train: TrainConfig = _opt(factory=TrainConfig)
    quantize: QuantizeConfig = _opt(factory=QuantizeConfig)


# --------------------------------------------------------------------------- dict / YAML


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain python types only: safe for yaml.safe_dump and torch.save(weights_only=True)."""
    return dataclasses.asdict(validate(cfg))


def config_from_dict(d: Mapping[str, Any]) -> Config:
    """Validated Config from a (possibly partial) dict; inverse of config_to_dict."""
    return _build(Config, d, "")


def dump_config(cfg: Config) -> str:
    """YAML text that load_config / config_from_dict read back to an equal Config."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def apply_overrides(cfg: Config, overrides: Sequence[str]) -> Config:
    """A new, validated config with ``section.key=value`` overrides applied to ``cfg``."""
    data = config_to_dict(cfg)
    for override in overrides:
        _apply_override(data, override, Config)
    return config_from_dict(data)


def load_config(name_or_path: str | None = "digits", overrides: Sequence[str] = ()) -> Config:
    """Load a built-in config by name or a YAML file by path, then apply ``a.b=value`` overrides.

    ``None`` starts from the dataclass defaults alone. Override values are parsed as YAML,
    so ``train.eval_widths=[0.5,1.0]`` and ``model.kwargs={input_size: 8}`` work.
    """
    if isinstance(overrides, str):  # a lone "train.epochs=3" would otherwise be split into characters
        overrides = [overrides]
    if name_or_path is None:
        data: Any = {}
        where = "default config"
    else:
        text, where = _read_config_text(name_or_path)
        data = _parse_yaml(text, where)
        if data is None:  # an empty file states no differences from the defaults
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"{where}: the top level must be a mapping of sections (e.g. 'train:'), "
                f"got {_value_desc(data)}"
            )
    data = dict(data)
    for override in overrides:
        if not isinstance(override, str):
            raise ConfigError(f"override must be a 'key=value' string, got {_value_desc(override)}")
        _apply_override(data, override, Config)
    try:
        return _build(Config, data, "")
    except ConfigError as exc:
        suffix = f" with overrides {list(overrides)}" if overrides else ""
        raise ConfigError(f"{where}{suffix}: {exc}") from exc
