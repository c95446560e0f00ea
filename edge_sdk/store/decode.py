"""A Bayesian layer's full-width weights from a verified weight store (docs/store.md §3-4;
materialize.py cuts them to a width and writes the slice): the point
network's (:func:`decode_point`: codebook, sparse codebook or int8 codes on their step) and
posterior sample ``s``'s (:func:`sample_weights`: the point weights plus the sampler's noise,
Gaussian with an absolute or relative sigma, or SQS's categorical over codebook entries).
numpy only; every inconsistency in the store is a :class:`BundleError` naming the layer.
"""
from __future__ import annotations

from typing import Any, Mapping, TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import BundleError
from edge_sdk.store import sampler
from edge_sdk.store.packing import Indices, Packed, unpack_bits, unpack_lookup, unpack_mask
from edge_sdk.tflite.quant import along

if TYPE_CHECKING:
    from edge_sdk.store.container import Store

__all__ = ["decode_point", "sample_seed", "sample_weights", "sigma_reference"]

_U16 = 1 << 16


def _bad(what: str) -> BundleError:
    return BundleError(f"store: {what}")


def sample_seed(index: Mapping[str, Any], sample: int) -> int:
    """The sampler seed of posterior sample ``sample`` (docs/store.md §4)."""
    return (int(index["seed"]) + int(sample)) & 0xFFFFFFFF


# ------------------------------------------------------------------------------ decoding
def _layer(store: Store, name: str) -> dict[str, Any]:
    try:
        layer: dict[str, Any] = store.index["layers"][name]
        return layer
    except (KeyError, TypeError):
        raise _bad(f"the index has no layer {name!r}") from None


def _rows(shape: list[int], out: int | None) -> tuple[int, int]:
    """(rows kept, elements per row) of a torch-layout weight."""
    per_row = int(np.prod(shape[1:]))
    return (shape[0] if out is None else int(out)), per_row


def decode_point(store: Store, name: str, out: int | None = None) -> npt.NDArray[np.float32]:
    """The point (unfolded) weights of layer ``name``, float32 torch layout, the first ``out``
    output channels (all: None), every input channel (docs/store.md §3 step 1)."""
    L = _layer(store, name)
    shape = [int(d) for d in L["shape"]]
    rows, per_row = _rows(shape, out)
    numel = int(np.prod(shape))
    enc = L["encoding"]
    if enc == "int8":
        codes = np.asarray(store.array(f"{name}/codes")).reshape(shape)[:rows]
        step = np.asarray(store.array(f"{name}/step"), np.float32)[:rows]
        point: npt.NDArray[np.float32] = codes.astype(np.float32) * along(step, 0, len(shape))
        return point
    book = np.asarray(store.array(f"{name}/codebook"), np.float32)
    bits = int(L["bits"])
    if enc == "codebook":
        vals = _lookup(store.array(f"{name}/index"), bits, numel, book, name)[:rows * per_row]
    elif enc == "sparse_codebook":
        mask = unpack_mask(store.array(f"{name}/mask"), numel)
        idx = unpack_bits(store.array(f"{name}/index"), bits, int(mask.sum()))
        full = np.zeros(numel, np.float32)
        full[mask] = _take(book, idx, name)
        vals = full[:rows * per_row]
    else:
        raise _bad(f"layer {name!r}: unknown encoding {enc!r}")
    return vals.reshape([rows, *shape[1:]])


def _take(book: npt.NDArray[np.float32], idx: Indices, name: str) -> npt.NDArray[np.float32]:
    if idx.size and int(idx.max()) >= book.size:
        raise _bad(f"layer {name!r}: index {int(idx.max())} outside its {book.size}-entry "
                   "codebook")
    return np.take(book, idx)  # = book[idx], 1.6x faster on uint16 indices


def _lookup(buf: Packed, bits: int, count: int, book: npt.NDArray[np.float32], name: str) -> npt.NDArray[np.float32]:
    """``book`` at the ``count`` indices packed in ``buf`` (each checked against the book)."""
    try:
        return unpack_lookup(buf, bits, count, book)
    except BundleError as exc:
        raise _bad(f"layer {name!r}: {exc}") from None


def _codes(store: Store, name: str, rows: int) -> npt.NDArray[np.int8]:
    """The int8 codes of the first ``rows`` output channels on the layer's ``step``: stored
    (int8) or ``rint(value / step)`` (codebook kinds, exact where ``route`` is int8)."""
    L = _layer(store, name)
    if L["encoding"] == "int8":
        codes: npt.NDArray[np.int8] = np.asarray(store.array(f"{name}/codes")) \
            .reshape(L["shape"])[:rows]
        return codes
    w = decode_point(store, name, rows)
    step = np.asarray(store.array(f"{name}/step"), np.float32)[:rows]
    rounded: npt.NDArray[np.int8] = np.rint(w / along(step, 0, w.ndim)).astype(np.int8)
    return rounded


