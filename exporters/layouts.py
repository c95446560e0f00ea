"""Writing a bundle's slices in one layout (docs/store.md §1): ``files``, one
``.tflite`` per configuration file with S fixed, or ``store``, one weight store
(:mod:`exporters.store`) every slice is materialised from, with a head and an all configuration
per S in ``sample_counts``; each point slice's codebook statistics and the manifest's
``source.weights`` notes.

Split out of exporters/export.py, which checks the options, loads the checkpoint and data, and
writes the bundle (``export_bundle``); moved as it was.
"""
from __future__ import annotations

import sys
from typing import Sequence

import numpy as np
import torch

from edge_sdk.answers import metrics as M
from edge_sdk.bundle import SCOPES
from edge_sdk.errors import ConfigError
from exporters.configs import store_width
from exporters.slice import (classifier_name, make_slice, posterior_samples, sliced_heads,
                             stack_heads)
from exporters.precision import ROUTES, config_suffix, integer_slice
from exporters.tflite import export_point_slice, graph_stats, lower_point_slice
from trainer.layers import BayesNestedLayer

__all__ = ["files_layout", "sample_counts", "store_layout"]


def sample_counts(s_max: int, counts: Sequence[int] | str | None = None) -> tuple[int, ...]:
    """The S values that get a head and an all configuration (``ExportOptions.sample_counts``):
    ``None`` the powers of two below ``s_max`` plus ``s_max``, ``"all"`` every S in 1 ..
    ``s_max``, else the given integers (each in 1 .. ``s_max``, ``s_max`` included), sorted."""
    if counts is None:
        return tuple(sorted({1 << k for k in range(s_max.bit_length()) if 1 << k < s_max}
                            | {s_max}))
    if isinstance(counts, str):
        if counts == "all":
            return tuple(range(1, s_max + 1))
        raise ConfigError(f"sample_counts must be 'all' or a list of integers in 1..{s_max}, "
                          f"got {counts!r}")
    try:
        vals = list(counts)
    except TypeError:
        raise ConfigError(f"sample_counts must be 'all' or a list of integers in 1..{s_max}, "
                          f"got {counts!r}") from None
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= s_max:
            raise ConfigError(f"sample_counts: {v!r} is not an integer in 1..{s_max} "
                              f"(S_max = samples = {s_max}), got {counts!r}")
    if s_max not in vals:
        raise ConfigError(f"sample_counts must include S_max = samples = {s_max} (its files "
                          f"are the ones every S shares), got {counts!r}")
    return tuple(sorted(set(vals)))


def _codebook_stats(model, kind: str) -> tuple[int | None, float | None]:
    """Distinct weight values of a point slice before BN folding (codebook entries in use) and
    the entropy in bits over them (PWFN counts biases too: they are on its codebook)."""
    if kind == "gaussian":
        return None, None
    vals = [m.weight_mu.detach().flatten() for m in model.modules()
            if isinstance(m, BayesNestedLayer)]
    if kind == "pwfn":
        vals += [m.bias.detach().flatten() for m in model.modules()
                 if isinstance(m, BayesNestedLayer) and m.bias is not None]
    return M.codebook_stats(torch.cat(vals).cpu().numpy())


def _bar(plan: list, progress: bool):
    from tqdm import tqdm

    return tqdm(plan, desc="export", disable=None if progress else True, file=sys.stderr)


def calibration_inputs(calib: list, n: int = 1024) -> np.ndarray:
    """The first ``n`` images of the BN re-collection batches as the NHWC float32 a slice
    takes: what an integer slice's activation ranges are calibrated on (training split)."""
    xs = torch.cat([b[0] for b in calib])[:n]
    return np.ascontiguousarray(xs.permute(0, 2, 3, 1).numpy(), np.float32)


def _other_precisions(point, w, shape, kind, opts, out_cfg, calib_x, files, unique, entropy
                      ) -> None:
    """Width ``w``'s point slice on dynamic-range and integer kernels (files layout)."""
    for p in opts.precisions:
        if p == "float":
            continue
        cid = f"w{w:.2f}-point{config_suffix(p)}"
        if p == "dynamic":
            buf, info = export_point_slice(point, shape, "hybrid", pow2_step=kind == "pwfn",
                                           features=opts.uncertainty)
        else:
            g, arrays, _ = lower_point_slice(point, shape, opts.weights,
                                             pow2_step=kind == "pwfn", features=opts.uncertainty)
            buf = integer_slice(g, arrays, calib_x, out_cfg.ev.val_x, out_cfg.ev.val_y).data
            info = graph_stats(buf)
        name = f"{cid}.tflite"
        out_cfg.add(cid, w, "point", 1, [name], [buf], out_cfg.ev.logits([buf], "point"), info,
                    unique, entropy, weights=ROUTES[p])
        files[name] = buf


