"""(store, width, sample) -> ``.tflite`` bytes in memory (docs/store.md §3,
"Materialisation on the device"). numpy and the ``edge_sdk`` writer only (no torch).

The exporter produces every slice it measures with :func:`materialize`, and the device calls the
same function on the verified store: the manifest's sha256 of each (virtual) file is the hash
of these bytes, so the device checks that what it built is byte for byte what was measured.

The store's index (``Store.index``, the schema this module reads; the exporter writes it in
``exporters.store``)::

    version: 3                      # STORE_INDEX_VERSION; 2 still reads (no sigma_coding
                                    # key; the exporter writes 2 when no layer needs 3);
                                    # 1: refused, see below
    sampler: hash32-v1              # edge_sdk.store.sampler.SAMPLER
    posterior: gaussian | pwfn | sqs
    seed: <int>                     # sample s draws with seed (seed + s) mod 2**32
    weights: dequantize | hybrid | float      # the int8 route of every slice
    classifier: <layer name>        # the head scope's sampled layer
    samples: <S_max>                # posterior samples with a stored fold per width
    layers:                         # per Bayesian layer, full width, torch layout
      <name>: {kind: conv | depthwise | linear, shape: [O, I, kh, kw] | [O, I],
               flat_hw: [h, w],     # linear: the map its input was flattened from ([1, 1])
               encoding: codebook | sparse_codebook | int8, bits: <index bits>,
               route: int8 | float | slice,  # point: the codes are exact on `step`
                                    # (int8), or not: float32 (float), or int8 per channel
                                    # on the slice's own step (slice; SQS exports since
                                    # 2026-11-25: what the files route writes; a reader
                                    # before that took any other value the same way)
               sampler: normal | categorical | none, sigma_bits: <int>,
               sigma_coding: relative,   # version 3, sampler normal; absent: absolute
               cat: {count_bits: <int>, uncertain: <int>, entries: <int>}}   # sqs only
    widths:
      "0.50": {width: 0.5, channels: <sum of kept outputs>,
               layers: {<name>: {out: <kept outputs>, in: [[start, stop], ...] | null,
                                 fold: <offset>, sfold: <offset> | null,
                                 in_scale: <offset> | null}}}

Arrays (``<name>/...`` per layer, ``<width key>/...`` per width)::

    <name>/codebook  float32 [K]     sorted distinct values (codebook, sparse_codebook)
    <name>/index     uint8           indices packed at `bits` (sparse: the non-zeros only)
    <name>/mask      uint8           1-bit non-zero mask (sparse_codebook)
    <name>/codes     int8 [shape]    symmetric int8 codes (int8)
    <name>/step      float32 [O]     the int8 step per output channel, every width
    <name>/sigma_codebook float32 [Ks], <name>/sigma_index uint8   (sampler normal)
                                     indices packed at sigma_bits (0 bits, Ks = 1: no bytes);
                                     absolute: sigma = book[i]; relative: sigma = book[i] *
                                     sigma_reference(mu, step) = book[i] * max(|mu|, step/2),
                                     float32, mu the decoded point weight (decode_point)
    <name>/cat_flag  uint8           1 bit per non-zero weight: its categorical has > 1 entry
    <name>/cat_count uint8           entries - 2 per uncertain weight, packed at count_bits
    <name>/cat_entry uint8           the entries' codebook indices, packed at `bits`
    <name>/cat_thr   uint16          cumulative thresholds, entries - 1 per uncertain weight
    <wk>/fold        float32 [2, channels]   the point network's (a, t) per kept output channel
    <wk>/sfold       float16 [S_max, 2, n]   sample s's own (a, t) (float32 where float16
                                     would overflow), for the layers whose fold
                                     depends on the sample (a batch norm re-collected on its
                                     weights; ``sfold`` null: the point fold serves every sample)
    <wk>/in_scale    float32 [n]     forward-folded input scales (trainer.nest ReLU6 producers)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Mapping, TypeVar

import numpy as np
import numpy.typing as npt

from edge_sdk.errors import ConfigError
from edge_sdk.tflite.graph import Graph, tflite_weight
from edge_sdk.tflite.integer import ActQuant, integer_graph
from edge_sdk.tflite.tensors import QUANT_AXIS, Op, Quantization, Tensor
from edge_sdk.store import sampler
from edge_sdk.store.decode import _bad, _codes, _layer, decode_point, sample_weights
from edge_sdk.tflite.quant import QuantizedTensor, along, quantize_per_channel
from edge_sdk.tflite.writer import write_tflite

if TYPE_CHECKING:  # edge_sdk.bundle imports this module lazily (store bundles)
    from edge_sdk.store.container import Store
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.bundle.manifest import Manifest

__all__ = ["READABLE_STORE_INDEX_VERSIONS", "STORE_INDEX_VERSION", "LayerRecord", "head_graph",
           "materialize", "materialize_file", "materialize_graph"]

# 3: a layer's sigma may be relative (`sigma_coding: relative`, sigma = book[i] * max(|mu|,
# step/2)); 2: the point fold per width [2, channels] and a sample's own fold only where the
# sample changes it (sfold, float16), every sigma absolute (still read: 2 and 3 differ only in
# that key); 1 (the first schema-3 stores) held every sample's fold in `fold`
# [1 + S_max, 2, channels] and is refused by name (re-export it)
STORE_INDEX_VERSION = 3
READABLE_STORE_INDEX_VERSIONS = (2, 3)


_W = TypeVar("_W", bound=np.generic)


# ------------------------------------------------------------------------------ cutting
def _cut_inputs(w: npt.NDArray[_W], kind: str, ranges: Sequence[Sequence[int]] | None,
                spatial: int) -> npt.NDArray[_W]:
    """The kept input channels (``[start, stop)`` ranges in channel units; a linear layer's
    columns are (C, H, W): ``spatial`` per channel)."""
    if ranges is None or kind == "depthwise":
        return w
    if len(ranges) == 1 and 0 <= ranges[0][0] <= ranges[0][1] <= w.shape[1] // spatial:
        return w[:, ranges[0][0] * spatial:ranges[0][1] * spatial]  # one range: a view
    cols = np.concatenate([np.arange(a, b) for a, b in ranges]) if ranges else \
        np.zeros(0, np.int64)
    if spatial > 1:
        cols = (cols[:, None] * spatial + np.arange(spatial)).reshape(-1)
    return w[:, cols]


def _in_scale(w: npt.NDArray[np.float32], kind: str, scale: npt.NDArray[np.float32], spatial: int) -> npt.NDArray[np.float32]:
    """``w`` times the forward-folded per-input-channel scale (float32, as trainer.nest's
    truncation computes it); a depthwise kernel's input channel is its output channel."""
    if kind == "depthwise":
        return (w * along(scale, 0, w.ndim)).astype(np.float32)
    s = np.repeat(scale, spatial) if kind == "linear" else scale
    return (w * along(s, 1, w.ndim)).astype(np.float32)


