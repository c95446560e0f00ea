"""What ``predict`` accepts from a bundle whose manifest records its photo transform
(``input.preprocess``, schema version 9): :class:`PhotoChecker`, the :class:`InputChecker` that
also takes photos and turns each into the model's input with
:func:`edge_sdk.inputs.images.prepare` (Pillow), exactly as the exporter's evaluation did.

The rule: an array of the model's exact input shape (``[H, W, C]``, or ``[H, W]`` for a grey
model) *is* the model's input and is checked as for any bundle; anything else is a photo: an
image file's path (``str`` or ``os.PathLike``), a Pillow image, or a uint8 ``H x W x C`` (or
grey ``H x W``) array of any size. A batch is ``[N, H, W, C]`` as for any bundle, or a sequence
of such samples and photos (a list, or a uint8 ``[N, h, w, C]`` array of other-sized photos),
each prepared. A bundle without a recorded transform keeps the plain :class:`InputChecker`:
nothing here runs for it, and the exact-shape array takes the same lean path for both.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import ConfigError, InputError
from edge_sdk.inputs.checks import InputChecker
from edge_sdk.inputs.images import prepare
from edge_sdk.validation import show

if TYPE_CHECKING:
    from PIL import Image

    from edge_sdk.bundle.input_spec import InputSpec
    from edge_sdk.bundle.preprocess import Preprocess

__all__ = ["PhotoChecker", "Sample", "Samples", "input_checker"]

#: What ``predict`` takes: an array (the model's input, or a photo), an image file's path or a
#: Pillow image (the last two, and arrays of other sizes, with a recorded transform only)
Sample = Union["npt.ArrayLike", "os.PathLike[str]", "Image.Image"]
#: What ``predict_batch`` takes: ``[N, H, W, C]``, or a sequence of samples
Samples = Union["npt.ArrayLike", Sequence[Sample]]

_PHOTO = ("a photo, which this bundle resizes and crops by its recorded transform, is an image "
          "file, a Pillow image, or a uint8 H x W x C (C = 1, 3 or 4) or H x W array of any size")


def input_checker(spec: InputSpec) -> InputChecker:
    """The checker of ``spec``'s inputs: a :class:`PhotoChecker` when it records a photo
    transform, else the plain :class:`InputChecker`."""
    return InputChecker(spec) if spec.preprocess is None else PhotoChecker(spec)


def _is_image(x: object) -> bool:
    """Whether ``x`` is a Pillow image (by its class, without importing Pillow)."""
    return any(c.__module__.startswith("PIL.") and c.__name__ == "Image"
               for c in type(x).__mro__)


class PhotoChecker(InputChecker):
    """An :class:`InputChecker` that also takes photos, prepared by the bundle's
    :class:`~edge_sdk.bundle.preprocess.Preprocess` (the module docstring gives the rule).
    Only the fallbacks of the one-sample and batch checks (``_sample``, ``_batch``) differ:
    an exact-shape array never reaches them."""

    def __init__(self, spec: InputSpec) -> None:
        super().__init__(spec)
        if spec.preprocess is None:
            raise ConfigError("PhotoChecker needs an input spec with a photo transform "
                             "(input.preprocess): use input_checker(spec)")
        self.pre: Preprocess = spec.preprocess
        self.channels = spec.channels
        # Pillow and its common decoders load here, at load(), not inside the first photo
        # call's latency_ms (60-130 ms measured), which the policy would learn
        try:
            from PIL import Image, ImageOps  # noqa: F401
        except ImportError:
            return  # arrays of the input's shape need none; a photo says what to install
        Image.preinit()

    def photo(self, x: Any, what: str) -> npt.NDArray[Any]:
        """One sample as the model's input: an array of the input's shape as it is (a batch
        of them too, which the plain check refuses with its message), a photo prepared (uint8
        ``[H, W, C]``); InputError for a 4-d array of another shape and for what is neither."""
        if isinstance(x, (str, os.PathLike)) or _is_image(x):
            return prepare(x, self.pre, self.channels)
        arr = self._array(x, what, None)  # masked arrays, None, ragged lists: as for any bundle
        if arr.shape == self.want or (self.grey is not None and arr.shape == self.grey):
            return arr  # the model's input: checked as for any bundle
        if arr.ndim == 4:
            if self.is_batch(arr.shape):
                return arr  # a batch of inputs: the plain check says use predict_batch()
            raise InputError(f"{what} has shape {list(arr.shape)}: expected one sample, the "
                             f"model's input {self._shape()} or one photo ({_PHOTO}); "
                             f"predict_batch() takes several")
        if arr.dtype != np.uint8 or arr.ndim not in (2, 3) or (
                arr.ndim == 3 and arr.shape[2] not in (1, 3, 4)):
            raise InputError(f"{what} is a {arr.dtype} array of shape {list(arr.shape)}: "
                             f"neither the model's input {self._shape()} nor a photo; {_PHOTO}")
        return prepare(arr, self.pre, self.channels)

    def _not_an_array(self, x: object, what: str, n: str | None) -> str:
        if x is None:
            return super()._not_an_array(x, what, n)
        shape = self._shape() if n is None else self._shape(n)
        return (f"{what} is {type(x).__name__} ({show(x)}): expected the model's input "
                f"{shape} or a photo ({_PHOTO})")

    def _sample(self, x: npt.ArrayLike, what: str) -> npt.NDArray[Any]:
        return super()._sample(self.photo(x, what), what)

    def _batch(self, xs: npt.ArrayLike, what: str) -> npt.NDArray[Any]:
        items = self._items(xs, what)
        if items is None:
            return super()._batch(xs, what)
        prepared = []
        for i, x in enumerate(items):
            a = self.photo(x, f"{what}[{i}]")
            if self.grey is not None and a.shape == self.grey:
                a = a[..., None]
            if a.shape != self.want:  # (a batch inside the sequence)
                raise InputError(f"{what}[{i}] has shape {list(a.shape)}: expected one sample, "
                                 f"the model's input {self._shape()} or a photo")
            prepared.append(a)
        return super()._batch(np.stack(prepared) if prepared else np.asarray(items), what)

    def _items(self, xs: Any, what: str) -> Sequence[Any] | None:
        """The samples of a batch given as photos (None: the plain batch form, or something
        the plain check refuses)."""
        if isinstance(xs, (str, os.PathLike)) or _is_image(xs):
            raise InputError(f"{what} is one photo ({show(xs)}); predict_batch() takes a "
                             f"sequence of them (a list), predict() takes one")
        if isinstance(xs, np.ndarray) and not isinstance(xs, np.ma.MaskedArray):
            if not (xs.ndim == 4 or (self.grey is not None and xs.ndim == 3)) \
                    or self.is_batch(xs.shape) or not len(xs):
                return None
            return list(xs)  # [N, h, w, C] (grey: [N, h, w]) photos of another size
        if isinstance(xs, Sequence) and not isinstance(xs, bytes):
            return xs
        return None