def files_layout(model, ckpt, kind, widths, calib, shape, opts, out_cfg, device, sampled,
                 progress) -> tuple[dict, dict]:
    """One ``.tflite`` per file, S = ``opts.samples`` fixed (what version 2 wrote)."""
    calib_x = calibration_inputs(calib) if "int8" in opts.precisions else None
    samples = posterior_samples(model, ckpt, opts.samples, opts.seed) if sampled else []
    classes = out_cfg.classes
    files, weight_notes = {}, {}
    bar = _bar([(w, s) for w in widths for s in SCOPES if s in opts.scopes], progress)
    point = None
    for w, scope in bar:
        bar.set_postfix_str(f"width {w:g} {scope}")
        if scope == "point" or point is None or point.truncated_width != w:
            point = make_slice(model, w, calib, device=device)
        if scope == "point":
            blobs = [export_point_slice(point, shape, opts.weights, pow2_step=kind == "pwfn",
                                        features=opts.uncertainty)]
            unique, entropy = _codebook_stats(point, kind)
            _other_precisions(point, w, shape, kind, opts, out_cfg, calib_x, files, unique,
                              entropy)
        elif scope == "head":
            # the point slice's backbone (PWFN: codebook-exact, as the store route's head
            # materialises it) and S sampled classifiers on the plain per-row int8 grid
            heads = stack_heads(point, sliced_heads(model, samples, w))
            blobs = [export_point_slice(heads, shape, opts.weights, pow2_step=kind == "pwfn",
                                        output_shape=[opts.samples, classes],
                                        sampled=(classifier_name(model),),
                                        features=opts.uncertainty)]
            unique = entropy = None
        else:
            # features too, as the store layout's sample graphs have them (the runtime
            # scores only point and head answers: a sample's features are not the bank's)
            blobs = [export_point_slice(make_slice(model, w, calib, s, device), shape,
                                        opts.weights, features=opts.uncertainty)
                     for s in samples]
            unique = entropy = None
        S = 1 if scope == "point" else opts.samples
        cid = f"w{w:.2f}-{scope}" + ("" if scope == "point" else str(S))
        names = [f"{cid}.tflite"] if len(blobs) == 1 else \
            [f"{cid}-s{i}.tflite" for i in range(len(blobs))]
        bufs = [b for b, _ in blobs]
        out_cfg.add(cid, w, scope, S, names, bufs, out_cfg.ev.logits(bufs, scope),
                    blobs[0][1], unique, entropy)
        files.update(zip(names, bufs))
        weight_notes[cid] = {
            "float_fallback": sorted({t for _, i in blobs for t in i["float_fallback"]}),
            "int8_max_rel_error": max(r["max_rel_error"] for _, i in blobs for r in i["tensors"])}
    bar.close()
    return files, weight_notes


def store_layout(model, ckpt, kind, widths, calib, shape, opts, out_cfg, device, sampled,
                 progress, extra: dict) -> tuple[dict, dict]:
    """One weight store; every slice materialised from it (docs/store.md); S in
    ``opts.sample_counts``."""
    from edge_sdk import bundle as B
    from exporters.store import build_store

    s_max = opts.samples if sampled else 0
    build = build_store(model, ckpt, kind, widths, calib, shape, samples=s_max,
                        seed=opts.seed, weights=opts.weights, sigma_bits=opts.sigma_bits,
                        sigma_rel_tol=opts.sigma_rel_tol, compress=opts.compress_store,
                        device=device, features=opts.uncertainty)
    weight_notes: dict = {}
    counts = sample_counts(s_max, opts.sample_counts) if s_max else ()
    calib_x = calibration_inputs(calib) if "int8" in opts.precisions else None
    integer: dict = {}
    bar = _bar(widths, progress)
    for w in bar:
        bar.set_postfix_str(f"width {w:g}")
        stats = _codebook_stats(model.truncate(w), kind) if "point" in opts.scopes else ()
        weight_notes.update(store_width(out_cfg, build, w, opts.scopes, s_max, stats, counts,
                                        opts.precisions, calib_x, integer))
    bar.close()
    name = "store.bin"
    extra.update(store=B.file_entry(name, build.data, B.StoreEntry).to_dict(),
                 graphs=build.graphs)
    if integer:  # what the device's materialiser makes each width's integer slice with
        extra["activation_quant"] = {wk: {t: [q[0], q[1]] for t, q in made.quant.items()}
                                     for wk, made in integer.items()}
    return {name: build.data}, _store_weight_notes(weight_notes, build.notes)


def _store_weight_notes(notes: dict, layers: dict) -> dict:
    """A store manifest's ``source.weights``, summarised (its bytes count against the bundle):
    the largest relative move of the int8 grid per slice group at 3 significant digits, the
    float-fallback tensors only for the groups that have any, and per store layer its
    encoding, bits, route, sampler and bytes."""
    out: dict = {"int8_max_rel_error": {k: float(f"{n['int8_max_rel_error']:.3g}")
                                        for k, n in notes.items()}}
    fallback = {k: n["float_fallback"] for k, n in notes.items() if n["float_fallback"]}
    if fallback:
        out["float_fallback"] = fallback
    out["store"] = layers
    return out
