"""What ``predict`` accepts: :class:`InputSpec`, the project's one input spec: the training
split defines it, the checkpoint carries it, quantize and export cross-check reloaded data
against it, and the manifest's ``input`` is it.

stdlib + pyyaml only (numpy only inside :meth:`InputSpec.normalize`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edge_sdk.bundle.records import INPUT_DTYPES, LAYOUTS, _Record, _record
from edge_sdk.errors import BundleError, DataError, InputSpecError, InputSpecMismatchError
from edge_sdk.validation import (
    FLOAT32_MAX,
    choice,
    f32_value,
    fail,
    got,
    int_value,
    join,
    list_value,
    show,
)

if TYPE_CHECKING:  # imported where a transform is parsed: the bundle's import chain stays short
    from edge_sdk.bundle.preprocess import Preprocess


@dataclass(frozen=True, kw_only=True)
class InputSpec(_Record):
    """What ``predict`` accepts, before normalisation: model input = (raw - mean) / std.

    The project's one input spec. The training split defines it (``trainer.data.load_data``:
    shape, dtype, value range, per-channel mean and std of the training split, and the class
    names as ``classes``); the checkpoint carries it under ``input_spec``; quantize and export
    cross-check reloaded data against it (:meth:`check_matches`) instead of recomputing it; the
    manifest's ``input`` is the same record without ``classes`` (a manifest names its classes
    in the top-level ``labels``). Errors are :class:`~edge_sdk.errors.InputSpecError`, both a
    ``BundleError`` and a ``DataError``.
    """

    shape: tuple[int, ...]  # (1, H, W, C): one NHWC sample as the device feeds it
    layout: str = "NHWC"  # the TFLite convention
    dtype: str  # "uint8" | "float32": raw input dtype on the device
    value_range: tuple[float, float]  # raw pixel range, e.g. (0, 16) digits, (0, 255) images
    mean: tuple[float, ...]  # per channel, raw units, from the TRAINING split
    std: tuple[float, ...]
    # the training data's class names (checkpoints); None in a manifest, whose labels hold them
    classes: tuple[str, ...] | None = field(default=None, metadata={"manifest": False})
    # (schema version 9) a photo model's evaluation transform (resize, centre crop): the
    # runtime applies it to image files and uint8 arrays of any size; None: inputs come at
    # ``shape`` already
    preprocess: Preprocess | None = None

    @property
    def channels(self) -> int:
        return self.shape[3]

    @property
    def num_classes(self) -> int:
        if self.classes is None:
            raise InputSpecError("this input spec carries no class names (a manifest's input: "
                                 "the manifest's labels name the classes)")
        return len(self.classes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "") -> InputSpec:
        try:
            return super().from_dict(data, path)
        except InputSpecError:
            raise
        except BundleError as exc:
            raise InputSpecError(str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain data in schema key order; ``classes`` only when carried (never in a manifest),
        ``preprocess`` only when recorded."""
        out = super().to_dict()
        if self.classes is None:
            del out["classes"]
        if self.preprocess is None:
            del out["preprocess"]
        return out

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        try:
            return cls._parse_fields(v, path)
        except InputSpecError:
            raise
        except BundleError as exc:
            raise InputSpecError(str(exc)) from None

    @classmethod
    def _parse_fields(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        p = join(path, "shape")
        shape = tuple(
            int_value(x, f"{p}[{i}]", minimum=1) for i, x in enumerate(list_value(v["shape"], p, length=4))
        )
        if shape[0] != 1:
            fail(f"{p}[0]", f"expected batch dimension 1 (shape [1, H, W, C]), got {shape[0]}")
        layout = choice(v["layout"], join(path, "layout"), LAYOUTS)
        dtype = choice(v["dtype"], join(path, "dtype"), INPUT_DTYPES)
        p = join(path, "value_range")
        items = list_value(v["value_range"], p, length=2)
        lo, hi = (f32_value(x, f"{p}[{i}]") for i, x in enumerate(items))
        if not lo < hi:
            fail(p, f"expected [lo, hi] with lo < hi, got [{lo!r}, {hi!r}]")
        if dtype == "uint8" and not (0 <= lo and hi <= 255):
            fail(p, f"expected a range inside [0, 255] for dtype uint8, got [{lo!r}, {hi!r}]")
        channels = shape[3]
        p = join(path, "mean")
        mean = tuple(
            f32_value(x, f"{p}[{i}]") for i, x in enumerate(list_value(v["mean"], p, length=channels))
        )
        p = join(path, "std")
        std = tuple(
            f32_value(x, f"{p}[{i}]", positive=True)
            for i, x in enumerate(list_value(v["std"], p, length=channels))
        )
        for i, (m, s) in enumerate(zip(mean, std)):
            # the normalised input (raw - mean) / std must be a float32 too, at both ends
            reach = max(abs(lo - m), abs(hi - m))
            if reach / s > FLOAT32_MAX:
                fail(f"{p}[{i}]", f"(value_range - mean) / std overflows float32 with std "
                                  f"{s!r}: expected std >= {reach / FLOAT32_MAX:.4g}")
        classes = v["classes"]
        if classes is not None:
            p = join(path, "classes")
            items = list_value(classes, p, nonempty=True)  # a lone string is not a list of names
            for i, name in enumerate(items):
                if not isinstance(name, str):
                    fail(f"{p}[{i}]", f"expected a class name (string), {got(name)}")
            classes = tuple(str(name) for name in items)
        pre = v["preprocess"]
        if pre is not None:
            from edge_sdk.bundle.preprocess import Preprocess

            p = join(path, "preprocess")
            pre = _record(Preprocess, pre, p)
            if pre.crop != shape[1:3]:
                fail(join(p, "crop"), f"expected the input's [H, W] {list(shape[1:3])}, got "
                                      f"{list(pre.crop)}")
            if dtype != "uint8":
                fail(p, f"a photo transform makes uint8 pixels: expected dtype uint8, got {dtype}")
        return {
            "shape": shape,
            "layout": layout,
            "dtype": dtype,
            "value_range": (lo, hi),
            "mean": mean,
            "std": std,
            "classes": classes,
            "preprocess": pre,
        }

    def normalize(self, raw: Any) -> Any:
        """Raw NHWC input -> float32 NHWC model input, ``(raw - mean) / std`` (numpy); grey
        images may come as N x H x W (the channel axis is added, as for training data)."""
        import numpy as np  # numpy only here: the schema itself is stdlib + pyyaml

        raw = np.asarray(raw)
        if raw.ndim == 3 and self.channels == 1:
            raw = raw[..., None]
        if raw.ndim != 4 or raw.shape[1:] != self.shape[1:]:
            want = ", ".join(map(str, self.shape[1:]))
            raise DataError(f"expected raw input of shape (N, {want}), got {raw.shape}")
        mean = np.asarray(self.mean, dtype=np.float32)
        std = np.asarray(self.std, dtype=np.float32)
        return ((raw.astype(np.float32) - mean) / std).astype(np.float32)

    def mismatches(self, other: InputSpec) -> list[tuple[str, Any, Any]]:
        """``(field, this value, other value)`` for every field on which ``other`` differs.

        The statistics and the value range are computed in floating point, so they compare
        with a relative tolerance of 1e-6; everything else exactly. ``classes`` only when
        both specs carry them.
        """
        out: list[tuple[str, Any, Any]] = []
        for name in ("shape", "layout", "dtype", "value_range", "mean", "std", "classes",
                     "preprocess"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if name == "classes" and (mine is None or theirs is None):
                continue
            if name in ("value_range", "mean", "std"):
                same = len(mine) == len(theirs) and all(
                    math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(mine, theirs))
            else:
                same = mine == theirs
            if not same:
                out.append((name, mine, theirs))
        return out

    def check_matches(self, other: InputSpec, *, what: str, mine: str = "expected",
                      theirs: str = "found") -> None:
        """Raise :class:`~edge_sdk.errors.InputSpecMismatchError` when ``other`` differs from
        this spec (see :meth:`mismatches`), naming each differing field with both values, e.g.
        ``mean: the checkpoint (8.2,), the data (9.1,)``. ``what`` says what was compared."""
        diffs = self.mismatches(other)
        if diffs:
            listed = "; ".join(f"{name}: {mine} {_spec_value(a)}, {theirs} {_spec_value(b)}"
                               for name, a, b in diffs)
            raise InputSpecMismatchError(f"{what}: {listed}")


def _spec_value(value: Any) -> str:
    if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
        return "(" + ", ".join(f"{v:.9g}" for v in value) + ("," if len(value) == 1 else "") + ")"
    return show(value)
