"""How a photo becomes the model's input: :class:`Preprocess`, the evaluation transform the
exporter measured with, recorded in the manifest's ``input.preprocess`` (schema version 9).

Resize so the shorter side is ``resize`` pixels (the longer side keeps the aspect ratio,
``int(resize * long / short)``: torchvision's ``Resize(int)``), then cut the centre ``crop``
(``top = round((h - crop_h) / 2)``: torchvision's ``CenterCrop``), with Pillow's
``interpolation`` filter; files are first turned upright by their EXIF orientation when
``exif`` is set. The pixels stay uint8: ``(raw - mean) / std`` is the input spec's, inside the
slice. :mod:`edge_sdk.inputs.images` applies it (Pillow, no torch); the trainer's evaluation
splits are made by the same function, so the device's input is the exporter's bit for bit.

stdlib only (the schema); Pillow is imported by :mod:`edge_sdk.inputs.images` alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_sdk.bundle.records import _Record
from edge_sdk.validation import bool_value, choice, fail, int_value, join, list_value

# Pillow's resampling filters by name (Image.Resampling.<NAME>)
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")


@dataclass(frozen=True, kw_only=True)
class Preprocess(_Record):
    """The evaluation transform of a photo model: shorter side -> ``resize``, centre ``crop``
    (``[H, W]``, the input's), Pillow ``interpolation``, EXIF orientation applied to files."""

    resize: int  # the shorter side after resizing, pixels (>= the crop's larger side)
    crop: tuple[int, int]  # [H, W] cut from the centre: the model input's height and width
    interpolation: str = "bilinear"
    exif: bool = True  # files are turned upright by their EXIF orientation tag first

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        p = join(path, "crop")
        crop = tuple(int_value(x, f"{p}[{i}]", minimum=1)
                     for i, x in enumerate(list_value(v["crop"], p, length=2)))
        resize = int_value(v["resize"], join(path, "resize"), minimum=1)
        if resize < max(crop):
            # a shorter side under the crop would need padding: no photo model wants that
            fail(join(path, "resize"), f"expected at least the crop's larger side "
                                       f"{max(crop)}, got {resize}")
        return {"resize": resize, "crop": crop,
                "interpolation": choice(v["interpolation"], join(path, "interpolation"),
                                        INTERPOLATIONS),
                "exif": bool_value(v["exif"], join(path, "exif"))}

    @classmethod
    def centre(cls, size: int, crop_fraction: float = 0.875,
               interpolation: str = "bilinear") -> Preprocess:
        """The usual photo transform: resize the shorter side to ``round(size /
        crop_fraction)``, cut the centre ``size x size`` (0.875: 128 px from 146, 224 from
        256, the ImageNet evaluation's ratio)."""
        return cls(resize=max(size, round(size / crop_fraction)), crop=(size, size),
                   interpolation=interpolation)
