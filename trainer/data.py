"""Data sources by name -> in-memory, normalised, stratified train/val/test splits.

Sources (``data.source``; read into raw arrays by :mod:`trainer.sources`):

``digits``               scikit-learn's bundled 8x8 digits (offline), raw float32 in [0, 16]
``npz:<path>``           arrays x_train, y_train, x_test, y_test (+ optional ``classes``), uint8 or
                         float images N x H x W (grey) or N x H x W x C; read without pickle
``mnist`` | ``fashion_mnist`` | ``cifar10`` | ``svhn``
                         torchvision datasets under ``data.root`` (downloaded only if ``data.download``)
``imagefolder:<path>``   photos, streamed (:mod:`trainer.folders`): the user's train / val / test
                         folders or one folder split three ways; ``data.image_size`` px

The array sources are small enough to hold in memory, so each is converted once to numpy
("raw", NHWC, the format the device feeds) and to a normalised float32 NCHW tensor (what
the model trains on); a photo folder's training split is decoded on the fly instead.
Normalisation statistics come from the training split only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from edge_sdk.bundle import InputSpec  # the one input spec (manifest, checkpoint, data)
from edge_sdk.errors import ConfigError, DataError

from .config import DataConfig, validate
from .folders import FolderDataset, decode_eval, load_folder, ood_folder
from .sources import _read_npz_images, _read_source

__all__ = [
    "ArrayDataset",
    "DataSplits",
    "InputSpec",
    "calibration_subset",
    "load_data",
    "load_ood",
    "nhwc_inputs",
    "subset",
]

AUGMENTS = ("none", "crop_flip", "crop_flip_batch")
_CROP_PAD = 4  # pixels of padding before the random crop (the CIFAR recipe)
_CHUNK = 1024  # samples per chunk when normalising: bounds temporaries on CIFAR-sized arrays


# --------------------------------------------------------------------------- dataset


def _crop_flip(x: torch.Tensor) -> torch.Tensor:
    """Random crop (after zero padding) + horizontal flip of one normalised CHW image.

    Zero in normalised space is the mean colour, so the padding adds no artificial
    black border statistics. Uses torch's RNG so DataLoader worker seeding applies.
    """
    _, h, w = x.shape
    padded = F.pad(x, (_CROP_PAD, _CROP_PAD, _CROP_PAD, _CROP_PAD))
    top, left = (int(v) for v in torch.randint(0, 2 * _CROP_PAD + 1, (2,)))
    out = padded[:, top : top + h, left : left + w]
    if bool(torch.rand(()) < 0.5):
        out = out.flip(-1)
    return out.contiguous()


def crop_flip_batch(x: torch.Tensor) -> torch.Tensor:
    """Random crop with one offset for the whole batch (after reflect padding) + a horizontal
    flip per image, of a normalised NCHW batch: the reference networks' recipe. One offset per
    batch is as much augmentation over an epoch as one per image (every image sees each offset
    equally often) and costs one pad + slice instead of one per image."""
    _, _, h, w = x.shape
    padded = F.pad(x, (_CROP_PAD, _CROP_PAD, _CROP_PAD, _CROP_PAD), mode="reflect")
    top, left = (int(v) for v in torch.randint(0, 2 * _CROP_PAD + 1, (2,), device="cpu"))
    out = padded[:, :, top : top + h, left : left + w]
    flip = (torch.rand(x.shape[0], device="cpu") < 0.5).to(x.device).view(-1, 1, 1, 1)
    return torch.where(flip, out.flip(-1), out)


class ArrayDataset(torch.utils.data.Dataset):
    """In-memory dataset: normalised float32 x [N, C, H, W], int64 y [N], raw NHWC numpy.

    ``raw`` (unnormalised, the device's dtype) is kept for the exporter's calibration and
    device-format evaluation; it is a fraction of the size of ``x``.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, raw: np.ndarray, augment: str = "none") -> None:
        if augment not in AUGMENTS:
            raise DataError(f"augment must be one of {', '.join(AUGMENTS)}, got {augment!r}")
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.ndim != 4:
            raise DataError(f"x must be a float32 tensor [N, C, H, W], got {getattr(x, 'dtype', type(x))} "
                            f"{tuple(getattr(x, 'shape', ()))}")
        if not isinstance(y, torch.Tensor) or y.dtype != torch.int64 or y.shape != (x.shape[0],):
            raise DataError(f"y must be an int64 tensor [{x.shape[0]}], got {getattr(y, 'dtype', type(y))} "
                            f"{tuple(getattr(y, 'shape', ()))}")
        n, c, h, w = x.shape
        if not isinstance(raw, np.ndarray) or raw.shape != (n, h, w, c):
            raise DataError(f"raw must be a numpy array of shape {(n, h, w, c)} (NHWC), got "
                            f"{getattr(raw, 'shape', type(raw))}")
        self.x = x
        self.y = y
        self.raw = raw
        self.augment = augment

    @classmethod
    def from_raw(cls, raw: np.ndarray, y: np.ndarray, spec: InputSpec, augment: str = "none") -> ArrayDataset:
        return cls(_normalize_to_nchw(raw, spec), torch.as_tensor(np.asarray(y, dtype=np.int64)), raw, augment)

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[index]
        if self.augment == "crop_flip":
            x = _crop_flip(x)
        elif self.augment == "crop_flip_batch":
            x = crop_flip_batch(x[None])[0]
        return x, self.y[index]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A whole batch at once (DataLoader calls this when it exists): one indexing op, and
        the batch-level augmentation sees the batch. Per-image ``crop_flip`` keeps its per-image
        loop, so its random draws (and earlier runs) stay as they were."""
        if self.augment == "crop_flip":
            return [self[i] for i in indices]
        idx = torch.as_tensor(indices, dtype=torch.long, device="cpu")  # in-memory data: host
        x = self.x[idx]
        if self.augment == "crop_flip_batch":
            x = crop_flip_batch(x)
        return list(zip(x.unbind(0), self.y[idx].unbind(0)))


@dataclass
class DataSplits:
    train: ArrayDataset
    val: ArrayDataset
    test: ArrayDataset
    spec: InputSpec
    source: str
    split_seed: int
    note: str = ""  # what the loader decided (a photo folder: whose splits, their sizes)

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes


def subset(ds: ArrayDataset | FolderDataset, indices: Sequence[int] | np.ndarray,
           augment: str | None = None) -> ArrayDataset | FolderDataset:
    """Rows ``indices`` of ds (a copy; of a photo folder, its paths); keeps ds's augmentation
    unless ``augment`` is given."""
    idx = np.asarray(indices)
    if idx.dtype == bool or idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise DataError(f"indices must be a 1-D sequence of integers, got dtype {idx.dtype}, shape {idx.shape}")
    idx = idx.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= len(ds)):
        raise DataError(f"indices must be in [0, {len(ds)}), got range [{idx.min()}, {idx.max()}]")
    if isinstance(ds, FolderDataset):
        return ds.subset(idx, augment)
    t = torch.from_numpy(idx)
    return ArrayDataset(ds.x[t], ds.y[t], ds.raw[idx], ds.augment if augment is None else augment)


def calibration_subset(ds: ArrayDataset | FolderDataset, n: int, seed: int) -> ArrayDataset:
    """First n samples of a seeded permutation, augmentation off (BN statistics re-collection);
    photos decoded once by the evaluation transform."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DataError(f"calibration subset size must be an int >= 1, got {n!r}")
    perm = np.random.default_rng(seed).permutation(len(ds))
    return in_memory(subset(ds, np.sort(perm[:n]), augment="none"))


