"""What the runtime accepts as input, checked against the manifest's input spec before anything
runs: shape (NHWC; a grey model also takes the image without its channel axis), dtype (the
declared one: a uint8 model refuses floats, which are usually an image pre-scaled to [0, 1]),
finite values inside the declared raw range, no masked arrays (the mask would be ignored).
Every refusal is an :class:`InputError` naming what was wrong and what was expected."""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import InputError
from edge_sdk.validation import show

if TYPE_CHECKING:
    from edge_sdk.bundle.input_spec import InputSpec

Normalised = npt.NDArray[np.float32]

_UINT8 = np.dtype(np.uint8)
_FLOAT32 = np.dtype(np.float32)


class InputChecker:
    """Validates and normalises samples for one bundle's input spec."""

    def __init__(self, spec: InputSpec) -> None:
        std = np.asarray(spec.std, np.float32)
        self.want: tuple[int, ...] = tuple(spec.shape[1:])
        # (raw - mean) / std as one multiply-add, per channel: what the runtime's graphs do
        # (edge_sdk/answers/graph.py, RawInput) and _values does for a slice's own graph
        c = self.want[-1]
        scale = np.broadcast_to((1.0 / std).astype(np.float32), (c,))
        shift = np.broadcast_to((-np.asarray(spec.mean, np.float32) / std).astype(np.float32),
                                (c,))
        self.scale_c = tuple(float(v) for v in scale)
        self.shift_c = tuple(float(v) for v in shift)
        # spread over a whole sample: broadcasting a 3-channel vector makes numpy
        # run its inner loop 3 elements at a time (11 us for a 32x32x3 image, 2.5 us contiguous)
        self._scale = np.ascontiguousarray(np.broadcast_to(scale, self.want))
        self._shift = np.ascontiguousarray(np.broadcast_to(shift, self.want))
        self.grey: tuple[int, ...] | None = self.want[:2] if self.want[2] == 1 else None  # [H, W] is accepted too
        self.dtype = spec.dtype
        self.range = lo, hi = spec.value_range
        self._lo = lo - 1e-6 * max(1.0, abs(lo))
        self._hi = hi + 1e-6 * max(1.0, abs(hi))
        # a uint8 array cannot leave a declared range that covers 0..255: no min/max pass
        self._any_uint8 = self._lo <= 0 and self._hi >= 255
        # what the runtime's interpreters take: the raw values in the bundle's
        # input dtype; the graph normalises them (edge_sdk/answers/graph.py, RawInput)
        self.feed_dtype = _UINT8 if self.dtype == "uint8" else _FLOAT32

    def _shape(self, n: str = "") -> str:
        lead = f"{n}, " if n else ""
        return f"[{lead}{', '.join(map(str, self.want))}]"

    def _grey_shape(self, n: str = "") -> str:
        if not self.grey:
            return ""
        lead = f"{n}, " if n else ""
        return f"[{lead}{', '.join(map(str, self.grey))}] for " + ("grey images" if n else
                                                                   "a grey image")

    def _array(self, x: npt.ArrayLike, what: str, n: str | None) -> npt.NDArray[Any]:
        """``x`` as an ndarray; ``n``: the batch axis' name in messages (None: one sample)."""
        if isinstance(x, np.ma.MaskedArray):
            shape = self._shape() if n is None else self._shape(n)
            raise InputError(f"{what} is a masked array: the runtime cannot honour a mask; fill "
                             f"the masked values (x.filled(...)) and pass a plain array {shape}")
        if type(x) is np.ndarray:
            return x
        if x is None or isinstance(x, (str, bytes, os.PathLike)):
            # np.asarray makes a 0-d array of either, reported as "got []" before
            raise InputError(self._not_an_array(x, what, n))
        try:
            arr = np.asarray(x)
        except (ValueError, TypeError) as e:  # ragged lists and the like
            shape = self._shape() if n is None else self._shape(n)
            raise InputError(f"{what} must be an array of shape {shape}; got something that is "
                             f"not array-like ({e})") from e
        if arr.ndim == 0:  # a bare number or object: name it, not its shape []
            shape = self._shape() if n is None else self._shape(n)
            raise InputError(f"{what} must be an array of shape {shape}; got "
                             f"{type(x).__name__} {show(x)}, not an array")
        return arr

    def _not_an_array(self, x: object, what: str, n: str | None) -> str:
        """The refusal of None or a path: what was passed and what to pass instead."""
        shape = self._shape() if n is None else self._shape(n)
        call = "predict_batch()" if n else "predict()"
        if x is None:
            return (f"{what} is None; {call} takes the sample values: an array of shape "
                    f"{shape}")
        kind = "a path" if isinstance(x, os.PathLike) else type(x).__name__
        return (f"{what} is {kind} ({show(x)}), not an array: {call} takes the sample values "
                f"{shape}; read the file first: np.load(path) for a .npy array, or "
                f"edge_sdk.inputs.files.read_input(path, model.input_spec) for a .npy array or "
                f"an image (what `edge-sdk run --input` does)")

    def _values(self, arr: npt.NDArray[Any], what: str) -> Normalised:
        """``arr`` (of the declared shape, with or without a batch axis) checked and
        normalised."""
        return self._checked(arr, what) * self._scale + self._shift

    def _checked(self, arr: npt.NDArray[Any], what: str) -> npt.NDArray[Any]:
        """``arr`` checked (dtype, finite, inside the raw range) as raw values of
        :attr:`feed_dtype`."""
        dt = arr.dtype
        if dt is _UINT8 and self._any_uint8:  # the common case of uint8 bundles, kept lean
            return arr if self.feed_dtype is _UINT8 else arr.astype(np.float32)
        if dt.kind not in "uif" or dt == np.bool_:
            kind = "integer, e.g. uint8" if self.dtype == "uint8" else "uint8 or float"
            raise InputError(f"{what} must be numeric ({kind}), got dtype {arr.dtype}")
        if self.dtype == "uint8" and arr.dtype.kind == "f":
            a, b = self.range
            raise InputError(
                f"{what} has dtype {arr.dtype}, but this bundle declares uint8 input (raw values "
                f"{a:g}..{b:g}); pass the integer pixel values, not an image scaled to [0, 1]")
        # the extremes by argmin / argmax (0.6 us on 64 values, the min / max reductions 1.9:
        # the SDK's own time); both return a NaN's index when there is one and expose
        # +-inf, so this checks finiteness too; checked before the float32 cast, so a huge
        # float64 is reported as out of range
        lo, hi = float(arr.item(arr.argmin())), float(arr.item(arr.argmax()))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise InputError(f"{what} contains NaN or infinite values"
                             + self._rows(arr, ~np.isfinite(arr), "with one"))
        if lo < self._lo or hi > self._hi:
            a, b = self.range
            raise InputError(f"{what} values must lie in the raw range [{a:g}, {b:g}] "
                             f"(before normalisation), got [{lo:g}, {hi:g}]"
                             + self._rows(arr, (arr < self._lo) | (arr > self._hi),
                                          "outside it"))
        return arr.astype(self.feed_dtype, copy=False)

    def _rows(self, arr: npt.NDArray[Any], bad: npt.NDArray[np.bool_], which: str) -> str:
        """Which rows of a batch ``bad`` marks: the first and how many (a NaN somewhere in
        10,000 rows is found by its index). Computed on the error path only: an accepted
        batch pays nothing for it. One sample: nothing to add."""
        if arr.ndim != len(self.want) + 1:
            return ""
        rows = np.flatnonzero(bad.reshape(len(arr), -1).any(axis=1))
        if not len(rows):  # (cannot happen: the caller found a bad value)
            return ""
        return f": row {rows[0]} (the first of {len(rows)} of {len(arr)} rows {which})"

    def one(self, x: Any, what: str = "x") -> Normalised:
        """One sample -> normalised float32 ``[1, H, W, C]``: what a slice's own graph takes
        (benchmarks, tests; the runtime feeds :meth:`feed`'s raw values)."""
        return self._values(self._sample(x, what), what)[None]

    def feed(self, x: Any, what: str = "x") -> npt.NDArray[Any]:
        """One sample -> checked raw values ``[1, H, W, C]`` of :attr:`feed_dtype`, what the
        runtime's interpreters take (their graphs normalise: edge_sdk/answers/graph.py)."""
        if type(x) is np.ndarray and x.shape == self.want:  # the common case, kept lean
            dt = x.dtype
            # _checked inline: a NaN fails both comparisons and an infinity the
            # range, so anything refused takes the general path (the message)
            if dt is self.feed_dtype and ((dt is _UINT8 and self._any_uint8) or (
                    self._lo <= x.item(x.argmin()) and x.item(x.argmax()) <= self._hi)):
                return x[None]
            return self._checked(x, what)[None]
        return self._checked(self._sample(x, what), what)[None]

    def _sample(self, x: npt.ArrayLike, what: str) -> npt.NDArray[Any]:
        """``x`` as an array of the declared sample shape (a grey ``[H, W]`` given its
        channel axis), or the InputError naming the shape expected."""
        arr = self._array(x, what, None)
        if arr.shape != self.want:
            if self.grey is not None and arr.shape == self.grey:
                arr = arr[..., None]  # grey [H, W]: the channel axis, as for training data
            elif self.is_batch(arr.shape) and arr.shape[0] > 0:
                raise InputError(f"{what} has shape {list(arr.shape)}, a batch of "
                                 f"{arr.shape[0]}: predict() takes one sample of shape "
                                 f"{self._shape()}; use predict_batch() for a batch")
            else:
                grey = f"; or {self._grey_shape()}" if self.grey else ""
                raise InputError(f"{what} must have shape {self._shape()} (NHWC, one sample"
                                 f"{grey}), got {list(arr.shape)}")
        return arr

    def is_batch(self, shape: tuple[int, ...]) -> bool:
        return (len(shape) == len(self.want) + 1 and tuple(shape[1:]) == self.want) or (
            self.grey is not None and len(shape) == 3 and tuple(shape[1:]) == self.grey
            and tuple(shape) != self.want)

    def feed_batch(self, xs: Any, what: str = "xs") -> npt.NDArray[Any]:
        """``N`` samples -> checked raw values ``[N, H, W, C]`` of :attr:`feed_dtype`."""
        # the common case, kept lean as feed's (shape[1:] == want: ndim is len(want) + 1)
        if type(xs) is np.ndarray and xs.shape[1:] == self.want and len(xs):
            dt = xs.dtype
            if dt is self.feed_dtype and ((dt is _UINT8 and self._any_uint8) or (
                    self._lo <= xs.item(xs.argmin()) and xs.item(xs.argmax()) <= self._hi)):
                return np.ascontiguousarray(xs)
        return np.ascontiguousarray(self._checked(self._batch(xs, what), what))

    def _batch(self, xs: npt.ArrayLike, what: str) -> npt.NDArray[Any]:
        arr = self._array(xs, what, "N")
        if self.grey is not None and arr.ndim == 3 and arr.shape[1:] == self.grey:
            arr = arr[..., None]  # grey [N, H, W]
        if arr.ndim != len(self.want) + 1 or arr.shape[1:] != self.want or arr.shape[0] == 0:
            grey = f" (or {self._grey_shape('N')})" if self.grey else ""
            raise InputError(f"{what} must have shape {self._shape('N')} with N >= 1{grey}, "
                             f"got {list(arr.shape)}")
        return arr
