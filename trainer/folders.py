"""Photo folders (``data.source: imagefolder:<root>``), streamed: decoded on the fly by
torch's ``DataLoader`` workers with Pillow, so memory stays flat in the number of images.

Layout: ``<root>/<class>/<image>`` (one folder, split three ways like the other sources), or
the user's own splits ``<root>/train/<class>/...`` with ``val/`` or ``validation/`` and an
optional ``test/`` beside it, used as they are (a missing val or test split is carved from
train, stratified). Class names are the training folder's subfolders, sorted (torchvision's
``ImageFolder`` order).

Two transforms:

- **evaluation** (:class:`edge_sdk.bundle.Preprocess`: shorter side -> ``round(image_size /
  crop_fraction)``, centre ``image_size`` crop), by :func:`edge_sdk.inputs.images.prepare`: the
  function the device runs on the bundle's recorded transform, so the exported evaluation and
  the device see the same bytes. Validation, test, the BN re-collection subset and the
  normalisation statistics' sample are decoded once with it, as uint8 arrays (their size, not
  the training folder's, is what they hold);
- **training** (``data.augment``, auto = ``random_resized_crop``): torchvision's transforms v2
  ``RandomResizedCrop(image_size, scale=data.crop_scale)`` + horizontal flip, on the decoded
  photo; ``none`` = the evaluation transform.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from edge_sdk.bundle import InputSpec
from edge_sdk.bundle.preprocess import Preprocess
from edge_sdk.errors import DataError
from edge_sdk.inputs.images import centre, open_image, prepare

# torchvision's IMG_EXTENSIONS: what ImageFolder would list
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
VAL_NAMES = ("val", "validation")  # the user's validation folder, by either common name
_DECODE_THREADS = 2  # Pillow releases the GIL while decoding and resizing


def find_images(folder: str | os.PathLike, classes: Sequence[str] | None = None
                ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(paths as a bytes array, int64 labels, class names) of ``folder/<class>/**/<image>``.

    Paths are one numpy bytes array, not a list of str: DataLoader workers read them without
    touching per-object reference counts (a list's pages are copied into every worker).
    ``classes``: the training folder's names; a class folder outside them is a DataError.
    """
    root = Path(folder)
    found = sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))
    if not found:
        raise DataError(f"image folder '{root}' has no class subfolders (expected "
                        f"{root}/<class>/<image>)")
    names = tuple(found) if classes is None else tuple(classes)
    unknown = sorted(set(found) - set(names))
    if unknown:
        raise DataError(f"image folder '{root}' has class folder(s) {unknown} that the training "
                        f"folder does not ({', '.join(names)})")
    paths: list[str] = []
    labels: list[int] = []
    for c in found:
        for base, dirs, files in os.walk(root / c, followlinks=True):
            dirs.sort()
            for f in sorted(files):
                if f.lower().endswith(EXTENSIONS):
                    paths.append(os.path.join(base, f))
                    labels.append(names.index(c))
    if not paths:
        raise DataError(f"image folder '{root}' has no images (extensions {', '.join(EXTENSIONS)})")
    return np.array([p.encode() for p in paths]), np.asarray(labels, np.int64), names


def split_folders(root: str | os.PathLike) -> dict[str, Path] | None:
    """``{"train": ..., "val": ..., "test": ...}`` (the present ones) when ``root`` holds the
    user's own splits (a ``train/`` folder), else None (one folder of class folders)."""
    r = Path(root)
    if not (r / "train").is_dir():
        return None
    out = {"train": r / "train"}
    for key, names in (("val", VAL_NAMES), ("test", ("test",))):
        for n in names:
            if (r / n).is_dir():
                out[key] = r / n
                break
    return out


def decode_eval(paths: np.ndarray, pre: Preprocess, channels: int) -> np.ndarray:
    """Photos -> uint8 N x H x W x C by the evaluation transform (two decoding threads)."""
    h, w = pre.crop
    out = np.empty((len(paths), h, w, channels), np.uint8)

    def one(i: int) -> None:
        out[i] = prepare(paths[i].decode(), pre, channels)

    with ThreadPoolExecutor(_DECODE_THREADS) as pool:
        list(pool.map(one, range(len(paths))))
    return out