def in_memory(ds: ArrayDataset | FolderDataset) -> ArrayDataset:
    """ds itself, or a photo folder's photos decoded by the evaluation transform (all of them:
    take a :func:`calibration_subset` of a large folder instead)."""
    if isinstance(ds, ArrayDataset):
        return ds
    raw = decode_eval(ds.paths, ds.spec.preprocess, ds.spec.channels)
    return ArrayDataset.from_raw(raw, ds.y.numpy(), ds.spec)


# what the exporter reads of a photo folder's training split (the OOD prototypes, the input
# statistics): a seeded sample, so an export holds thousands of photos, not the folder
TRAINING_VIEW = 4096


def training_view(ds: ArrayDataset | FolderDataset, seed: int = 0) -> ArrayDataset:
    """The training split as arrays: itself in memory, or a seeded :data:`TRAINING_VIEW` photos."""
    if isinstance(ds, ArrayDataset):
        return ds
    return calibration_subset(ds, min(TRAINING_VIEW, len(ds)), seed)


def nhwc_inputs(ds: ArrayDataset | FolderDataset, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(normalised model inputs as NHWC float32 numpy, labels) of ds, the first ``limit`` samples
    (all when None): what the exporter and the report feed the interpreter."""
    if isinstance(ds, FolderDataset):
        ds = in_memory(ds if limit is None else ds.subset(np.arange(min(limit, len(ds))), "none"))
    x, y = ds.x, ds.y
    if limit is not None:
        x, y = x[:limit], y[:limit]
    return x.permute(0, 2, 3, 1).contiguous().numpy(), y.numpy()


# --------------------------------------------------------------------------- splits and statistics


def _class_sizes(n: int, fractions: Sequence[float]) -> list[int]:
    """Held-out sample counts of one class with n samples, one per fraction."""
    sizes = [int(math.floor(n * f + 0.5)) for f in fractions]
    if n > len(fractions):  # enough samples: every split sees every class
        sizes = [max(s, 1) for s in sizes]
    for k in reversed(range(len(sizes))):  # training keeps at least one sample of the class
        while sizes[k] > 0 and sum(sizes) > n - 1:
            sizes[k] -= 1
    return sizes


def _stratified_split(y: np.ndarray, num_classes: int, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Sorted index arrays [train, held_out_1, ...]: per class, round(n_c * fraction) to each held-out split.

    Deterministic in seed; loops over classes, not samples.
    """
    perm = np.random.default_rng(seed).permutation(len(y))
    grouped = perm[np.argsort(y[perm], kind="stable")]  # class-major, shuffled within each class
    counts = np.bincount(y, minlength=num_classes)
    ends = np.cumsum(counts)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(fractions) + 1)]
    for c in np.flatnonzero(counts):
        members = grouped[ends[c] - counts[c] : ends[c]]
        start = 0
        for k, size in enumerate(_class_sizes(int(counts[c]), fractions)):
            parts[k + 1].append(members[start : start + size])
            start += size
        parts[0].append(members[start:])
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]


