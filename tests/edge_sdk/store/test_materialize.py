"""The materialiser (issue 21, docs/store.md §3) on a store built here by hand, in numpy, from
the index schema edge_sdk/store/materialize.py documents: every encoding (codebook,
sparse_codebook, int8), every sampler (normal, categorical), a depthwise layer, a linear layer
after a flatten, segmented input ranges and a forward-folded input scale. Expectations are
computed here from the arrays this file put in the store, not by the code under test.

No torch (the device-side run): tests/exporters/test_store.py checks stores the exporter builds.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from edge_sdk.backends import interpreter_class
from edge_sdk.bundle import Manifest, file_entry, verify_bytes
from edge_sdk.errors import BundleError, ConfigError
from edge_sdk.tflite.graph import Graph
from edge_sdk.tflite.build import GraphBuilder
from edge_sdk.store import (NORMAL_BOUND, SAMPLER, Store, decode_store, encode_store, pack_bits,
                            pack_mask)
from edge_sdk.store.decode import decode_point, sample_weights
from edge_sdk.store.materialize import (STORE_INDEX_VERSION, materialize, materialize_file,
                                        materialize_graph)

S_MAX = 3
OWN_FOLD = ("c1", "dw")  # layers whose samples have their own fold (sfold)
RNG = np.random.default_rng(21)
# layer -> (kind, torch shape); input [1, 4, 4, 2]
LAYERS = {"c1": ("conv", (8, 2, 3, 3)), "dw": ("depthwise", (8, 1, 3, 3)),
          "fc": ("linear", (8, 128)), "classifier": ("linear", (3, 8))}
# width key -> per layer (kept outputs, input ranges or None, forward-folded input scale?)
CUTS = {"0.50": {"c1": (4, None, False), "dw": (4, None, False),
                 "fc": (4, [[0, 2], [4, 6]], True), "classifier": (3, [[0, 4]], False)},
        "1.00": {"c1": (8, None, False), "dw": (8, None, False), "fc": (8, None, False),
                 "classifier": (3, None, False)}}


def _u8(b: bytes) -> np.ndarray:
    return np.frombuffer(b, np.uint8).copy()


def _pow2_codebook(k: int) -> np.ndarray:
    """k distinct multiples of 2**-6 within +-127 steps: exact on a power-of-two step."""
    return np.sort(RNG.choice(np.arange(-100, 101), k, replace=False)).astype(np.float32) / 64


def _template(wk: str) -> dict:
    """The route-free point graph of a width (float constants, the lowering's names)."""
    cut = CUTS[wk]
    c = cut["c1"][0]
    g = GraphBuilder()
    x = g.add_input("input", (1, 4, 4, 2))
    z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    y = g.conv2d(x, g.add_const(z(c, 3, 3, 2), "c1/weight"), g.add_const(z(c), "c1/bias"),
                 padding="SAME", activation="relu", name="c1")
    y = g.depthwise_conv2d(y, g.add_const(z(1, 3, 3, c), "dw/weight"),
                           g.add_const(z(c), "dw/bias"), padding="SAME", activation="relu",
                           name="dw")
    y = g.reshape(y, (-1, 16 * c), name="flatten")
    h = cut["fc"][0]
    y = g.fully_connected(y, g.add_const(z(h, 16 * c), "fc/weight"), g.add_const(z(h), "fc/bias"),
                          activation="relu", name="fc")
    y = g.fully_connected(y, g.add_const(z(3, h), "classifier/weight"),
                          g.add_const(z(3), "classifier/bias"), name="classifier")
    g.mark_output(y, "logits")
    return g.graph(resizable_batch=True)[0].to_dict()


def _build() -> tuple[Store, dict]:
    """(store, what went into it: point weights, sigma, categorical tables, folds)."""
    arrays, layers, truth = {}, {}, {"mu": {}, "sigma": {}, "cat": {}, "fold": {}, "scale": {}}
    # c1: codebook, normal sampler
    book = _pow2_codebook(12)
    idx = RNG.integers(0, 12, np.prod(LAYERS["c1"][1]))
    arrays.update({"c1/codebook": book, "c1/index": _u8(pack_bits(idx, 4)),
                   "c1/step": np.full(8, 2.0 ** -6, np.float32)})
    truth["mu"]["c1"] = book[idx].reshape(LAYERS["c1"][1])
    # dw: int8 codes + step, normal sampler
    codes = RNG.integers(-127, 128, LAYERS["dw"][1]).astype(np.int8)
    step = RNG.uniform(0.01, 0.02, 8).astype(np.float32)
    arrays.update({"dw/codes": codes, "dw/step": step})
    truth["mu"]["dw"] = codes.astype(np.float32) * step[:, None, None, None]
    # fc: sparse codebook, categorical sampler
    fbook = _pow2_codebook(6)
    mask = RNG.random(1024) < 0.4
    nz = RNG.integers(0, 6, int(mask.sum()))
    full = np.zeros(1024, np.float32)
    full[mask] = fbook[nz]
    arrays.update({"fc/codebook": fbook, "fc/mask": _u8(pack_mask(mask)),
                   "fc/index": _u8(pack_bits(nz, 3)), "fc/step": np.full(8, 2.0 ** -6,
                                                                        np.float32)})
    truth["mu"]["fc"] = full.reshape(8, 128)
    flag = RNG.random(nz.size) < 0.5
    counts = RNG.integers(2, 4, int(flag.sum()))  # 2 or 3 entries
    entries, thr = [], []
    for own, n in zip(nz[flag], counts):
        others = [e for e in RNG.permutation(6) if e != own][: n - 1]
        entries += [own, *others]
        cuts = np.sort(RNG.choice(np.arange(1, 65536), n - 1, replace=False))
        thr += list(cuts)
    arrays.update({"fc/cat_flag": _u8(pack_mask(flag)), "fc/cat_count": _u8(pack_bits(counts - 2, 1)),
                   "fc/cat_entry": _u8(pack_bits(np.array(entries), 3)),
                   "fc/cat_thr": np.array(thr, np.uint16)})
    truth["cat"] = {"mask": mask, "nz": nz, "flag": flag, "counts": counts,
                    "entries": np.array(entries), "thr": np.array(thr)}
    # classifier: codebook, normal sampler
    cbook = _pow2_codebook(5)
    cidx = RNG.integers(0, 5, 24)
    arrays.update({"classifier/codebook": cbook, "classifier/index": _u8(pack_bits(cidx, 3)),
                   "classifier/step": np.full(3, 2.0 ** -6, np.float32)})
    truth["mu"]["classifier"] = cbook[cidx].reshape(3, 8)
    for name in ("c1", "dw", "classifier"):  # sigma on a 16-entry codebook (4 bits)
        sbook = np.geomspace(1e-3, 5e-2, 16).astype(np.float32)
        sidx = RNG.integers(0, 16, np.prod(LAYERS[name][1]))
        arrays[f"{name}/sigma_codebook"] = sbook
        arrays[f"{name}/sigma_index"] = _u8(pack_bits(sidx, 4))
        truth["sigma"][name] = sbook[sidx].reshape(LAYERS[name][1])
    enc = {"c1": ("codebook", 4, "normal"), "dw": ("int8", 8, "normal"),
           "fc": ("sparse_codebook", 3, "categorical"), "classifier": ("codebook", 3, "normal")}
    for name, (kind, shape) in LAYERS.items():
        e, bits, smp = enc[name]
        layers[name] = {"kind": kind, "shape": list(shape), "encoding": e, "bits": bits,
                        "route": "int8", "sampler": smp}
        if smp == "normal":
            layers[name]["sigma_bits"] = 4
        if kind == "linear":
            layers[name]["flat_hw"] = [4, 4] if name == "fc" else [1, 1]
    layers["fc"]["cat"] = {"count_bits": 1, "uncertain": int(flag.sum()),
                           "entries": len(entries)}
    widths = {}
    for wk, cut in CUTS.items():
        off, lc, scales = 0, {}, []
        for name, (k, ranges, scaled) in cut.items():
            lc[name] = {"out": k, "in": ranges, "fold": off, "in_scale": None}
            if scaled:
                s = RNG.uniform(0.5, 1.0, 4).astype(np.float32)
                lc[name]["in_scale"] = 0
                scales.append(s)
                truth["scale"][(wk, name)] = s
            off += k
        fold = np.stack([RNG.uniform(0.5, 2.0, (2, off)) for _ in range(1 + S_MAX)]
                        ).astype(np.float32)
        fold[:, 0, 1] *= -1  # a negative fold scale: its sign goes into the int8 codes
        arrays[f"{wk}/fold"] = fold[0]
        # samples fold c1 and dw their own way (batch norms); fc and classifier as the point
        s_off, parts = 0, []
        for name in OWN_FOLD:
            lc[name]["sfold"] = s_off
            o, k = lc[name]["fold"], lc[name]["out"]
            parts.append(fold[1:, :, o:o + k])
            s_off += k
        for name in lc:
            lc[name].setdefault("sfold", None)
            if name not in OWN_FOLD:  # what the truth says a sample of it folds with
                o, k = lc[name]["fold"], lc[name]["out"]
                fold[1:, :, o:o + k] = fold[0, :, o:o + k]
        arrays[f"{wk}/sfold"] = np.concatenate(parts, axis=2)
        if scales:
            arrays[f"{wk}/in_scale"] = np.concatenate(scales)
        truth["fold"][wk] = fold
        widths[wk] = {"width": float(wk), "channels": off, "layers": lc}
    index = {"version": STORE_INDEX_VERSION, "sampler": SAMPLER, "posterior": "gaussian",
             "seed": 7, "weights": "dequantize", "classifier": "classifier",
             "samples": S_MAX, "layers": layers, "widths": widths}
    return decode_store(encode_store(Store(index, arrays))), truth


STORE, TRUTH = _build()
GRAPHS = {wk: _template(wk) for wk in CUTS}


def _cols(name: str, wk: str) -> np.ndarray:
    ranges = CUTS[wk][name][1]
    if ranges is None:
        return np.arange(LAYERS[name][1][1])
    ch = np.concatenate([np.arange(a, b) for a, b in ranges])
    spatial = 16 if name == "fc" else 1
    return (ch[:, None] * spatial + np.arange(spatial)).reshape(-1)


def _fold(wk: str, name: str, row: int = 0) -> tuple[np.ndarray, np.ndarray]:
    lc = STORE.index["widths"][wk]["layers"][name]
    f = TRUTH["fold"][wk][row]
    return f[0, lc["fold"]:lc["fold"] + lc["out"]], f[1, lc["fold"]:lc["fold"] + lc["out"]]


def _expected(wk: str, name: str, w: np.ndarray, row: int = 0) -> np.ndarray:
    """The float32 folded weight of ``name`` at width ``wk`` from full-width weights ``w``."""
    k = CUTS[wk][name][0]
    w = w[:k]
    if LAYERS[name][0] != "depthwise":
        w = w[:, _cols(name, wk)]
    if (wk, name) in TRUTH["scale"]:
        w = w * np.repeat(TRUTH["scale"][(wk, name)], 16)[None, :]
    a, _ = _fold(wk, name, row)
    return (w.astype(np.float32) * a.reshape((-1,) + (1,) * (w.ndim - 1))).astype(np.float32)


def _run(buf: bytes, x: np.ndarray) -> np.ndarray:
    it = interpreter_class()[0](model_content=buf, num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


# ------------------------------------------------------------------------------ decoding
def test_point_weights_decode_to_what_was_stored():
    for name in LAYERS:
        assert np.array_equal(decode_point(STORE, name), TRUTH["mu"][name]), name
        assert np.array_equal(decode_point(STORE, name, 2), TRUTH["mu"][name][:2]), name


@pytest.mark.parametrize("wk", list(CUTS))
def test_point_slice_weights_are_the_stores_prefix_times_the_fold(wk):
    """The prefix property: width w's weights are the first rows (and the width's input
    ranges) of the store's; the codebook route is exact: int8 x scale == value x fold scale."""
    _, _, records = materialize_graph(STORE, GRAPHS[wk], wk)
    by = {r.layer: r for r in records}
    for name in LAYERS:
        want = _expected(wk, name, TRUTH["mu"][name])
        r = by[name]
        if (wk, name) in TRUTH["scale"]:  # forward-folded scale: quantized per channel
            assert not r.codes and r.max_rel_error <= 1 / 254 + 1e-6
            assert np.abs(r.effective - want).max() <= np.abs(want).max() / 254 + 1e-6
        else:
            assert r.codes, name
            if name != "dw":  # codebook values on a power-of-two step: bit for bit
                assert np.array_equal(r.effective, want), (wk, name)
            else:  # int8 codes x step, folded: the product, to float32 rounding
                assert np.allclose(r.effective, want, rtol=1e-6, atol=0), (wk, name)


def test_int8_codes_carry_the_sign_of_the_fold_scale_and_scales_stay_positive():
    g, arrays, _ = materialize_graph(STORE, GRAPHS["1.00"], "1.00")
    q = arrays["c1/weight_int8"]  # OHWI
    a, _ = _fold("1.00", "c1")
    step = np.full(8, 2.0 ** -6, np.float32)
    codes = np.rint(TRUTH["mu"]["c1"] / 2.0 ** -6).astype(np.int8).transpose(0, 2, 3, 1)
    assert np.array_equal(q, codes * np.sign(a).astype(np.int8)[:, None, None, None])
    scale = np.asarray(g.tensor("c1/weight_int8").quant.scale, np.float32)
    assert (scale > 0).all() and np.array_equal(scale, step * np.abs(a))
    assert [o.op for o in g.ops][:2] == ["DEQUANTIZE", "CONV_2D"]
    dq = g.tensor("dw/weight_int8").quant
    assert dq.axis == 3 and arrays["dw/weight_int8"].shape == (1, 3, 3, 8)


def test_materialised_slices_run_and_are_deterministic():
    x = RNG.normal(size=(1, 4, 4, 2)).astype(np.float32)
    for wk, graph in GRAPHS.items():
        for kw in ({}, {"sample": 0}, {"sample": S_MAX - 1}, {"heads": 2}):
            buf = materialize(STORE, graph, wk, **kw)
            assert buf == materialize(STORE, Graph.from_dict(graph), wk, **kw)  # same bytes
            out = _run(buf, x)
            assert out.shape == ((kw["heads"], 3) if "heads" in kw else (1, 3))
            assert np.isfinite(out).all()
        assert materialize(STORE, graph, wk, sample=0) != materialize(STORE, graph, wk, sample=1)


# ------------------------------------------------------------------------------ sampling
@pytest.mark.parametrize("name", list(LAYERS))
def test_a_narrow_sample_is_the_prefix_of_the_full_width_sample(name):
    for s in range(S_MAX):
        full = sample_weights(STORE, name, s)
        assert np.array_equal(sample_weights(STORE, name, s, out=3), full[:3])
        assert np.array_equal(full, sample_weights(STORE, name, s))  # counter-based: same bits


@pytest.mark.parametrize("name", ["c1", "dw", "classifier"])
def test_normal_samples_are_mu_plus_bounded_sigma_noise(name):
    mu, sig = TRUTH["mu"][name], TRUTH["sigma"][name]
    draws = np.stack([sample_weights(STORE, name, s) for s in range(S_MAX)])
    z = (draws - mu) / sig
    assert np.abs(z).max() <= NORMAL_BOUND * (1 + 1e-5)
    assert np.abs(z).mean() > 0.3  # really noise, not the point weights
    assert not np.array_equal(draws[0], draws[1])


def test_categorical_samples_stay_on_each_weights_entries_with_the_stored_frequencies():
    t = TRUTH["cat"]
    pos = np.flatnonzero(t["mask"])
    draws = np.stack([sample_weights(STORE, "fc", s).reshape(-1) for s in range(400)])
    assert (draws[:, ~t["mask"]] == 0).all()  # exact sparsity
    book = STORE.array("fc/codebook")
    certain = pos[~t["flag"]]
    assert (draws[:, certain] == book[t["nz"][~t["flag"]]]).all()  # one entry: the point value
    starts = np.concatenate([[0], np.cumsum(t["counts"])[:-1]])
    tstart = starts - np.arange(len(starts))
    for i, p in enumerate(pos[t["flag"]][:20]):
        n = t["counts"][i]
        allowed = book[t["entries"][starts[i]:starts[i] + n]]
        got = draws[:, p]
        assert np.isin(got, allowed).all()
        thr = np.r_[0, t["thr"][tstart[i]:tstart[i] + n - 1], 65536]
        prob = np.diff(thr) / 65536
        freq = np.array([(got == v).mean() for v in allowed])
        assert np.abs(freq - prob).max() < 0.1, (freq, prob)


def test_head_scope_rows_are_sampled_classifiers_and_head_s_is_the_first_s_of_s_max():
    wk = "0.50"
    g, arrays, _ = materialize_graph(STORE, GRAPHS[wk], wk, heads=S_MAX)
    assert g.tensor("logits").shape == (S_MAX, 3) and g.ops[-1].op == "RESHAPE"
    q = arrays["classifier/weight_int8"].astype(np.float32) * np.asarray(
        g.tensor("classifier/weight_int8").quant.scale, np.float32)[:, None]
    for s in range(S_MAX):  # row block s: sample s's classifier on the point fold
        want = _expected(wk, "classifier", sample_weights(STORE, "classifier", s))
        assert np.abs(q[3 * s:3 * s + 3] - want).max() <= np.abs(want).max() / 127
    _, b2, _ = materialize_graph(STORE, GRAPHS[wk], wk, heads=2)
    assert np.array_equal(b2["classifier/weight_int8"], arrays["classifier/weight_int8"][:6])
    assert np.array_equal(b2["classifier/bias"], arrays["classifier/bias"][:6])
    # the backbone is the point network's
    _, point, _ = materialize_graph(STORE, GRAPHS[wk], wk)
    for k in ("c1/weight_int8", "dw/weight_int8", "fc/weight_int8", "fc/bias"):
        assert np.array_equal(point[k], arrays[k]), k


def test_a_sample_uses_its_own_fold():
    wk = "1.00"
    _, _, recs = materialize_graph(STORE, GRAPHS[wk], wk, sample=1)
    r = {x.layer: x for x in recs}["c1"]
    want = _expected(wk, "c1", sample_weights(STORE, "c1", 1), row=2)
    assert np.abs(r.effective - want).max() <= np.abs(want).max() / 254 + 1e-7
    _, b, _ = materialize_graph(STORE, GRAPHS[wk], wk, sample=1)
    assert np.array_equal(b["c1/bias"], _fold(wk, "c1", 2)[1])
    # a layer without a sample fold (no batch norm) folds as the point network
    assert np.array_equal(b["classifier/bias"], _fold(wk, "classifier", 0)[1])
    assert not np.array_equal(_fold(wk, "c1", 0)[1], _fold(wk, "c1", 2)[1])


# ------------------------------------------------------------------------------ refusals
def test_a_flipped_bit_is_refused_before_anything_is_decoded():
    data = encode_store(Store(dict(STORE.index), {k: np.array(v) for k, v in
                                                 STORE.arrays.items()}))
    entry = file_entry("store.bin", data)
    verify_bytes(data, entry)
    for at in (len(data) // 2, len(data) - 1, 30):
        bad = bytearray(data)
        bad[at] ^= 0x04
        with pytest.raises(BundleError, match="checksum mismatch"):
            verify_bytes(bytes(bad), entry)


def test_a_store_that_does_not_fit_its_index_is_a_bundle_error():
    def variant(**index) -> Store:
        return Store({**STORE.index, **index}, STORE.arrays)

    with pytest.raises(BundleError, match="index version"):
        materialize(variant(version=99), GRAPHS["1.00"], "1.00")
    with pytest.raises(BundleError, match="sampler"):
        materialize(variant(sampler="mt19937"), GRAPHS["1.00"], "1.00")
    with pytest.raises(BundleError, match="no width '0.75'"):
        materialize(STORE, GRAPHS["1.00"], "0.75")
    short = dict(STORE.arrays)
    short["c1/codebook"] = short["c1/codebook"][:3]
    with pytest.raises(BundleError, match="outside its 3-entry codebook"):
        materialize(Store(STORE.index, short), GRAPHS["1.00"], "1.00")
    with pytest.raises(ConfigError, match="sample must be in"):
        materialize(STORE, GRAPHS["1.00"], "1.00", sample=S_MAX)
    with pytest.raises(ConfigError, match="not both"):
        materialize(STORE, GRAPHS["1.00"], "1.00", sample=0, heads=1)


# ------------------------------------------------------------------------------ manifest
def _store_manifest(**over) -> dict:
    def cfg(cid, scope, samples, recipes):
        return {"id": cid, "width": float(recipes[0]["width"]), "scope": scope,
                "samples": samples,
                "files": [file_entry(f"{cid}-{i}.tflite", b"x" * (i + 1)).to_dict()
                          for i in range(len(recipes))],
                "invokes": len(recipes) if scope == "all" else 1,
                "output": {"kind": "logits", "shape": [samples if scope == "head" else 1, 3]},
                "temperature": 1.0, "temperature_folded": False, "weights": "dequantize",
                "macs": 1, "params": 1, "thresholds": {}, "val_nll": 0.1, "test": {},
                "materialize": recipes}

    return {"schema_version": 3, "layout": "store",
            "store": file_entry("store.bin", b"store").to_dict(),
            "input": {"shape": [1, 4, 4, 2], "layout": "NHWC", "dtype": "float32",
                      "value_range": [0.0, 1.0], "mean": [0.0, 0.0], "std": [1.0, 1.0]},
            "labels": ["a", "b", "c"], "batch_dim": 0, "graphs": copy.deepcopy(GRAPHS),
            "configurations": [
                cfg("p", "point", 1, [{"width": "0.50", "sample": None, "heads": 0}]),
                cfg("h", "head", 2, [{"width": "1.00", "sample": None, "heads": 2}]),
                cfg("a", "all", 2, [{"width": "1.00", "sample": 0, "heads": 0},
                                    {"width": "1.00", "sample": 2, "heads": 0}])],
            **over}


def test_materialize_file_follows_each_files_recipe():
    m = Manifest.from_dict(_store_manifest())
    assert m.is_store and [e.name for e in m.stored_entries()] == ["store.bin"]
    p, h, a = m.configurations
    assert materialize_file(STORE, m, p, 0) == materialize(STORE, GRAPHS["0.50"], "0.50")
    assert materialize_file(STORE, m, h, 0) == materialize(STORE, GRAPHS["1.00"], "1.00",
                                                           heads=2)
    assert materialize_file(STORE, m, a, 1) == materialize(STORE, GRAPHS["1.00"], "1.00",
                                                           sample=2)
    assert Manifest.from_dict(m.to_dict()) == m


def _broken(path: list, value) -> dict:
    d = _store_manifest()
    node = d
    for k in path[:-1]:
        node = node[k]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return d


@pytest.mark.parametrize("path, value, where", [
    (["store"], None, r"^store: missing"),
    (["store"], {"name": "store.tflite", "sha256": "0" * 64, "bytes": 1}, r"^store\.name"),
    (["graphs"], {}, r"^graphs: expected one graph"),
    (["graphs", "0.5"], {"tensors": [], "ops": [], "inputs": [], "outputs": []},
     r"^graphs\['0\.5'\]: expected a width key"),
    (["layout"], "zip", r"^layout: expected one of"),
    (["configurations", 1, "materialize", 0, "heads"], 1,
     r"^configurations\[1\]\.materialize\[0\]\.heads: expected 2"),
    (["configurations", 0, "materialize", 0, "sample"], 0,
     r"^configurations\[0\]\.materialize\[0\]\.sample: expected null"),
    (["configurations", 2, "materialize", 1, "sample"], 0,
     r"^configurations\[2\]\.materialize\[1\]\.sample: duplicate sample 0"),
    (["configurations", 2, "materialize", 1, "width"], "0.75",
     r"^configurations\[2\]\.materialize\[1\]\.width: no graph for width '0.75'"),
    (["configurations", 2, "materialize"], [{"width": "1.00", "sample": 0, "heads": 0}],
     r"^configurations\[2\]\.materialize: expected one recipe per file \(2\)"),
    (["configurations", 0, "materialize"], KeyError,
     r"^configurations\[0\]\.materialize: missing"),
])
def test_store_manifest_errors_name_their_key_path(path, value, where):
    with pytest.raises(BundleError, match=where):
        Manifest.from_dict(_broken(path, value))


def test_version_2_and_files_layout_refuse_store_keys():
    d = _store_manifest(schema_version=2)
    with pytest.raises(BundleError, match=r"^layout: needs schema version 3"):
        Manifest.from_dict(d)
    files = _store_manifest(layout="files", store=None, graphs={})
    with pytest.raises(BundleError, match=r"^configurations\[0\]\.materialize: expected no "
                                          r"recipes for layout 'files'"):
        Manifest.from_dict(files)
    with pytest.raises(BundleError, match=r"^store: expected null for layout 'files'"):
        Manifest.from_dict(_store_manifest(layout="files", graphs={}))
