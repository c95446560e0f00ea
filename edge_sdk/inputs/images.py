"""A photo -> the model's uint8 input, by the bundle's recorded :class:`Preprocess` (Pillow,
no torch): what ``predict`` does with an image file or a uint8 ``H x W x C`` array of any size
when the manifest records a transform, and what the trainer's evaluation splits are made with,
so both sides compute the same bytes.

Decoding: ``Image.open`` -> (EXIF orientation) -> ``convert("RGB")`` (``"L"`` for one-channel
models): a palette, grey, CMYK or alpha image becomes the model's colour space the way
Pillow converts it.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import InputError

if TYPE_CHECKING:
    from PIL import Image
    from PIL.Image import Image as PILImage  # (inside the functions, Image is the module)

    from edge_sdk.bundle.preprocess import Preprocess

PathLike = Union[str, "os.PathLike[str]"]


def _pil() -> Any:
    try:
        from PIL import Image, ImageOps
    except ImportError as e:
        raise InputError("photos need Pillow: pip install 'nested-edge-sdk[image]'") from e
    return Image, ImageOps


def open_image(path: PathLike, channels: int = 3, exif: bool = True) -> Image.Image:
    """A decoded image file in the model's colour space (``RGB``, or ``L`` for 1 channel),
    turned upright by its EXIF orientation when ``exif``; InputError naming the file when it
    is not a readable image."""
    Image, ImageOps = _pil()
    mode = "L" if channels == 1 else "RGB"
    try:
        with Image.open(path) as opened:
            img: PILImage = opened
            # exif_transpose copies even an upright photo: called only when the tag says turn
            if exif and opened.getexif().get(0x0112, 1) not in (None, 1):
                img = ImageOps.exif_transpose(opened)
            if img.mode == mode:  # convert() would copy the decoded pixels once more
                img.load()
                return img
            out: PILImage = img.convert(mode)  # loads the pixels
            return out
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise InputError(f"{os.fspath(path)} is not a readable image ({e})") from None


def from_array(x: Any, channels: int = 3) -> Image.Image:
    """A uint8 ``H x W x C`` (or ``H x W`` grey) array as an image in the model's colour
    space; InputError naming the shape or dtype otherwise."""
    Image, _ = _pil()
    a = np.asarray(x)
    if a.dtype != np.uint8 or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (1, 3, 4)):
        raise InputError(f"expected a photo as a uint8 H x W x C array (C = 1, 3 or 4) or an "
                         f"image file, got a {a.dtype} array of shape {a.shape}")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    mode = "L" if a.ndim == 2 else ("RGB" if a.shape[2] == 3 else "RGBA")
    img: PILImage = Image.fromarray(np.ascontiguousarray(a), mode)
    return img.convert("L" if channels == 1 else "RGB")


def resize_shorter(img: Image.Image, pre: Preprocess) -> Image.Image:
    """Shorter side -> ``pre.resize``, aspect kept (the long side truncated: torchvision's
    ``Resize(int)``); the image itself when it has that size already."""
    Image, _ = _pil()
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(pre.resize * long / short)
    size = (pre.resize, new_long) if w <= h else (new_long, pre.resize)
    if size == (w, h):
        return img
    out: PILImage = img.resize(size, getattr(Image.Resampling, pre.interpolation.upper()))
    return out


def centre(a: npt.NDArray[np.uint8], pre: Preprocess) -> npt.NDArray[np.uint8]:
    """The centre ``pre.crop`` of an ``H x W (x C)`` array (torchvision's ``CenterCrop``
    offsets), ``H x W x C``."""
    (ch, cw), (h, w) = pre.crop, a.shape[:2]
    top, left = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
    out = a[top:top + ch, left:left + cw]
    return out[..., None] if out.ndim == 2 else out


def resize_centre(img: Image.Image, pre: Preprocess) -> npt.NDArray[np.uint8]:
    """Shorter side -> ``pre.resize`` (aspect kept), centre ``pre.crop``: ``H x W x C`` uint8."""
    return np.ascontiguousarray(centre(np.asarray(resize_shorter(img, pre), dtype=np.uint8), pre))


def prepare(x: Any, pre: Preprocess, channels: int = 3) -> npt.NDArray[np.uint8]:
    """One photo (a path, a Pillow image, or a uint8 ``H x W x C`` array of any size) ->
    the model's uint8 input ``crop_h x crop_w x channels``, exactly as the exporter evaluated."""
    if isinstance(x, (str, os.PathLike)):
        img = open_image(x, channels, pre.exif)
    elif hasattr(x, "convert") and hasattr(x, "size"):  # a Pillow image, as given
        img = x.convert("L" if channels == 1 else "RGB")
    else:
        img = from_array(x, channels)
    return resize_centre(img, pre)