def _channel_stats(raw: np.ndarray, value_range: tuple[float, float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of NHWC raw data, in chunks (no full float64 copy)."""
    c = raw.shape[-1]
    total = np.zeros(c)
    total_sq = np.zeros(c)
    count = 0
    for start in range(0, raw.shape[0], _CHUNK):
        chunk = raw[start : start + _CHUNK].reshape(-1, c).astype(np.float64)
        total += chunk.sum(axis=0)
        total_sq += np.square(chunk).sum(axis=0)
        count += chunk.shape[0]
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - np.square(mean), 0.0))
    # A constant channel has nothing to scale; 1.0 keeps it at zero instead of dividing by ~0.
    tiny = 1e-6 * (value_range[1] - value_range[0])
    std = np.where(std > tiny, std, 1.0)
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def _normalize_to_nchw(raw: np.ndarray, spec: InputSpec) -> torch.Tensor:
    """(raw - mean) / std as a float32 NCHW tensor, filled chunk by chunk."""
    if raw.ndim != 4 or raw.shape[1:] != spec.shape[1:]:
        raise DataError(f"raw images must be N x {' x '.join(map(str, spec.shape[1:]))} (NHWC), got {raw.shape}")
    n, h, w, c = raw.shape
    out = np.empty((n, c, h, w), dtype=np.float32)
    mean = np.asarray(spec.mean, dtype=np.float32)
    std = np.asarray(spec.std, dtype=np.float32)
    for start in range(0, n, _CHUNK):
        chunk = (raw[start : start + _CHUNK].astype(np.float32) - mean) / std
        out[start : start + _CHUNK] = chunk.transpose(0, 3, 1, 2)
    return torch.from_numpy(out)


def _check_labels(y: np.ndarray, num_classes: int, what: str) -> None:
    if y.size and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise DataError(
            f"{what}: labels must be in [0, {num_classes}) for {num_classes} classes, "
            f"got values in [{int(y.min())}, {int(y.max())}]"
        )


def _resolve_augment(augment: str, spec: InputSpec) -> str:
    if augment == "auto":  # crop+flip is the standard recipe for 32x32 RGB; it would wreck 8x8 digits
        return "crop_flip" if spec.shape[1:] == (32, 32, 3) else "none"
    return augment


def _carried_spec(found: InputSpec, spec: InputSpec | None, source: str, split_seed: int) -> InputSpec:
    """``found`` (the data's own spec), or the checkpoint's ``spec`` once the data match it."""
    if spec is None:
        return found
    if not isinstance(spec, InputSpec) or spec.classes is None:
        raise TypeError("load_data(spec=...) expects the InputSpec a checkpoint carries "
                        f"(with classes), got {spec!r}")
    spec.check_matches(
        found, mine="the checkpoint has", theirs="the data give",
        what=f"data source {source!r} (split seed {split_seed}) no longer matches the "
             "input spec the checkpoint was trained with; the data changed since training "
             "(restore them or retrain)")
    return spec


# --------------------------------------------------------------------------- public loaders


def load_data(cfg: DataConfig, spec: InputSpec | None = None) -> DataSplits:
    """Train/val/test splits of cfg.source, stratified and deterministic in cfg.split_seed.

    Sources with a test split keep it untouched and carve val from train; the others
    (digits, imagefolder, an npz with an empty test set) are split three ways.

    ``spec``: the input spec a checkpoint carries (what training normalised with). The
    reloaded data are cross-checked against it (shape, dtype, value range, the training
    split's mean and std, classes) and normalised with it; any difference raises
    :class:`~edge_sdk.errors.InputSpecMismatchError` naming both values (the data changed
    since training). Without it, the spec is computed from the training split.
    """
    if not isinstance(cfg, DataConfig):
        raise TypeError(f"load_data expects a DataConfig, got {type(cfg).__name__}")
    cfg = validate(cfg, "data")  # unknown source / missing image_size -> ConfigError naming the key
    if cfg.source.startswith("imagefolder:"):  # photos: streamed (trainer.folders)
        return load_folder(cfg, spec)
    raw = _read_source(cfg.source, cfg.root, cfg.download)
    if raw.x_train.shape[0] == 0:
        raise DataError(
            f"data source {cfg.source!r} has no training data (x_train is empty): it is a test-only set, "
            f"e.g. for out-of-distribution evaluation; load it with trainer.data.load_ood(source, spec)"
        )
    num_classes = len(raw.classes)
    _check_labels(raw.y_train, num_classes, f"{cfg.source} training labels")
    if raw.x_test is not None and raw.y_test is not None and raw.x_test.shape[0]:
        _check_labels(raw.y_test, num_classes, f"{cfg.source} test labels")
        train_idx, val_idx = _stratified_split(raw.y_train, num_classes, (cfg.val_fraction,), cfg.split_seed)
        x_test, y_test = raw.x_test, raw.y_test
    else:
        train_idx, val_idx, test_idx = _stratified_split(
            raw.y_train, num_classes, (cfg.val_fraction, cfg.test_fraction), cfg.split_seed
        )
        x_test, y_test = raw.x_train[test_idx], raw.y_train[test_idx]
    x_train, y_train = raw.x_train[train_idx], raw.y_train[train_idx]
    x_val, y_val = raw.x_train[val_idx], raw.y_train[val_idx]
    if not (len(x_val) and len(x_test)):
        raise DataError(
            f"data source {cfg.source!r} has too few samples ({raw.x_train.shape[0]}) for non-empty "
            f"train/val/test splits with val_fraction={cfg.val_fraction}, test_fraction={cfg.test_fraction}"
        )
    mean, std = _channel_stats(x_train, raw.value_range)  # training split only: val/test stay unseen
    found = InputSpec(
        shape=(1, *x_train.shape[1:]),
        dtype="uint8" if x_train.dtype == np.uint8 else "float32",
        value_range=raw.value_range,
        mean=mean,
        std=std,
        classes=raw.classes,
    )
    spec = _carried_spec(found, spec, cfg.source, cfg.split_seed)
    return DataSplits(
        train=ArrayDataset.from_raw(x_train, y_train, spec, _resolve_augment(cfg.augment, spec)),
        val=ArrayDataset.from_raw(x_val, y_val, spec),
        test=ArrayDataset.from_raw(x_test, y_test, spec),
        spec=spec,
        source=cfg.source,
        split_seed=cfg.split_seed,
    )


def load_ood(
    source: str,
    spec: InputSpec,
    *,
    root: str = DataConfig.root,
    download: bool = False,
    labels: bool = False,
) -> ArrayDataset:
    """A source's test split (its whole data when it has none), normalised with the IN-distribution spec.

    Labels are kept as stored (they belong to the OOD label set, not to spec.classes). An npz
    may hold only ``x_test`` (or only ``x_train``) and no labels: OOD data needs none, and its
    labels are then -1. ``labels=True`` (evaluation data) requires them.
    """
    if not isinstance(spec, InputSpec):
        raise TypeError(f"load_ood expects an InputSpec, got {type(spec).__name__}")
    if not isinstance(source, str):
        raise ConfigError(f"data source must be a string, got {type(source).__name__}")
    if source.startswith("npz:") and len(source) > 4:
        x, y = _read_npz_images(source[4:], labels)
    elif source.startswith("imagefolder:") and len(source) > 12:
        x, y = ood_folder(source, spec)  # by the spec's own evaluation transform
    else:
        raw = _read_source(source, root, download)
        if raw.x_test is not None and raw.y_test is not None and raw.x_test.shape[0]:
            x, y = raw.x_test, raw.y_test
        else:
            x, y = raw.x_train, raw.y_train
    if x.shape[0] == 0:
        raise DataError(f"OOD source {source!r} has no samples")
    if x.shape[1:] != spec.shape[1:]:
        raise DataError(
            f"OOD source {source!r} has images of shape (H, W, C) = {tuple(x.shape[1:])}, but the model's "
            f"input spec expects {tuple(spec.shape[1:])}"
        )
    if str(x.dtype) != spec.dtype:
        if x.dtype == np.uint8:  # uint8 -> float32 is lossless
            x = x.astype(np.float32)
        else:
            raise DataError(f"OOD source {source!r} has {x.dtype} pixels, but the model's input is {spec.dtype}")
    return ArrayDataset.from_raw(x, np.full(len(x), -1, np.int64) if y is None else y, spec)
