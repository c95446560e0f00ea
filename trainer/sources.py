"""Reading a data source (``data.source``) into raw arrays: NHWC images and int64 labels.

A reader per array source (scikit-learn's bundled digits, ``npz:<path>``, the torchvision
datasets; photo folders stream instead: :mod:`trainer.folders`) into ``_Raw`` (train and optional test split, class names, value
range), and an npz's single split for evaluation or OOD data. Split out of trainer/data.py,
which makes the normalised, stratified splits from what this returns; moved as it was.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_sdk.errors import ConfigError, DataError

from .config import BUILTIN_SOURCES, PATH_SOURCES


@dataclass
class _Raw:
    """One source in device format: NHWC images, int64 labels; x_test None = no test split."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    classes: tuple[str, ...]
    value_range: tuple[float, float]


def _accepted_sources() -> str:
    return ", ".join(list(BUILTIN_SOURCES) + [f"{p}<path>" for p in PATH_SOURCES])


def _nhwc(x: np.ndarray, what: str) -> np.ndarray:
    if x.ndim == 3:  # N x H x W grey
        x = x[..., None]
    if x.ndim != 4:
        raise DataError(f"{what} must be N x H x W or N x H x W x C images, got shape {x.shape}")
    if x.dtype == np.uint8:
        return x
    if x.dtype.kind == "f":
        return x.astype(np.float32, copy=False)
    raise DataError(f"{what} must be uint8 or floating point, got dtype {x.dtype}")