@dataclass
class LayerRecord:
    """How one layer was materialised: ``route`` (dequantize | hybrid | float), whether its
    int8 codes are the store's (``codes``), the largest relative move of the int8 grid
    against the float32 folded weights (``max_rel_error``) and the dequantized folded
    weights in torch layout (``effective``, what the graph computes with)."""

    layer: str
    route: str
    codes: bool
    max_rel_error: float
    effective: npt.NDArray[np.float32]


def _fold(store: Store, wk: str, cut: dict[str, Any], sample: int | None
          ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """(a, t) of one layer at width ``wk``: the point network's, or sample ``sample``'s own
    (``sfold``; a layer without one folds the same for every sample)."""
    off, k = int(cut["fold"]), int(cut["out"])
    name, row = f"{wk}/fold", None
    if sample is not None and cut.get("sfold") is not None:
        name, off, row = f"{wk}/sfold", int(cut["sfold"]), int(sample)
    fold = np.asarray(store.array(name), np.float32)
    want = 2 if row is None else 3
    if fold.ndim != want or (row is not None and row >= fold.shape[0]) or \
            off + k > fold.shape[-1]:
        raise _bad(f"{name}: no fold{'' if row is None else f' for sample {row}'} of channels "
                   f"[{off}, {off + k}) in {list(fold.shape)}")
    f = fold if row is None else fold[row]
    return f[0, off:off + k], f[1, off:off + k]


def _layer_weights(store: Store, name: str, wk: str, cut: dict[str, Any], sample: int | None,
                   route: str) -> tuple[QuantizedTensor | None, npt.NDArray[np.float32], npt.NDArray[np.float32], bool]:
    """(int8 form or None, float32 folded weight, bias, codes used) of one layer."""
    L = _layer(store, name)
    kind, out = L["kind"], int(cut["out"])
    spatial = int(np.prod(L.get("flat_hw") or [1, 1]))
    a, t = _fold(store, wk, cut, sample)
    w = decode_point(store, name, out) if sample is None else sample_weights(store, name,
                                                                             sample, out)
    w = _cut_inputs(w, kind, cut.get("in"), spatial)
    scaled = cut.get("in_scale") is not None
    if scaled:
        s_all = np.asarray(store.array(f"{wk}/in_scale"), np.float32)
        off = int(cut["in_scale"])
        n = w.shape[0] if kind == "depthwise" else w.shape[1] // spatial
        w = _in_scale(w, kind, s_all[off:off + n], spatial)
    folded = np.multiply(w, along(a, 0, w.ndim), dtype=np.float32)
    if route == "float":
        return None, folded, t, False
    if sample is None and not scaled and L["route"] == "int8":
        # one step per output channel for every width: the stored codes' prefix, the sign of
        # a folded into them (a TFLite scale is > 0), scale step * |a| (docs/store.md §3.2)
        codes = _cut_inputs(_codes(store, name, out), kind, cut.get("in"), spatial)
        step = np.asarray(store.array(f"{name}/step"), np.float32)[:out]
        sign = np.where(a < 0, -1, np.where(a > 0, 1, 0)).astype(np.int8)
        q = (codes * along(sign, 0, codes.ndim)).astype(np.int8)
        scale = np.where(a != 0, step * np.abs(a), step).astype(np.float32)
        qt = QuantizedTensor(q, scale, 0, exact=False)
        qt.exact = bool(np.array_equal(qt.dequantize(), folded))
        return qt, folded, t, True
    if sample is None and L["route"] == "float":
        return None, folded, t, False  # cannot be exact on its step: stays float
    # a posterior sample, an input scale or route "slice": per channel on this slice's own
    # step (the one quantize_per_channel the files route uses too)
    return quantize_per_channel(folded, 0), folded, t, False


# ------------------------------------------------------------------------------ graphs
def head_graph(graph: Graph, classifier: str, heads: int) -> Graph:
    """The head scope's graph from a width's point graph: the classifier's FULLY_CONNECTED
    widened to ``heads`` stacked copies (``[S*C, in]``) and its ``[N, S*C]`` output reshaped
    to ``[N*S, C]`` (``heads``; the logits), as ``exporters.slice.stack_heads`` +
    ``export_point_slice(output_shape=[S, C])`` write it."""
    g = copy.deepcopy(graph)
    wname = f"{classifier}/weight"
    fc = [o for o in g.ops if o.op == "FULLY_CONNECTED" and o.inputs[1] == wname]
    # outputs[0] is the logits; a second output (the OOD score's features, the classifier's
    # input) is the point backbone's and stays as it is
    if len(fc) != 1 or not g.outputs or fc[0].outputs[0] != g.outputs[0]:
        raise ConfigError(f"the head scope needs the classifier {classifier!r} to be the "
                          "graph's last FULLY_CONNECTED, producing its (first) output")
    op = fc[0]
    out = g.tensor(op.outputs[0])
    n, classes = out.shape
    for tname in (wname, f"{classifier}/bias"):
        t = g.tensor(tname)
        t.shape = (t.shape[0] * heads, *t.shape[1:])
    logits = out.name
    out.name = classifier
    out.shape = (n, classes * heads)
    op.outputs = [classifier]
    g.tensors.append(Tensor(logits, (n * heads, classes)))
    g.ops.append(Op("RESHAPE", [classifier], [logits], {"shape": [-1, classes]}))
    return g


def _set_weight(g: Graph, name: str, kind: str, qt: QuantizedTensor | None, folded: npt.NDArray[np.float32],
                flat_hw: tuple[int, int] | None, route: str,
                arrays: dict[str, npt.NDArray[Any]]) -> str:
    """Put layer ``name``'s filter into the route-free template (float constant
    ``<name>/weight``): float as is; int8 + DEQUANTIZE (the DEQUANTIZE just before its
    consumer); hybrid: the int8 filter straight into the op. Returns the route written."""
    wname, qname = f"{name}/weight", f"{name}/weight_int8"
    t = g.tensor(wname)
    if qt is None:
        arrays[wname] = tflite_weight(folded, kind, flat_hw).astype(np.float32)
        return "float"
    q = np.ascontiguousarray(tflite_weight(qt.values, kind, flat_hw))
    quant = Quantization(tuple(float(s) for s in qt.scale), QUANT_AXIS[kind])
    arrays[qname] = q
    pos = g.tensors.index(t)
    if route == "hybrid" and kind != "depthwise":
        g.tensors[pos] = Tensor(qname, tuple(q.shape), "int8", qname, quant)
        for o in g.ops:
            o.inputs = [qname if x == wname else x for x in o.inputs]
        return "hybrid"
    t.weight = None  # the DEQUANTIZE output now
    g.tensors.insert(pos, Tensor(qname, tuple(q.shape), "int8", qname, quant))
    first = next(i for i, o in enumerate(g.ops) if wname in o.inputs)
    g.ops.insert(first, Op("DEQUANTIZE", [qname], [wname], {}))
    return "dequantize"


def materialize_graph(store: Store, graph: Graph | Mapping[str, Any], width_key: str, *,
                      sample: int | None = None, heads: int = 0, route: str | None = None
                      ) -> tuple[Graph, dict[str, npt.NDArray[Any]], list[LayerRecord]]:
    """The filled graph, its weights and per-layer records that :func:`materialize` writes.
    ``route``: the filters' route (dequantize | hybrid | float), None: the store's own."""
    idx = store.index
    if not isinstance(idx, Mapping) or idx.get("version") not in READABLE_STORE_INDEX_VERSIONS:
        got = idx.get("version") if isinstance(idx, Mapping) else idx
        old = " (version 1: every sample's fold in `fold`, before the per-sample `sfold`)" \
            if got == 1 else ""
        raise _bad(f"index version {got!r}{old} is not one this edge_sdk reads "
                   f"({', '.join(map(str, READABLE_STORE_INDEX_VERSIONS))}; it writes "
                   f"{STORE_INDEX_VERSION}): re-export the bundle, or use a matching edge_sdk")
    if idx.get("sampler") != sampler.SAMPLER:
        raise _bad(f"sampler {idx.get('sampler')!r}; this edge_sdk implements "
                   f"{sampler.SAMPLER!r}")
    if sample is not None and heads:
        raise ConfigError("a slice is a sample (scope all) or S stacked heads, not both")
    for v, what in ((sample, "sample"), (heads, "heads")):
        if v is not None and (not isinstance(v, (int, np.integer)) or v < 0 or
                              v > int(idx["samples"]) - (what == "sample")):
            raise ConfigError(f"{what} must be in [0, {int(idx['samples'])}], got {v!r}")
    try:
        wi = idx["widths"][width_key]
    except (KeyError, TypeError):
        raise _bad(f"no width {width_key!r} (the store has "
                   f"{', '.join(idx.get('widths', {}))})") from None
    g = Graph.from_dict(graph) if isinstance(graph, Mapping) else copy.deepcopy(graph)
    classifier = idx.get("classifier")
    if heads:
        g = head_graph(g, str(classifier), heads)  # no classifier: refused there, as 'None'
    route = route or idx.get("weights", "dequantize")
    if route not in ("dequantize", "hybrid", "float"):
        raise ConfigError(f"route must be dequantize, hybrid or float, got {route!r}")
    arrays: dict[str, npt.NDArray[Any]] = {}
    records: list[LayerRecord] = []
    for name, L in idx["layers"].items():
        cut = wi["layers"][name]
        if heads and name == classifier:
            qt, folded, t = _stacked_heads(store, name, width_key, cut, heads, route)
            codes = False
        else:
            qt, folded, t, codes = _layer_weights(store, name, width_key, cut, sample, route)
        flat_hw = L.get("flat_hw") if L["kind"] == "linear" else None
        written = _set_weight(g, name, L["kind"], qt, folded, flat_hw, route, arrays)
        arrays[f"{name}/bias"] = np.ascontiguousarray(t, np.float32)
        eff = folded if qt is None else qt.dequantize()
        err = float(np.abs(eff - folded).max() / max(float(np.abs(folded).max()), 1e-30)) \
            if folded.size else 0.0
        records.append(LayerRecord(name, written, codes, err, eff))
    g.validate(arrays)
    return g, arrays, records


def _stacked_heads(store: Store, name: str, wk: str, cut: dict[str, Any], heads: int, route: str
                   ) -> tuple[QuantizedTensor | None, npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """S sampled classifiers (samples 0 .. S-1) on the point network's fold, stacked into one
    ``[S*C, in]`` weight quantized per row (so head S's rows are head S_max's first S)."""
    L = _layer(store, name)
    kind = L["kind"]
    spatial = int(np.prod(L.get("flat_hw") or [1, 1]))
    a, t = _fold(store, wk, cut, None)
    rows = []
    for s in range(heads):
        w = _cut_inputs(sample_weights(store, name, s, int(cut["out"])), kind, cut.get("in"),
                        spatial)
        if cut.get("in_scale") is not None:
            s_all = np.asarray(store.array(f"{wk}/in_scale"), np.float32)
            off = int(cut["in_scale"])
            w = _in_scale(w, kind, s_all[off:off + w.shape[1] // spatial], spatial)
        rows.append((w.astype(np.float32) * along(a, 0, w.ndim)).astype(np.float32))
    folded = np.concatenate(rows, 0)
    bias = np.tile(t, heads).astype(np.float32)
    qt = None if route == "float" else quantize_per_channel(folded, 0)
    return qt, folded, bias


def materialize(store: Store, graph: Graph | Mapping[str, Any], width_key: str, *,
                sample: int | None = None, heads: int = 0, route: str | None = None,
                quant: Mapping[str, ActQuant] | None = None) -> bytes:
    """The ``.tflite`` bytes of one slice (docs/store.md §3): the width ``width_key``'s point
    network (``sample`` None, ``heads`` 0), posterior sample ``sample`` with its own folded
    batch norm (scope all), or the point backbone with ``heads`` sampled classifiers stacked,
    output ``[S, C]`` (scope head). ``graph``: the width's graph description from the
    manifest's ``graphs``. Deterministic: the same store and arguments give the same bytes on
    every machine and numpy version (the sampler is integer arithmetic, docs/store.md §4).
    ``route``: see :func:`materialize_graph`; ``quant``: the activations' (scale, zero point)
    of an integer slice, which is then this slice on int8 kernels
    (:func:`edge_sdk.tflite.integer.integer_graph`)."""
    g, arrays, _ = materialize_graph(store, graph, width_key, sample=sample, heads=heads,
                                     route=route)
    if quant is not None:
        g, arrays = integer_graph(g, arrays, quant)
    return write_tflite(g, arrays)


def materialize_file(store: Store, manifest: Manifest, config: Configuration, i: int) -> bytes:
    """File ``i`` of configuration ``config`` of a ``layout: store`` ``manifest``, from its
    recipe (``config.materialize[i]``) and the recipe width's graph. The caller checks the
    bytes against ``config.files[i]`` (``edge_sdk.bundle.verify_bytes`` + ``check_slice``)."""
    recipe = manifest.recipe(config, i)
    quant = None
    if config.weights == "int8":  # the width's activation scales, recorded by the exporter
        quant = manifest.activation_quant.get(recipe.width)
        if quant is None:
            raise ConfigError(f"configuration {config.id!r}: no activation_quant for width "
                              f"{recipe.width!r}")
    return materialize(store, manifest.graphs[recipe.width], recipe.width,
                       sample=recipe.sample, heads=recipe.heads,
                       route="hybrid" if config.weights == "hybrid" else None, quant=quant)
