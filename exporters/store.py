"""Checkpoint model -> the weight store (docs/store.md §2): the full-width network
once, what each width keeps and folds, and what generates each posterior sample.

:func:`build_store` writes the index schema :mod:`edge_sdk.store.materialize` reads (its module
docstring lists every key and array). The point weights are stored unfolded, in torch layout
and the learned channel order, so every width is a prefix (:meth:`NestedModel.truncation_plan`
says which rows and columns); per width only the fold ``(a, t)`` of every layer (keep
probability x batch norm re-collected for that width, :func:`exporters.fold.fold_affine`) and
the forward-folded input scales. Posterior samples are generated on the device
(:func:`edge_sdk.store.decode.sample_weights`); their batch norms are re-collected here on
exactly those weights: the exporter decodes its own store and draws with the device's sampler.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from edge_sdk.bundle import width_key
from edge_sdk.errors import ConfigError
from edge_sdk.store import (SAMPLER, Store, bits_for, compress_store, decode_store, encode_store,
                            pack_bits)
from edge_sdk.store.decode import decode_point, sample_weights
from edge_sdk.store.materialize import STORE_INDEX_VERSION
from edge_sdk.tflite.quant import quantize_per_channel
from exporters.fold import fold_affine
from exporters.sigma_code import REL_TOL, code_sigma, encode_sigma
from exporters.slice import classifier_name, make_slice
from exporters.tflite import lower_point_slice
from trainer.layers import BayesNestedLayer

__all__ = ["StoreBuild", "build_store", "encode_sigma", "sqs_categorical", "sqs_probabilities",
           "store_file_bytes"]

_U16 = 1 << 16
#: SQS sampled store: a categorical entry below this probability is dropped and the rest
#: renormalised before the 16-bit thresholds (the argmax always stays). Measured on
#: Fashion-MNIST SQS (benchmarks/store_sqs.py, docs/store.md §7, three seed sets of paired
#: draws): accuracy and NLL unchanged, ECE -0.0001, MI -1.7/-3.4/-2.9 % at 0.003 (0.01:
#: -2.0/-6.3/-5.9 %, outside +-5 %); the categoricals 261 -> 31 KB (most uncertain weights'
#: other entries had a mass of a few 1/65536)
SQS_MIN_PROB = 0.003


@dataclass
class StoreBuild:
    """What :func:`build_store` made: the store as the device decodes it (read-only views on
    ``data``), its bytes, the per-width graph descriptions (the manifest's ``graphs``) and
    per-layer notes (encoding, bits, route, bytes)."""

    store: Store
    data: bytes
    graphs: dict[str, dict]
    notes: dict[str, dict]


def _packed(values: np.ndarray, bits: int) -> np.ndarray:
    return np.frombuffer(pack_bits(np.asarray(values), bits), np.uint8).copy()


def _kind(layer: BayesNestedLayer) -> str:
    if hasattr(layer, "in_features"):
        return "linear"
    return "depthwise" if getattr(layer, "depthwise", False) else "conv"


def _codebook(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(sorted distinct float32 values, index of each value, index bits)."""
    book = np.unique(values.astype(np.float32))
    return book, np.searchsorted(book, values.astype(np.float32)), bits_for(max(book.size, 1))


def sqs_probabilities(t: dict, tau: float, min_prob: float = SQS_MIN_PROB
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One SQS tensor's categorical per non-zero weight (eq. 9 at sampling temperature
    ``tau``): (flat positions of the non-zero weights, their windows, valid components
    [n, K], probabilities [n, K]), entries below ``min_prob`` dropped (the argmax always
    kept) and the rest renormalised."""
    mask = t["mask"].flatten().cpu().numpy().astype(bool)
    window = t["window"].flatten().long().cpu().numpy()[mask]
    valid = t["valid"].cpu().numpy().astype(bool)[window]  # [n, K]
    r = np.exp(t["log_resp"].float().cpu().numpy().astype(np.float64)) / tau
    r = np.where(valid, r, -np.inf)
    r -= r.max(axis=1, keepdims=True)
    phi = np.exp(r)
    phi /= phi.sum(axis=1, keepdims=True)
    if min_prob > 0:
        keep = phi >= min_prob
        keep[np.arange(len(phi)), phi.argmax(axis=1)] = True
        phi = np.where(keep, phi, 0.0)
        phi /= phi.sum(axis=1, keepdims=True)
    return np.flatnonzero(mask), window, valid, phi


def sqs_categorical(t: dict, tau: float, book: np.ndarray,
                    min_prob: float = SQS_MIN_PROB) -> dict:
    """One SQS tensor's categorical over its window's codebook entries (eq. 9 at sampling
    temperature ``tau``), in the store's sparse form (docs/store.md §2): per non-zero weight
    the entries of probability >= ``min_prob`` (the argmax always; renormalised) whose
    probability survives 16-bit quantization, their store-codebook indices and cumulative
    uint16 thresholds. Weights left with one entry are certain (their point value: no bytes).
    Returns the arrays' values and counts."""
    _, window, valid, phi = sqs_probabilities(t, tau, min_prob)
    comp = t["codebook"].double().cpu().numpy()  # [windows, K]
    cum = np.rint(np.cumsum(phi, axis=1) * _U16).astype(np.int64)
    cum[:, -1] = _U16
    mass = np.diff(cum, axis=1, prepend=0)
    alive = (mass > 0) & valid
    # one surviving entry: certain, the weight keeps its point (greedy, the argmax) value
    count = alive.sum(axis=1)
    uncertain = count >= 2
    code = np.searchsorted(book, comp[window].astype(np.float32))
    rows, cols = np.nonzero(alive[uncertain])
    urows = np.flatnonzero(uncertain)[rows]
    entries = code[urows, cols]
    thr_all = cum[urows, cols]
    # each weight's last entry: implicit 65536 (no uncertain weight: nothing)
    last = np.r_[rows[1:] != rows[:-1], True] if rows.size else np.zeros(0, bool)
    return {"uncertain": uncertain, "count": count[uncertain], "entries": entries,
            "thresholds": thr_all[~last].astype(np.uint16)}


def _layer_arrays(name: str, layer: BayesNestedLayer, kind: str, post: dict | None,
                  sampled: bool, sigma_bits: int, sigma_rel_tol: float | None
                  ) -> tuple[dict, dict[str, np.ndarray]]:
    """(index entry, arrays) of one layer's point weights and sampler."""
    mu = layer.weight_mu.detach().cpu().numpy().astype(np.float32)
    shape = list(mu.shape)
    arrays: dict[str, np.ndarray] = {}
    entry: dict = {"shape": shape}
    posterior = (post or {}).get("kind", "gaussian")
    if posterior == "gaussian":
        qt = quantize_per_channel(mu, 0)
        arrays[f"{name}/codes"] = qt.values
        entry.update(encoding="int8", bits=8, route="int8")
        step = qt.scale
        mu_dec = qt.dequantize()  # codes * step, float32: what decode_point gives the device
    else:
        sqs = posterior == "sqs"
        if sqs:
            t = post["tensors"][name]
            mask = t["mask"].cpu().numpy().astype(bool).reshape(shape)
            if (mu[~mask] != 0).any():
                raise ConfigError(f"{name}: SQS point weights outside the non-zero mask")
            comp = t["codebook"].float().cpu().numpy()[t["valid"].cpu().numpy().astype(bool)]
            book = np.unique(np.concatenate([comp, mu[mask]]).astype(np.float32))
            idx = np.searchsorted(book, mu[mask])
            bits = bits_for(book.size)
            arrays[f"{name}/mask"] = _packed(mask.reshape(-1), 1)
            entry.update(encoding="sparse_codebook")
        else:
            book, idx, bits = _codebook(mu.reshape(-1))
            entry.update(encoding="codebook")
        arrays[f"{name}/codebook"] = book
        arrays[f"{name}/index"] = _packed(idx, bits)
        # the power-of-two step that makes codebook values exact (prepare_weights(pow2_step))
        qt = quantize_per_channel(mu, 0, pow2_step=True)
        # not exact on a power-of-two step (SQS's GMM means, almost always): PWFN keeps float32,
        # as the files route's codebook-exact mode does; SQS quantizes each slice per channel
        # ("slice"), as the files route does for it -- float32 cost SQS 4x the slice's RAM
        entry.update(bits=bits, route="int8" if qt.exact else ("slice" if sqs else "float"))
        step = qt.scale
        mu_dec = mu  # the codebook holds the float32 values themselves
    arrays[f"{name}/step"] = step.astype(np.float32)
    entry["sampler"] = "none"
    if sampled and posterior == "sqs":
        cat = sqs_categorical(post["tensors"][name], float(post["sample_tau"]), book)
        count_bits = bits_for(max(int(cat["count"].max(initial=2)) - 1, 1))
        arrays[f"{name}/cat_flag"] = _packed(cat["uncertain"], 1)
        arrays[f"{name}/cat_count"] = _packed(cat["count"] - 2, count_bits)
        arrays[f"{name}/cat_entry"] = _packed(cat["entries"], entry["bits"])
        arrays[f"{name}/cat_thr"] = cat["thresholds"]
        entry.update(sampler="categorical", cat={
            "count_bits": count_bits, "uncertain": int(cat["uncertain"].sum()),
            "entries": int(cat["entries"].size)})
    elif sampled:
        if posterior == "pwfn":
            sigma = post["tensors"][f"{name}.weight"]["sigma"].detach().cpu().numpy()
        else:
            sigma = layer.weight_sigma.detach().cpu().numpy()
        code = code_sigma(sigma, mu_dec, step.astype(np.float32), bits=sigma_bits,
                          rel_tol=sigma_rel_tol)
        arrays[f"{name}/sigma_codebook"] = code.book
        arrays[f"{name}/sigma_index"] = _packed(code.idx, code.bits)
        entry.update(sampler="normal", sigma_bits=code.bits)
        if code.coding == "relative":  # absent: absolute (every version-2 store)
            entry["sigma_coding"] = "relative"
    return entry, arrays


def _device_model(model, store: Store, layers: dict[str, BayesNestedLayer]):
    """A copy of ``model`` running the store's decoded point weights (what the device runs)."""
    m = copy.deepcopy(model)
    mods = dict(m.named_modules())
    with torch.no_grad():
        for name in layers:
            w = mods[name].weight_mu
            w.copy_(torch.from_numpy(decode_point(store, name)).to(w))
    return m


def _folds(sl, names: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    mods = dict(sl.named_modules())
    return {n: tuple(v.astype(np.float32) for v in fold_affine(mods[n])) for n in names}


def store_file_bytes(store: Store, compress: bool = True) -> bytes:
    """The bytes of ``store.bin``: the container's version 2 (deflated, docs/store.md §1) when
    ``compress`` and it is smaller than version 1, else version 1. It always was smaller in
    practice (digits demo, S_max = 8: 254,432 -> 187,035 B Gaussian, 237,344 -> 141,163 B
    PWFN); a store of incompressible bytes stays version 1, the simpler file."""
    data = encode_store(store)
    if compress:
        packed = compress_store(data)
        if len(packed) < len(data):
            return packed
    return data


def build_store(model, ckpt: dict, kind: str, widths: Sequence[float], calib: Sequence,
                input_shape: Sequence[int], *, samples: int = 0, seed: int = 0,
                weights: str = "dequantize", sigma_bits: int = 4,
                sigma_rel_tol: float | None = REL_TOL, compress: bool = True, device=None,
                log=print, features: bool = False) -> StoreBuild:
    """The store of ``model`` (a checkpoint's full nested model) for ``widths`` (snapped) and
    ``samples`` posterior samples (0: point only, no sampler data). ``calib``: the batches
    batch norms are re-collected on; ``input_shape``: NHWC of one sample. ``compress``: write
    the container's version 2 (deflated) when it is smaller than version 1, else version 1.
    ``features``: every width's graph also outputs its classifier's input."""
    layers = {n: m for n, m in model.named_modules() if isinstance(m, BayesNestedLayer)}
    post = dict(ckpt.get("posterior") or {}, kind=kind)
    sampled = samples > 0
    # version 2 unless a layer's sigma is relative (STORE_INDEX_VERSION 3): the lowest version
    # that says what the store holds, so a store without one still reads on a version-2 device
    index: dict = {"version": 2, "sampler": SAMPLER, "posterior": kind,
                   "seed": int(seed) & 0xFFFFFFFF, "weights": weights,
                   "classifier": classifier_name(model), "samples": int(samples),
                   "layers": {}, "widths": {}}
    arrays: dict[str, np.ndarray] = {}
    for name, layer in layers.items():
        entry, arr = _layer_arrays(name, layer, _kind(layer), post, sampled, sigma_bits,
                                   sigma_rel_tol)
        index["layers"][name] = {"kind": _kind(layer), **entry}
        arrays.update(arr)
    if any(L.get("sigma_coding") for L in index["layers"].values()):
        index["version"] = STORE_INDEX_VERSION  # a version-2 reader would take it as absolute
    partial = Store(index, arrays)
    dev_model = _device_model(model, partial, layers)
    draws = [{n: torch.from_numpy(sample_weights(partial, n, s)) for n in layers}
             for s in range(samples)]
    graphs: dict[str, dict] = {}
    for w in widths:
        wk = width_key(w)
        if wk in index["widths"]:
            raise ConfigError(f"widths {w:g} and {index['widths'][wk]['width']:g} share the "
                              f"store key {wk!r}")
        plan = model.truncation_plan(w)
        point = make_slice(dev_model, w, calib, device=device)
        folds = [_folds(point, layers)] + [
            _folds(make_slice(dev_model, w, calib, d, device), layers) for d in draws]
        graph, _, records = lower_point_slice(point, input_shape, "float", features=features)
        graph.description = "edge-sdk"  # from_dict's default: one key less per width
        graphs[wk] = graph.to_dict(compact=True)
        for r in records:
            if r["kind"] == "linear":
                hw = r["flat_hw"]
                old = index["layers"][r["layer"]].setdefault("flat_hw", hw)
                if old != hw:
                    raise ConfigError(f"{r['layer']}: flattened from {old} and {hw}")
        cuts, off, in_off, scales = {}, 0, 0, []
        for name, layer in layers.items():
            cut = plan[name]
            k = layer.out_channels if cut.out_keep is None else cut.out_keep
            entry = {"out": int(k), "in": None if cut.in_ranges is None else
                     [[int(a), int(b)] for a, b in cut.in_ranges], "fold": off,
                     "sfold": None, "in_scale": None}
            if cut.in_scale is not None:
                s = cut.in_scale.detach().cpu().numpy().astype(np.float32)
                entry["in_scale"] = in_off
                scales.append(s)
                in_off += s.size
            cuts[name] = entry
            off += k
        fold = np.zeros((2, off), np.float32)
        for name, (a, t) in folds[0].items():
            o, k = cuts[name]["fold"], cuts[name]["out"]
            fold[0, o:o + k], fold[1, o:o + k] = a, t
        arrays[f"{wk}/fold"] = fold
        # a sample's own fold only where it differs from the point network's (a layer with a
        # batch norm; a layer without one folds its bias and keep probability, the same for
        # every sample): the sample folds are most of the per-width bytes otherwise
        own = [n for n in layers if any(
            not (np.array_equal(f[n][0], folds[0][n][0]) and
                 np.array_equal(f[n][1], folds[0][n][1])) for f in folds[1:])]
        s_off = 0
        for name in own:
            cuts[name]["sfold"] = s_off
            s_off += cuts[name]["out"]
        if samples:
            sfold = np.zeros((samples, 2, s_off), np.float32)
            for row, f in enumerate(folds[1:]):
                for name in own:
                    o, k = cuts[name]["sfold"], cuts[name]["out"]
                    sfold[row, 0, o:o + k], sfold[row, 1, o:o + k] = f[name]
            # float16: a sample's batch norm is itself a draw (its statistics move far more
            # between samples than float16's 2**-11 relative step), and the sample folds are
            # the per-width bytes that grow with S (float32 where a value would overflow)
            half = sfold.astype(np.float16)
            arrays[f"{wk}/sfold"] = half if np.isfinite(half).all() else sfold
        if scales:
            arrays[f"{wk}/in_scale"] = np.concatenate(scales)
        index["widths"][wk] = {"width": float(w), "channels": int(off), "layers": cuts}
    for name, L in index["layers"].items():
        if L["kind"] == "linear":
            L.setdefault("flat_hw", [1, 1])
    data = store_file_bytes(Store(index, arrays), compress)
    store = decode_store(data)
    notes = {n: {"encoding": L["encoding"], "bits": L["bits"], "route": L["route"],
                 "sampler": L["sampler"],
                 "bytes": int(sum(a.nbytes for k, a in arrays.items()
                                  if k.startswith(f"{n}/")))}
             for n, L in index["layers"].items()}
    return StoreBuild(store, data, graphs, notes)
