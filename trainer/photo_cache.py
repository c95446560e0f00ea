"""``data.cache: memmap``: a photo folder's training split decoded once, at the training
resolution, into one memory-mapped file that the DataLoader workers read instead of JPEGs.

Measured first (benchmarks/photo_loader.py, clothing dataset, 2 cores): decoding a 400 x 533
JPEG costs 1.5 ms and RandomResizedCrop on it 0.8 ms per photo, and with torch's two threads on
the same two cores the streamed loader fed 0.61x the images per second of in-memory tensors at
128 px. From the cache a photo costs a slice of the file plus RandomResizedCrop on a 146-px
tensor (0.23 ms).

What is stored: every photo with its shorter side resized to the evaluation transform's
``resize`` (aspect kept, nothing cropped; :func:`edge_sdk.inputs.images.resize_shorter`, the
evaluation's own first step), concatenated as raw uint8 ``H x W x C`` in one
file; an index (offset, height, width per photo) beside it. Random crops then come from the
resized photo rather than the original (at 128 px from a 146-px shorter side): a crop of a
quarter of the area is upsampled ~1.75x, not downsampled ~1.6x.

The file is keyed by the photos (paths, sizes, modification times) and the transform, so a
changed folder or size builds a new one; written to a temporary name and renamed (a killed
build leaves no half file behind).
"""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from edge_sdk.bundle.preprocess import Preprocess
from edge_sdk.inputs.images import open_image, resize_shorter

DEFAULT_DIR = "~/.cache/edge-sdk/photos"


def _key(paths: np.ndarray, pre: Preprocess, channels: int) -> str:
    h = hashlib.sha256(json.dumps([pre.resize, pre.interpolation, pre.exif, channels]).encode())
    for p in paths:
        st = os.stat(p)
        h.update(p + b"\0" + f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def _resized(path: bytes, pre: Preprocess, channels: int) -> np.ndarray:
    a = np.asarray(resize_shorter(open_image(path.decode(), channels, pre.exif), pre), np.uint8)
    return a[..., None] if a.ndim == 2 else a


class PhotoCache:
    """The decoded photos of one split: ``photo(i)`` -> uint8 ``H x W x C`` (a view of the map)."""

    def __init__(self, file: Path, index: np.ndarray, channels: int) -> None:
        self.file, self.index, self.channels = file, index, channels
        self._map: np.ndarray | None = None  # opened lazily: in each worker, not pickled

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_map": None}

    def photo(self, i: int) -> np.ndarray:
        if self._map is None:
            self._map = np.memmap(self.file, np.uint8, "r")
        off, h, w = (int(v) for v in self.index[i])
        return self._map[off:off + h * w * self.channels].reshape(h, w, self.channels)

    def subset(self, idx: np.ndarray) -> PhotoCache:
        return PhotoCache(self.file, self.index[idx], self.channels)

    @property
    def nbytes(self) -> int:
        return int(self.file.stat().st_size)


def build(paths: np.ndarray, pre: Preprocess, channels: int, folder: str = DEFAULT_DIR,
          log=print) -> PhotoCache:
    """The cache of ``paths`` (reused when a file with the same key exists)."""
    root = Path(os.path.expanduser(folder))
    root.mkdir(parents=True, exist_ok=True)
    key = _key(paths, pre, channels)
    file, index_file = root / f"{key}.u8", root / f"{key}.index.npy"
    if file.is_file() and index_file.is_file():
        return PhotoCache(file, np.load(index_file), channels)
    index = np.zeros((len(paths), 3), np.int64)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f, ThreadPoolExecutor(2) as pool:
            off = 0
            # in order, two decoders ahead: Pillow releases the GIL while decoding
            for i, a in enumerate(pool.map(lambda p: _resized(p, pre, channels), paths)):
                index[i] = (off, a.shape[0], a.shape[1])
                f.write(a.tobytes())
                off += a.nbytes
            f.flush()
            os.fsync(f.fileno())
        np.save(root / f".{key}.index.{os.getpid()}.npy", index)
        os.replace(root / f".{key}.index.{os.getpid()}.npy", index_file)
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)
    log(f"data.cache: {len(paths)} photos decoded at shorter side {pre.resize} into {file} "
        f"({off / 1e6:.0f} MB)")
    return PhotoCache(file, index, channels)