def sigma_reference(mu: npt.ArrayLike, step: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """The relative sigma coding's reference per weight (docs/store.md §2): ``max(|mu|,
    step_c / 2)``, float32, ``mu`` the decoded point weights (torch layout, the first rows)
    and ``step`` the int8 step of each of their output channels."""
    mu32 = np.asarray(mu, np.float32)
    half = np.asarray(step, np.float32)[:mu32.shape[0]] * np.float32(0.5)
    ref: npt.NDArray[np.float32] = np.maximum(np.abs(mu32), along(half, 0, mu32.ndim))
    return ref


def sample_weights(store: Store, name: str, sample: int, out: int | None = None) -> npt.NDArray[np.float32]:
    """Layer ``name``'s weights in posterior sample ``sample`` (float32 torch layout, the first
    ``out`` output channels): normal ``mu + sigma * eps`` (float32, elementwise, ``eps`` =
    :func:`edge_sdk.store.sampler.normal` at the weight's flat index), categorical (SQS: one
    16-bit uniform per weight at its flat index against the stored thresholds), or the point
    weights (sampler none). Sample ``s`` of a narrow width is the prefix of the full width's."""
    L = _layer(store, name)
    shape = [int(d) for d in L["shape"]]
    rows, per_row = _rows(shape, out)
    n = rows * per_row
    seed, stream = sample_seed(store.index, sample), sampler.stream_id(name)
    kind = L.get("sampler", "none")
    mu = decode_point(store, name, rows)
    if kind == "none":
        return mu
    if kind == "normal":
        bits = int(L["sigma_bits"])
        book = np.asarray(store.array(f"{name}/sigma_codebook"), np.float32)
        sig = _lookup(store.array(f"{name}/sigma_index"), bits, int(np.prod(shape)), book,
                      name)[:n]
        coding = L.get("sigma_coding", "absolute")
        if coding == "relative" and int(store.index.get("version", 0)) >= 3:
            step = np.asarray(store.array(f"{name}/step"), np.float32)
            sig = sig * sigma_reference(mu, step).reshape(-1)  # float32
        elif coding != "absolute":
            raise _bad(f"layer {name!r}: sigma_coding {coding!r} in a version "
                       f"{store.index.get('version')!r} index")
        eps = sampler.normal(seed, stream, n)
        np.multiply(sig, eps, out=eps)  # mu + sigma * eps, float32, in place
        np.add(mu.reshape(-1), eps, out=eps)
        return eps.reshape(mu.shape)
    if kind == "categorical":
        return _categorical(store, name, L, shape, seed, stream, n).reshape(mu.shape)
    raise _bad(f"layer {name!r}: unknown sampler {kind!r}")


def _categorical(store: Store, name: str, L: dict[str, Any], shape: list[int], seed: int,
                 stream: int, n: int) -> npt.NDArray[np.float32]:
    numel = int(np.prod(shape))
    cat = L["cat"]
    bits = int(L["bits"])
    book = np.asarray(store.array(f"{name}/codebook"), np.float32)
    mask = unpack_mask(store.array(f"{name}/mask"), numel)
    pos = np.flatnonzero(mask)  # flat positions of the non-zero weights
    idx = unpack_bits(store.array(f"{name}/index"), bits, pos.size).astype(np.int64)
    flag = unpack_mask(store.array(f"{name}/cat_flag"), pos.size)
    nu = int(cat["uncertain"])
    if int(flag.sum()) != nu:
        raise _bad(f"layer {name!r}: {int(flag.sum())} uncertain weights flagged, the index "
                   f"says {nu}")
    counts = unpack_bits(store.array(f"{name}/cat_count"), int(cat["count_bits"]),
                         nu).astype(np.int64) + 2
    total = int(counts.sum())
    entries = unpack_bits(store.array(f"{name}/cat_entry"), bits, total).astype(np.int64)
    thr = np.asarray(store.array(f"{name}/cat_thr"))
    if thr.size != total - nu or (entries.size and int(entries.max()) >= book.size):
        raise _bad(f"layer {name!r}: categorical tables do not fit ({thr.size} thresholds for "
                   f"{nu} weights with {total} entries)")
    upos = pos[flag]
    keep = upos < n  # the kept rows: a prefix of the flat positions
    if keep.any():
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        tstarts = starts - np.arange(nu)  # entries - 1 thresholds per weight
        width = int(counts.max()) - 1
        table = np.full((nu, width), _U16, np.int64)  # padding: never reached
        col = np.arange(width)
        live = col[None, :] < (counts - 1)[:, None]
        table[live] = thr.astype(np.int64)[(tstarts[:, None] + col[None, :])[live]]
        u = sampler.uniform_u16(seed, stream, n).astype(np.int64)[upos[keep]]
        j = (u[:, None] >= table[keep]).sum(axis=1)
        idx_u = idx[flag]
        idx_u[keep] = entries[starts[keep] + j]
        idx[flag] = idx_u
    out = np.zeros(numel, np.float32)
    out[pos] = book[idx]
    return out[:n]
