"""The manifest's ``input_stats`` (schema version 6): the training split's
per-channel statistics of the raw input, which :mod:`edge_sdk.inputs.stats` checks each call
against (what the numbers mean: that module)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_sdk.bundle.records import _Record
from edge_sdk.validation import f32_value, fail, join, list_value

__all__ = ["InputStats"]


def _floats(value: object, path: str, n: int) -> tuple[float, ...]:
    return tuple(f32_value(x, f"{path}[{i}]") for i, x in enumerate(list_value(value, path,
                                                                                length=n)))


def _bands(value: object, path: str, n: int) -> tuple[tuple[float, float], ...]:
    out = []
    for i, item in enumerate(list_value(value, path, length=n)):
        lo, hi = _floats(item, f"{path}[{i}]", 2)
        if not lo <= hi:
            fail(f"{path}[{i}]", f"expected [lo, hi] with lo <= hi, got [{lo!r}, {hi!r}]")
        out.append((lo, hi))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class InputStats(_Record):
    """The manifest's ``input_stats`` (schema version 6): per channel of the training split,
    in raw units (before normalisation)."""

    channels: int
    mean: tuple[float, ...]  # mean of the raw values
    q99: tuple[float, ...]  # 99th percentile of the raw values
    q999: tuple[float, ...]  # 99.9th percentile of the raw values
    # [lo, hi]: the 0.1st and 99.9th percentile over training samples of the sample's mean /
    # maximum of this channel
    sample_mean: tuple[tuple[float, float], ...]
    sample_max: tuple[tuple[float, float], ...]
    margin: float  # raw units each band is widened by on both sides

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        p = join(path, "channels")
        channels = v["channels"]
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            fail(p, f"expected a positive integer, got {channels!r}")
        margin = f32_value(v["margin"], join(path, "margin"))
        if not margin >= 0:
            fail(join(path, "margin"), f"expected a margin >= 0 (raw units), got {margin!r}")
        return {"channels": channels,
                **{k: _floats(v[k], join(path, k), channels) for k in ("mean", "q99", "q999")},
                **{k: _bands(v[k], join(path, k), channels)
                   for k in ("sample_mean", "sample_max")},
                "margin": margin}