def _labels(y: Any, n: int, what: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != n:
        raise DataError(f"{what} must be a 1-D array of {n} labels, got shape {y.shape}")
    if y.size and y.dtype.kind not in "iu":
        raise DataError(f"{what} must be integer class indices, got dtype {y.dtype}")
    return y.astype(np.int64)


def _value_range(*arrays: np.ndarray | None) -> tuple[float, float]:
    present = [a for a in arrays if a is not None and a.size]
    if not present or present[0].dtype == np.uint8:
        return (0.0, 255.0)
    lo = min(float(a.min()) for a in present)
    hi = max(float(a.max()) for a in present)
    return (lo, hi if hi > lo else lo + 1.0)


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images N x 8 x 8 float, labels) of scikit-learn's bundled digits.

    Reads the CSV that ``load_digits`` reads, without importing scikit-learn (which costs
    several seconds of scipy imports on every ``edge-sdk train --config digits``); falls
    back to ``load_digits`` if the file is not where it has been for a decade.
    """
    spec = importlib.util.find_spec("sklearn")  # locates the package without executing it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "datasets", "data", "digits.csv.gz")
        if os.path.isfile(path):
            data = np.loadtxt(path, delimiter=",")
            if data.ndim == 2 and data.shape[1] == 65:
                return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise DataError("the digits source needs scikit-learn: pip install scikit-learn") from exc
    d = load_digits()
    return d.images, d.target.astype(np.int64)


def _read_digits() -> _Raw:
    images, labels = _digits_arrays()
    x = images.astype(np.float32)[..., None]  # 8 x 8 grey, values 0..16
    return _Raw(x, labels, None, None, tuple(str(c) for c in range(10)), (0.0, 16.0))


def _npz_arrays(path: str) -> dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise DataError(f"npz data file '{path}' not found (cwd: {os.getcwd()})")
    try:
        with np.load(path, allow_pickle=False) as f:  # no pickle: data must not run code
            return {k: f[k] for k in f.files}
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read npz data file '{path}': {exc}") from exc


def _read_npz_images(path: str, labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """One split of an npz for evaluation or OOD: x_test (else x_train) and its labels, which
    only ``labels=True`` requires (None when absent)."""
    path = os.path.expanduser(path)
    arrays = _npz_arrays(path)
    split = "test" if "x_test" in arrays and arrays["x_test"].size else "train"
    if f"x_{split}" not in arrays:
        raise DataError(f"npz data file '{path}' has no images: expected x_test (or x_train), "
                        f"found {sorted(arrays)}")
    x = _nhwc(arrays[f"x_{split}"], f"{path}: x_{split}")
    if f"y_{split}" not in arrays:
        if labels:
            raise DataError(f"npz data file '{path}' has x_{split} but no y_{split}: evaluation "
                            "data needs labels (only OOD data may come without)")
        return x, None
    return x, _labels(arrays[f"y_{split}"], x.shape[0], f"{path}: y_{split}")


def _read_npz(path: str) -> _Raw:
    path = os.path.expanduser(path)  # relative paths are relative to the working directory
    arrays = _npz_arrays(path)
    missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in arrays]
    if missing:
        raise DataError(f"npz data file '{path}' lacks {missing}; expected keys x_train, y_train, x_test, "
                        f"y_test and optionally classes; found {sorted(arrays)}")
    x_train = _nhwc(arrays["x_train"], f"{path}: x_train")
    x_test = _nhwc(arrays["x_test"], f"{path}: x_test")
    if x_train.shape[0] and x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(f"{path}: x_train images are {x_train.shape[1:]} but x_test images are {x_test.shape[1:]}")
    y_train = _labels(arrays["y_train"], x_train.shape[0], f"{path}: y_train")
    y_test = _labels(arrays["y_test"], x_test.shape[0], f"{path}: y_test")
    if "classes" in arrays:
        names = arrays["classes"]
        if names.ndim != 1 or names.dtype.kind != "U":
            raise DataError(f"{path}: classes must be a 1-D array of strings, got {names.dtype} {names.shape}")
        classes = tuple(str(c) for c in names)
    else:  # no names stored: the labels are their own names
        top = max([int(y.max()) for y in (y_train, y_test) if y.size] + [0])
        classes = tuple(str(c) for c in range(top + 1))
    return _Raw(x_train, y_train, x_test, y_test, classes, _value_range(x_train, x_test))


def _read_torchvision(name: str, root: str, download: bool) -> _Raw:
    from torchvision import datasets  # lazy: importing torchvision costs ~1 s

    root = os.path.expanduser(root)

    def get(train: bool) -> Any:
        try:
            if name == "svhn":
                return datasets.SVHN(root, split="train" if train else "test", download=download)
            cls = {"mnist": datasets.MNIST, "fashion_mnist": datasets.FashionMNIST, "cifar10": datasets.CIFAR10}
            return cls[name](root, train=train, download=download)
        except (RuntimeError, OSError) as exc:  # torchvision: RuntimeError("Dataset not found ...")
            if download:
                raise DataError(f"could not download or read {name} into '{root}': {exc}") from exc
            raise DataError(
                f"{name} not found under '{root}' and data.download is false; set data.download: true "
                f"(or pass the override data.download=true) to fetch it, point data.root at an existing "
                f"copy, or use an npz:<path> source"
            ) from exc

    out = []
    for train in (True, False):
        ds = get(train)
        if name == "svhn":
            x = np.ascontiguousarray(np.asarray(ds.data).transpose(0, 2, 3, 1))  # stored N x C x H x W
            y = np.asarray(ds.labels)
        else:
            x = np.asarray(ds.data)  # MNIST-likes: uint8 tensor N x H x W; CIFAR: numpy N x H x W x C
            y = np.asarray(ds.targets)
        out.append((_nhwc(x, name), _labels(y, x.shape[0], f"{name} labels")))
        if train:
            # torchvision's MNIST names ("0 - zero") are noise on a device; SVHN has none
            classes = tuple(str(c) for c in range(10)) if name in ("mnist", "svhn") else tuple(ds.classes)
    (x_train, y_train), (x_test, y_test) = out
    return _Raw(x_train, y_train, x_test, y_test, classes, (0.0, 255.0))


def _read_source(source: str, root: str, download: bool) -> _Raw:
    if source == "digits":
        return _read_digits()
    if source in BUILTIN_SOURCES:
        return _read_torchvision(source, root, download)
    if source.startswith("npz:") and len(source) > 4:
        return _read_npz(source[4:])
    raise ConfigError(f"unknown data source {source!r}; accepted: {_accepted_sources()}")
