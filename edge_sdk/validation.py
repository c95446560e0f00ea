"""Validation kit for YAML-shaped data (manifests, device profiles): typed checks that raise
:class:`~edge_sdk.errors.BundleError` naming the dotted key path and what was expected.

Each ``*_value`` check takes ``(value, path)`` and returns the normalised value or raises
``BundleError("path: expected ..., got <type> <short repr>")``. Callers that own another error
type (profiles) catch and re-raise. Error messages show at most 80 characters of a value
(:func:`show`), so an unvalidated value is never rendered in full.

stdlib only: runs on the device.
"""
from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Mapping
from typing import Any, NoReturn

from edge_sdk.errors import BundleError

__all__ = [
    "FLOAT32_MAX", "FLOAT32_TINY", "INT_MAX", "MAX_DEPTH", "MAX_NODES", "NodeBudget",
    "bool_value", "choice", "f32_value", "fail", "float_value", "got",
    "int_value", "join", "key_path", "list_value", "mapping", "optional_float", "plain",
    "real_value", "show", "str_value",
]

MAX_DEPTH = 64  # nesting of free-form values (source, ...)
MAX_NODES = 200_000  # values visited in free-form data (defuses YAML alias bombs)


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def key_path(path: str, key: object) -> str:
    """Path of a free-form mapping key: dotted when it reads as an identifier, else subscripted."""
    if isinstance(key, str) and key.isidentifier():
        return join(path, key)
    return f"{path}[{show(key)}]"


def fail(path: str, message: str) -> NoReturn:
    raise BundleError(f"{path}: {message}" if path else message)


# Bounded repr: a few items and characters of each container and string, so an error message
# never renders a whole unvalidated value (reprlib stops early; repr() would build all of it).
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 6, 6, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 40


def real_value(v: object) -> float | None:
    """``v`` as a float when it is a real number: a Python int or float, or a numpy integer or
    floating scalar (``np.float64(0.95)``, ``np.int64(50)``: what ``arr.mean()``, ``arr.max()``
    and a YAML or JSON reader via numpy hand back); None for anything else, bools included
    (``True`` is an int in Python and numpy's ``bool_`` is not a ``numbers.Real``, yet neither
    is ever a number of milliseconds, megabytes or a rate). A numpy float narrower than 64 bits
    is read as the shortest decimal that rounds to it (``str``): ``np.float32(0.95)`` is
    0.949999988 as a double, yet the caller wrote 0.95 (the bundle's thresholds are keyed by
    ``f"{0.95:g}"``, and ``np.float32(0.01)`` would fall below the conformal grid's 0.01). An
    int beyond float range is infinity (never OverflowError). Duck-typed on ``dtype``: no
    numpy import here."""
    if type(v) is float:  # the common cases first, one type() test each
        return v
    if type(v) is int:
        try:
            return float(v)
        except OverflowError:  # 10**400
            return math.inf if v > 0 else -math.inf
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    dtype = getattr(v, "dtype", None)
    if dtype is not None and dtype.kind == "f" and dtype.itemsize < 8:
        return float(str(v))
    try:
        return float(v)
    except (OverflowError, ValueError, TypeError):  # a huge Integral of another kind
        return math.inf


