"""The output shapes of the ops issue 35 added to the graph description (edge_sdk/graph.py's
:func:`~edge_sdk.graph.infer_shape` calls :func:`out_shape` after checking that every input is
a float32 tensor): MUL with broadcasting (squeeze-excitation gates), PADV2 (max pooling's
padding), SLICE (one group's filter rows), GATHER (one group's input channels),
RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR (upsampling). numpy only."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from edge_sdk.errors import ConfigError

SHAPES = ("MUL", "PADV2", "SLICE", "GATHER", "RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR")


def _rank(shape: tuple[int, ...], rank: int, what: str) -> tuple[int, ...]:
    if len(shape) != rank:
        raise ConfigError(f"{what} input must have rank {rank}, got {list(shape)}")
    return shape


def out_shape(op: str, shapes: Sequence[tuple[int, ...]], opt: Mapping[str, Any],
              what: str) -> tuple[int, ...]:
    """The output shape of ``op`` (one of :data:`SHAPES`) on inputs of ``shapes``."""
    if op == "MUL":
        a, b = shapes[0], shapes[1]
        if len(a) != len(b) or any(p != q and 1 not in (p, q) for p, q in zip(a, b)):
            raise ConfigError(f"{what}: cannot broadcast {list(a)} and {list(b)} (same rank, "
                              "each dimension equal or 1)")
        return tuple(max(p, q) for p, q in zip(a, b))
    if op == "PADV2":
        shape = shapes[0]
        if not isinstance(opt["value"], (int, float)) or np.isnan(opt["value"]):
            raise ConfigError(f"{what}: value must be a number, got {opt['value']!r}")
        p = np.asarray(opt["paddings"] if opt["paddings"] is not None else [], dtype=np.int64)
        if p.shape != (len(shape), 2) or (p < 0).any():
            raise ConfigError(f"{what}: paddings must be {len(shape)} non-negative "
                              f"[before, after] pairs, got {opt['paddings']}")
        return tuple(d + int(a) + int(b) for d, (a, b) in zip(shape, p))
    if op in ("RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR"):
        n, h, w, c = _rank(shapes[0], 4, what)
        size = opt["size"]
        if not isinstance(size, (list, tuple)) or len(size) != 2 or not all(
                isinstance(v, (int, np.integer)) and 0 < v <= 1 << 16 for v in size):
            raise ConfigError(f"{what}: size must be [height, width], got {size!r}")
        if opt["align_corners"] and opt["half_pixel_centers"]:
            raise ConfigError(f"{what}: align_corners and half_pixel_centers exclude each other")
        return (n, int(size[0]), int(size[1]), c)
    if op == "GATHER":
        shape = shapes[0]
        axis = opt["axis"]
        idx = np.asarray(opt["indices"] if opt["indices"] is not None else [], dtype=np.int64)
        if not isinstance(axis, int) or not 0 <= axis < len(shape) or idx.ndim != 1 or \
                not idx.size or (idx < 0).any() or (idx >= shape[axis]).any():
            raise ConfigError(f"{what}: indices must be a non-empty vector within dimension "
                              f"{axis} of {list(shape)}")
        return (*shape[:axis], int(idx.size), *shape[axis + 1:])
    if op == "SLICE":
        shape = shapes[0]
        try:
            begin, size = [int(v) for v in opt["begin"]], [int(v) for v in opt["size"]]
        except (TypeError, ValueError):
            raise ConfigError(f"{what}: begin and size must be lists of ints, got "
                              f"{opt['begin']!r} and {opt['size']!r}") from None
        if len(begin) != len(shape) or len(size) != len(shape):
            raise ConfigError(f"{what}: begin and size need {len(shape)} entries each")
        out = tuple(d - b if n == -1 else n for d, b, n in zip(shape, begin, size))
        if any(b < 0 or n < -1 or n == 0 or b + o > d
               for d, b, n, o in zip(shape, begin, size, out)) or min(out) <= 0:
            raise ConfigError(f"{what}: begin {begin} size {size} is outside {list(shape)}")
        return out
    raise ConfigError(f"{what}: not an op of edge_sdk.graph_ops")