class FolderDataset(torch.utils.data.Dataset):
    """Photos decoded on each access: normalised float32 ``[C, H, W]`` and the int64 label.

    ``augment``: ``random_resized_crop`` (training) or ``none`` (the evaluation transform).
    ``y`` holds every label (what stratification and class counts read); ``paths`` the files.
    """

    def __init__(self, paths: np.ndarray, y: np.ndarray, spec: InputSpec, augment: str,
                 crop_scale: tuple[float, float] = (0.25, 1.0), cache=None) -> None:
        if spec.preprocess is None:
            raise DataError("a photo folder's input spec must record its evaluation transform")
        self.paths = paths
        self.y = torch.as_tensor(np.asarray(y, np.int64))
        self.spec = spec
        self.augment = augment
        self.crop_scale = tuple(crop_scale)
        self.cache = cache  # trainer.photo_cache.PhotoCache (data.cache: memmap) or None
        self._mean = torch.tensor(spec.mean, dtype=torch.float32).view(-1, 1, 1)
        self._std = torch.tensor(spec.std, dtype=torch.float32).view(-1, 1, 1)
        self._train = None

    def __len__(self) -> int:
        return len(self.paths)

    def _train_transform(self):
        if self._train is None:  # built in the worker that uses it (v2 transforms pickle, but lazily is simpler)
            from torchvision.transforms import InterpolationMode, v2

            size = self.spec.preprocess.crop
            interp = InterpolationMode[self.spec.preprocess.interpolation.upper()]
            self._train = v2.Compose([
                v2.RandomResizedCrop(size, scale=self.crop_scale, interpolation=interp, antialias=True),
                v2.RandomHorizontalFlip()])
        return self._train

    def raw(self, index: int) -> np.ndarray:
        """One photo as the model's uint8 ``H x W x C`` input (this split's transform)."""
        pre, channels = self.spec.preprocess, self.spec.channels
        if self.cache is not None:  # the photo already resized to pre.resize (shorter side)
            a = self.cache.photo(index)
            if self.augment == "none":  # the evaluation's crop of the same resized pixels
                return np.array(centre(a, pre))
            t = self._train_transform()(torch.from_numpy(np.array(a)).permute(2, 0, 1))
            return t.permute(1, 2, 0).numpy()
        path = self.paths[index].decode()
        if self.augment == "none":
            return prepare(path, pre, channels)
        img = self._train_transform()(open_image(path, channels, pre.exif))
        a = np.asarray(img, dtype=np.uint8)
        return a[..., None] if a.ndim == 2 else a

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tensor(self.raw(index)).permute(2, 0, 1).float()  # Pillow arrays are read-only
        return (x - self._mean) / self._std, self.y[index]

    def subset(self, indices: np.ndarray, augment: str | None = None) -> FolderDataset:
        idx = np.asarray(indices, np.int64)
        return FolderDataset(self.paths[idx], self.y.numpy()[idx], self.spec,
                             self.augment if augment is None else augment, self.crop_scale,
                             None if self.cache is None else self.cache.subset(idx))


# --------------------------------------------------------------------------- splits