def show(value: object) -> str:
    """A repr of at most 80 characters, cheap whatever ``value`` is."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        text = f"<an integer of {value.bit_length()} bits>"  # str(int) is quadratic, and limited
    else:
        try:
            text = _REPR.repr(value)
        except Exception:  # noqa: BLE001 - a hostile __repr__ must not replace the real error
            text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def got(value: object) -> str:
    return f"got {type(value).__name__} {show(value)}"


# Every count a manifest or profile holds fits in int64; a larger integer is refused rather
# than overflowing float arithmetic (OverflowError) or str() (ValueError above 4300 digits) later.
INT_MAX = 2**63 - 1


def int_value(value: object, path: str, *, minimum: int | None = None,
              maximum: int = INT_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(path, f"expected an integer, {got(value)}")
    result = int(value)
    if minimum is not None and result < minimum:
        fail(path, f"expected an integer >= {minimum}, got {show(result)}")
    if result > maximum or result < -INT_MAX - 1:
        fail(path, f"expected an integer <= {maximum}, got {show(result)}")
    return result


def float_value(
    value: object,
    path: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(path, f"expected a number, {got(value)}")
    try:
        result = float(value)
    except OverflowError:  # an integer beyond float range
        fail(path, f"expected a finite number, got {show(value)}")
    if not math.isfinite(result):
        fail(path, f"expected a finite number, got {result}")
    if gt is not None and not result > gt:
        fail(path, f"expected a number > {gt:g}, got {result!r}")
    if ge is not None and not result >= ge:
        fail(path, f"expected a number >= {ge:g}, got {result!r}")
    if le is not None and not result <= le:
        fail(path, f"expected a number <= {le:g}, got {result!r}")
    return result


# What float32 can carry: a manifest number the runtime computes with in float32
# (input mean and std, temperatures, quantization scales) must be one, or it silently turns
# into inf, 0 or NaN there (std 1e-45 -> NaN probabilities, std 1e39 -> one answer for all)
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32


def f32_value(value: object, path: str, *, positive: bool = False, **bounds: float) -> float:
    """:func:`float_value` that float32 can carry: ``|x| <= 3.4e38`` and, with ``positive``,
    ``x >= 1.18e-38`` (float32's smallest normal: a divisor below it overflows)."""
    result = float_value(value, path, **bounds)
    if abs(result) > FLOAT32_MAX:
        fail(path, f"expected a number float32 can carry (|x| <= {FLOAT32_MAX:.4g}), got "
                   f"{result!r}")
    if positive and not result >= FLOAT32_TINY:
        fail(path, f"expected a positive number float32 can carry (>= {FLOAT32_TINY:.4g}, its "
                   f"smallest normal), got {result!r}")
    return result


def optional_float(value: object, path: str, **bounds: float) -> float | None:
    return None if value is None else float_value(value, path, **bounds)


def str_value(value: object, path: str) -> str:
    if not isinstance(value, str):
        fail(path, f"expected a string, {got(value)}")
    if not value:
        fail(path, "expected a non-empty string")
    return str(value)  # a plain str (subclasses do not survive yaml.safe_dump)


def bool_value(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        fail(path, f"expected true or false, {got(value)}")
    return value


def choice(value: object, path: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        fail(path, f"expected one of {', '.join(repr(c) for c in choices)}, {got(value)}")
    return str(value)


def list_value(value: object, path: str, *, length: int | None = None, nonempty: bool = False) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        fail(path, f"expected a list, {got(value)}")
    if length is not None and len(value) != length:
        fail(path, f"expected a list of {length} items, got {len(value)}: {show(list(value))}")
    if nonempty and not value:
        fail(path, "expected a non-empty list")
    return list(value)


def mapping(value: object, path: str) -> Mapping[Any, Any]:  # unchecked YAML: any keys
    if not isinstance(value, Mapping):
        fail(path, f"expected a mapping, {got(value)}")
    return value



class NodeBudget:
    """Counts values visited in free-form data, so alias-expanded YAML cannot blow up."""

    def __init__(self) -> None:
        self.left = MAX_NODES

    def spend(self, path: str) -> None:
        self.left -= 1
        if self.left < 0:
            fail(path, f"free-form data too large (more than {MAX_NODES} values)")


def plain(value: object, path: str, budget: NodeBudget, depth: int = 0) -> Any:
    """A deep copy of ``value`` made of plain YAML values (null, bool, int, float, str, list, map)."""
    budget.spend(path)
    if depth > MAX_DEPTH:
        fail(path, f"nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, numbers.Integral):
        return int_value(value, path)  # int64: it is written back and printed
    if isinstance(value, numbers.Real):
        result = float(value)
        if math.isnan(result):
            fail(path, "expected a plain YAML value, got NaN")
        return result
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                fail(path, f"mapping keys must be strings, got {type(key).__name__} {show(key)}")
            out[str(key)] = plain(item, key_path(path, key), budget, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [plain(item, f"{path}[{i}]", budget, depth + 1) for i, item in enumerate(value)]
    fail(
        path,
        "expected a plain YAML value (null, bool, int, float, str, list or mapping), "
        f"got {type(value).__name__}",
    )

