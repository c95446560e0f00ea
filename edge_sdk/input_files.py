"""``edge-sdk run --input FILE``: a ``.npy`` array or an image, read into the model's raw input
space, or an :class:`InputError` in one line (never a traceback from numpy or Pillow).

Images are taken as they are: an image of another size or channel count than the model's is
refused unless ``resize=True`` (``--resize``), since silently squashing a 64x48 photo onto an
8x8 digit model answers confidently about nothing. Pixels are scaled by the image's bit depth
(8-bit by 255, 16-bit by 65535, 1-bit by 1) onto the model's raw value range.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_sdk.errors import InputError

# Pillow modes -> (channels, largest value); "P" (palette) is expanded first
_MODES = {"1": (1, 1), "L": (1, 255), "LA": (2, 255), "RGB": (3, 255), "RGBA": (4, 255),
          "I;16": (1, 65535), "I;16L": (1, 65535), "I;16B": (1, 65535), "I": (1, 65535)}
_LUMA = np.array([0.299, 0.587, 0.114])  # ITU-R 601-2, as Pillow's convert("L")


def read_input(path: str, spec, resize: bool = False) -> np.ndarray:
    p = Path(path)
    if p.is_dir():
        raise InputError(f"--input {path} is a directory; expected a .npy array or an image file")
    if not p.is_file():
        raise InputError(f"--input {path} does not exist")
    if p.suffix.lower() == ".npy":
        return _read_npy(p)
    arr = _read_image(p)  # [h, w, channels] in [0, 1]
    _, h, w, c = spec.shape
    if arr.shape != (h, w, c):
        if not resize:
            raise InputError(
                f"--input {path} is a {arr.shape[1]}x{arr.shape[0]} image with {arr.shape[2]} "
                f"channel(s); the model takes {w}x{h} with {c} channel(s): pass --resize to "
                f"resize and convert it, or supply an image of that size")
        arr = _resized(arr, h, w, c)
    lo, hi = spec.value_range
    x = arr * (hi - lo) + lo
    if spec.dtype == "uint8":
        return np.clip(np.rint(x), 0, 255).astype(np.uint8)
    return x.astype(np.float32)


def _read_npy(p: Path) -> np.ndarray:
    try:
        x = np.load(p, allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise InputError(f"--input {p} holds Python objects (an object array); expected a "
                             f"numeric array") from None
        raise InputError(f"--input {p} is not a valid .npy file ({e})") from None
    except (OSError, EOFError) as e:
        raise InputError(f"--input {p} is not a valid .npy file ({e})") from None
    if not isinstance(x, np.ndarray):
        raise InputError(f"--input {p} is not a single .npy array (got {type(x).__name__})")
    return x


def _read_image(p: Path) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError as e:
        raise InputError(f"reading {p.suffix} images needs Pillow: pip install "
                         f"'nested-edge-sdk[image]' (or pass a .npy array)") from e
    try:
        with Image.open(p) as img:
            img.load()
            if img.mode == "P":
                img = img.convert("RGBA" if "transparency" in img.info else "RGB")
            if img.mode not in _MODES:
                raise InputError(f"--input {p}: image mode {img.mode} is not supported "
                                 f"(expected grey, RGB or RGBA, 1, 8 or 16 bits)")
            channels, top = _MODES[img.mode]
            arr = np.asarray(img, dtype=np.float64)
    except InputError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise InputError(f"--input {p} is not a readable image or .npy array ({e})") from None
    if img.mode == "I" and arr.max(initial=0) > 65535:
        raise InputError(f"--input {p}: 32-bit integer pixels are not supported")
    arr = arr.reshape(arr.shape[0], arr.shape[1], channels)
    return arr / top


def _resized(arr: np.ndarray, h: int, w: int, c: int) -> np.ndarray:
    """Channels converted (grey <-> RGB, alpha dropped), then each channel resized bilinearly
    in floating point (Pillow's 8-bit path would saturate 16-bit images)."""
    from PIL import Image

    have = arr.shape[2]
    if have in (2, 4):
        arr, have = arr[..., :have - 1], have - 1  # alpha dropped
    if c == 1 and have == 3:
        arr = (arr @ _LUMA)[..., None]
    elif c == 3 and have == 1:
        arr = np.repeat(arr, 3, axis=2)
    planes = [np.asarray(Image.fromarray(arr[..., i].astype(np.float32), mode="F")
                         .resize((w, h), Image.BILINEAR)) for i in range(c)]
    return np.clip(np.stack(planes, -1).astype(np.float64), 0.0, 1.0)