def load_folder(cfg, spec: InputSpec | None = None):
    """:func:`trainer.data.load_data` for ``imagefolder:<root>``: the training split streamed
    (:class:`FolderDataset`), validation and test decoded once by the evaluation transform."""
    from trainer.data import (ArrayDataset, DataSplits, _carried_spec, _channel_stats,
                              _stratified_split)

    root = Path(os.path.expanduser(cfg.source[len("imagefolder:"):]))
    if not root.is_dir():
        raise DataError(f"image folder '{root}' not found (cwd: {os.getcwd()}); expected "
                        "<root>/<class>/<image>, or <root>/train|val|test/<class>/<image>")
    folders = split_folders(root)
    paths, y, classes = find_images(folders["train"] if folders else root)
    held: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key in ("val", "test"):
        if folders and key in folders:
            p, yy, _ = find_images(folders[key], classes)
            held[key] = (p, yy)
    carve = [k for k in ("val", "test") if k not in held]
    fractions = {"val": cfg.val_fraction, "test": cfg.test_fraction}
    parts = _stratified_split(y, len(classes), [fractions[k] for k in carve], cfg.split_seed)
    for key, idx in zip(carve, parts[1:]):
        held[key] = (paths[idx], y[idx])
    paths, y = paths[parts[0]], y[parts[0]]
    sizes = f"{len(paths)} train / {len(held['val'][0])} val / {len(held['test'][0])} test"
    if folders:
        used = ", ".join(f"{folders[k].name}/" for k in ("train", "val", "test") if k in folders)
        note = (f"{cfg.source}: the folder's own splits ({used}" + (f"; {' and '.join(carve)} "
                f"carved from train, split seed {cfg.split_seed}" if carve else "") + f"): {sizes}")
    else:
        note = f"{cfg.source}: one folder, stratified split (seed {cfg.split_seed}): {sizes}"
    if not all(len(held[k][0]) for k in ("val", "test")):
        raise DataError(f"image folder '{root}' has too few photos for non-empty splits ({sizes})")
    pre = Preprocess.centre(cfg.image_size, cfg.crop_fraction)
    channels = 3  # photos are decoded as RGB (grey and CMYK files converted by Pillow)
    if cfg.mean is not None:
        if len(cfg.mean) != channels:
            raise DataError(f"data.mean / data.std: expected {channels} values (RGB), got "
                            f"{len(cfg.mean)}")
        mean, std = tuple(map(float, cfg.mean)), tuple(map(float, cfg.std))
    else:  # a fixed seeded sample: a later export re-measures the same numbers
        pick = np.sort(np.random.default_rng(cfg.split_seed).permutation(len(paths))[:cfg.stats_samples])
        mean, std = _channel_stats(decode_eval(paths[pick], pre, channels), (0.0, 255.0))
    found = InputSpec(shape=(1, *pre.crop, channels), dtype="uint8", value_range=(0.0, 255.0),
                      mean=mean, std=std, classes=classes, preprocess=pre)
    spec = _carried_spec(found, spec, cfg.source, cfg.split_seed)
    augment = {"auto": "random_resized_crop"}.get(cfg.augment, cfg.augment)
    if augment not in ("random_resized_crop", "none"):
        raise DataError(f"data.augment {cfg.augment!r} is a recipe for in-memory 32 px images; "
                        "a photo folder takes random_resized_crop, none or auto")
    evals = {k: ArrayDataset.from_raw(decode_eval(p, pre, channels), yy, spec)
             for k, (p, yy) in held.items()}
    cache = None
    if cfg.cache == "memmap":  # decoded once at the training resolution (trainer.photo_cache)
        from trainer.photo_cache import build

        cache = build(paths, spec.preprocess, channels, cfg.cache_dir, log=lambda m: None)
        note += f"; decoded cache {cache.file} ({cache.nbytes / 1e6:.0f} MB)"
    return DataSplits(train=FolderDataset(paths, y, spec, augment, tuple(cfg.crop_scale), cache),
                      val=evals["val"], test=evals["test"], spec=spec, source=cfg.source,
                      split_seed=cfg.split_seed, note=note)


def ood_folder(source: str, spec: InputSpec) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 photos by ``spec``'s evaluation transform, the folder's own labels) of an
    ``imagefolder:<root>`` used as evaluation or OOD data: its ``test/`` split when it has
    the user's splits, else every photo."""
    root = Path(os.path.expanduser(source[len("imagefolder:"):]))
    if not root.is_dir():
        raise DataError(f"image folder '{root}' not found (cwd: {os.getcwd()})")
    folders = split_folders(root)
    paths, y, _ = find_images(folders.get("test", folders["train"]) if folders else root)
    pre = spec.preprocess or Preprocess.centre(spec.shape[1])
    return decode_eval(paths, pre, spec.channels), y
