"""``edge-sdk run --input FILE``: a ``.npy`` array or an image, read into the model's raw input
space, or an :class:`InputError` in one line (never a traceback from numpy or Pillow).

Images are taken as they are: an image of another size or channel count than the model's is
refused unless ``resize=True`` (``--resize``), since silently squashing a 64x48 photo onto an
8x8 digit model answers confidently about nothing. Pixels are scaled by the image's bit depth
(8-bit by 255, 16-bit by 65535, 1-bit by 1) onto the model's raw value range.

A bundle that records its photo transform (``input.preprocess``) takes an image of any size:
it is decoded, resized and cropped by that transform (:func:`edge_sdk.inputs.images.prepare`,
what ``predict`` does with a path), and ``resize`` plays no part. A ``.npy`` array is returned
as stored either way (``predict`` prepares a uint8 photo of another size).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import InputError

if TYPE_CHECKING:
    from edge_sdk.bundle.input_spec import InputSpec

# Pillow modes -> (channels, largest value); "P" (palette) is expanded first
_MODES = {"1": (1, 1), "L": (1, 255), "LA": (2, 255), "RGB": (3, 255), "RGBA": (4, 255),
          "I;16": (1, 65535), "I;16L": (1, 65535), "I;16B": (1, 65535), "I": (1, 65535)}
_LUMA = np.array([0.299, 0.587, 0.114])  # ITU-R 601-2, as Pillow's convert("L")


def read_input(path: str, spec: InputSpec, resize: bool = False) -> npt.NDArray[Any]:
    """The array in ``path`` (a .npy file: as stored; an image: in ``spec``'s dtype, and with
    a recorded photo transform the model's uint8 input, prepared by it)."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"--input {path} is a directory; expected a .npy array or an image file")
    if not p.is_file():
        # say what it really is (a FIFO was reported as missing)
        kind = _special_kind(p)
        raise InputError(f"--input {path} {kind}; expected a .npy array or an image file")
    if p.suffix.lower() == ".npy":
        return _read_npy(p)
    if spec.preprocess is not None:  # a photo model: its own transform, any size
        from edge_sdk.inputs.images import prepare

        return prepare(p, spec.preprocess, spec.channels)  # InputError naming the file
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


_SNIFF = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"),
          (b"GIF8", "a GIF image"), (b"PK\x03\x04", "a zip archive (an .npz?)"),
          (b"\x80", "a Python pickle"), (b"BM", "a BMP image"), (b"\x7fELF", "an executable"))
# the largest array a run input may declare: a few samples of the biggest model input
_MAX_NPY_BYTES = 1 << 30


def _special_kind(p: Path) -> str:
    import stat

    try:
        mode = p.stat().st_mode
    except OSError:
        return "does not exist"
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return f"is {name}, not a regular file"
    return "is not a regular file"


def _sniff(head: bytes) -> str:
    for magic, name in _SNIFF:
        if head.startswith(magic):
            return name
    if not head:
        return "an empty file"
    try:
        head.decode("utf-8")
        return "a text file"
    except UnicodeDecodeError:
        return "binary data of an unknown kind"


def _check_npy_header(p: Path) -> None:
    """the header is read and checked before numpy allocates anything: a 137-byte
    file declaring 10**12 elements made np.load raise its own memory error (a traceback)."""
    fmt = np.lib.format
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(6)
            if head != b"\x93NUMPY":
                what = _sniff(head + f.read(58))
                raise InputError(f"--input {p} is not a .npy array: it is {what} (a .npy file "
                                 "starts with \\x93NUMPY)")
            f.seek(0)
            version = fmt.read_magic(f)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise InputError(f"--input {p}: .npy format version {version} is not one numpy "
                                 "writes (1.0, 2.0, 3.0)")
            read = {(1, 0): fmt.read_array_header_1_0}.get(version, fmt.read_array_header_2_0)
            shape, _, dtype = read(f, max_header_size=10_000)
            offset = f.tell()
    except InputError:
        raise
    except (OSError, ValueError, SyntaxError, TypeError, EOFError) as e:
        raise InputError(f"--input {p} is not a valid .npy file (its header: "
                         f"{' '.join(str(e).split())[:200]})") from None
    if dtype.hasobject:
        raise InputError(f"--input {p} holds Python objects (an object array); expected a "
                         "numeric array")
    count = 1
    for d in shape:
        count *= int(d)
    need = count * dtype.itemsize
    if need > _MAX_NPY_BYTES or need != size - offset:
        raise InputError(f"--input {p} declares a {dtype} array of shape {list(shape)} "
                         f"({need} bytes) but holds {size - offset} bytes of data"
                         + (f" (at most {_MAX_NPY_BYTES} accepted)" if need > _MAX_NPY_BYTES
                            else "") + ": truncated or not a .npy file numpy wrote")


def _read_npy(p: Path) -> npt.NDArray[Any]:
    _check_npy_header(p)
    try:
        x = np.load(p, allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise InputError(f"--input {p} holds Python objects (an object array); expected a "
                             f"numeric array") from None
        raise InputError(f"--input {p} is not a valid .npy file ({e})") from None
    except (OSError, EOFError, MemoryError) as e:
        raise InputError(f"--input {p} is not a valid .npy file ({e})") from None
    if not isinstance(x, np.ndarray):
        raise InputError(f"--input {p} is not a single .npy array (got {type(x).__name__})")
    return x


def _read_image(p: Path) -> npt.NDArray[np.float64]:
    try:
        from PIL import Image
    except ImportError as e:
        raise InputError(f"reading {p.suffix} images needs Pillow: pip install "
                         f"'nested-edge-sdk[image]' (or pass a .npy array)") from e
    try:
        with Image.open(p) as opened:
            opened.load()
            img: Image.Image = opened
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


def _resized(arr: npt.NDArray[np.float64], h: int, w: int, c: int) -> npt.NDArray[np.float64]:
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
                         .resize((w, h), Image.Resampling.BILINEAR)) for i in range(c)]
    return np.clip(np.stack(planes, -1).astype(np.float64), 0.0, 1.0)
