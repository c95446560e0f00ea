"""The weight store from the exporter's side (issue 21, docs/store.md): stores built from real
checkpoints of every posterior kind, bundles exported with ``layout: store``, and the slices the
device materialises from them against torch and against the version-2 file route.

One tiny digits model is trained once (2 epochs); PWFN and SQS checkpoints are quantized from it
on first use (as tests/exporters/test_export.py does). Expectations come from torch forwards,
the checkpoint's own tensors and the files route, never from the code under test.
"""
import hashlib
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

torch.set_num_threads(1)

import edge_sdk  # noqa: E402
from edge_sdk.bundle import SCHEMA_VERSION, check_slice, read_manifest  # noqa: E402
from edge_sdk.errors import BundleError, ConfigError  # noqa: E402
from edge_sdk.store import NORMAL_BOUND, Store, decode_store, encode_store  # noqa: E402
from edge_sdk.store.decode import decode_point, sample_weights  # noqa: E402
from edge_sdk.store.materialize import (materialize, materialize_file,  # noqa: E402
                                        materialize_graph)
from exporters.export import ExportOptions, export_bundle  # noqa: E402
from exporters.measure import run_tflite  # noqa: E402
from exporters.slice import make_slice, posterior_kind  # noqa: E402
from exporters.store import build_store, encode_sigma, store_file_bytes  # noqa: E402
from exporters.tflite import export_point_slice  # noqa: E402
from trainer import checkpoint as ckpt_io  # noqa: E402
from user_nets import ConcatNet  # noqa: E402
from trainer.config import config_from_dict, load_config  # noqa: E402
from trainer.data import load_data, nhwc_inputs  # noqa: E402
from trainer.evaluate import batches  # noqa: E402
from trainer.layers import BayesNestedLayer  # noqa: E402

QUIET = dict(progress=False, log=lambda *a: None)
WIDTHS = [0.5, 1.0]
S = 2
MAX_EVAL = 50
KINDS = ["gaussian", "pwfn", "sqs"]


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def checkpoints(workdir):
    """kind -> checkpoint path (PWFN and SQS quantized lazily from the trained one)."""
    from trainer.train import train

    cfg = load_config("digits", ["train.epochs=2", "train.eval_every=100",
                                 "data.calib_samples=64"])
    trained = train(cfg, workdir / "run", **QUIET).checkpoint

    class _Lazy(dict):
        def __missing__(self, kind):
            from trainer.quantize.run import quantize_checkpoint

            over = {"pwfn": ["quantize.method=pwfn", "quantize.pwfn.schedule=[0.5,1.0]",
                             "quantize.pwfn.epochs_per_round=0", "quantize.pwfn.samples=1"],
                    "sqs": ["quantize.method=sqs", "quantize.sqs.epochs=1",
                            "quantize.sqs.samples=1"]}[kind]
            self[kind] = quantize_checkpoint(trained, load_config("digits", over),
                                             workdir / kind, **QUIET)
            return self[kind]
    return _Lazy(gaussian=trained)


@pytest.fixture(scope="module")
def data(checkpoints):
    ckpt = ckpt_io.load_checkpoint(checkpoints["gaussian"])
    cfg = config_from_dict(ckpt["config"])
    d = load_data(cfg.data, ckpt_io.input_spec(ckpt))
    calib = batches(d.train, 64, cfg.seed, batch=32)
    x, y = nhwc_inputs(d.test, MAX_EVAL)
    return calib, x, y


@pytest.fixture(scope="module")
def stores(checkpoints, data):
    """kind -> (checkpoint, model, StoreBuild) for WIDTHS and S samples."""
    calib, _, _ = data

    class _Lazy(dict):
        def __missing__(self, kind):
            ckpt = ckpt_io.load_checkpoint(checkpoints[kind])
            model = ckpt_io.model_from_checkpoint(ckpt)
            assert posterior_kind(ckpt) == kind
            self[kind] = (ckpt, model, build_store(model, ckpt, kind, WIDTHS, calib,
                                                   [1, 8, 8, 1], samples=S, seed=3))
            return self[kind]
    return _Lazy()


@pytest.fixture(scope="module")
def bundles(checkpoints, workdir):
    class _Lazy(dict):
        def __missing__(self, kind):
            out = workdir / f"bundle-{kind}"
            export_bundle(checkpoints[kind], out, ExportOptions(
                widths=WIDTHS, samples=S, scopes=["point", "head", "all"], measure=False,
                max_eval=MAX_EVAL), **QUIET)
            self[kind] = out
            return out
    return _Lazy()


def _layers(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, BayesNestedLayer)}


def _cols(cut: dict, shape, spatial: int):
    if cut["in"] is None:
        return np.arange(shape[1])
    ch = np.concatenate([np.arange(a, b) for a, b in cut["in"]])
    return (ch[:, None] * spatial + np.arange(spatial)).reshape(-1)


# ------------------------------------------------------------------------------ the store
@pytest.mark.parametrize("kind", KINDS)
def test_store_round_trip(stores, kind):
    """Decoding the store gives the checkpoint's point weights (exactly on a codebook, within
    half a step for int8), and its samples are the posterior's: mu + bounded sigma noise (sigma
    within the codebook's spacing) or categorical draws on the codebook with exact sparsity."""
    ckpt, model, build = stores[kind]
    again = decode_store(build.data)
    assert again.index == build.store.index and set(again.arrays) == set(build.store.arrays)
    post = ckpt.get("posterior") or {}
    for name, layer in _layers(model).items():
        mu = layer.weight_mu.detach().numpy()
        got = decode_point(build.store, name)
        L = build.store.index["layers"][name]
        if kind == "gaussian":
            step = build.store.array(f"{name}/step").reshape((-1,) + (1,) * (mu.ndim - 1))
            assert L["encoding"] == "int8" and np.all(np.abs(got - mu) <= step / 2 + 1e-7)
        else:
            assert np.array_equal(got, mu.astype(np.float32)), name
            assert L["encoding"] == ("codebook" if kind == "pwfn" else "sparse_codebook")
        draws = [sample_weights(build.store, name, s) for s in range(S)]
        if kind == "sqs":
            t = post["tensors"][name]
            mask = t["mask"].numpy().astype(bool)
            comps = t["codebook"].numpy()[t["valid"].numpy().astype(bool)]
            for d in draws:
                assert (d[~mask] == 0).all() and np.isin(d[mask], comps.astype(np.float32)).all()
            continue
        sigma = (post["tensors"][f"{name}.weight"]["sigma"] if kind == "pwfn"
                 else layer.weight_sigma).detach().numpy()
        assert L.get("sigma_coding", "absolute") == "absolute"  # alpha spread: 4-bit absolute
        book, idx = encode_sigma(sigma, 4)
        pos = sigma > 0
        spread = np.log(sigma[pos].max() / sigma[pos].min()) / (2 * 14) + 1e-6
        assert np.abs(np.log(book[idx].reshape(sigma.shape)[pos] / sigma[pos])).max() <= spread
        for d in draws:
            z = (d - got) / np.where(pos, book[idx].reshape(sigma.shape), 1)
            assert np.abs(z[pos]).max() <= NORMAL_BOUND * (1 + 1e-4)
            assert (d[~pos] == got[~pos]).all()
        assert not np.array_equal(draws[0], draws[1])


def test_a_layer_with_one_alpha_stores_its_sigma_relative_in_zero_bits(checkpoints, data):
    """sigma = 0.2 max(|mu|, step/2) in every layer (alpha one value, as the trainer
    initialises it; mu on its int8 grid): the
    store codes each layer's sigma as one multiplier of max(|mu_dec|, step/2) (version 3,
    sigma_coding relative, 0 bits: no index bytes), and the device's draws are mu_dec + that sigma x
    the sampler's eps; sigma_rel_tol=None writes the version-2 store (absolute, 4 bits)."""
    from edge_sdk.store import normal, stream_id
    from edge_sdk.tflite.quant import quantize_per_channel
    from trainer.layers import _inverse_softplus

    calib, _, _ = data
    ckpt = ckpt_io.load_checkpoint(checkpoints["gaussian"])
    model = ckpt_io.model_from_checkpoint(ckpt)
    with torch.no_grad():
        for layer in _layers(model).values():  # mu on its int8 grid: mu_dec = mu
            qt = quantize_per_channel(layer.weight_mu.detach().numpy(), 0)
            layer.weight_mu.copy_(torch.from_numpy(qt.dequantize()))
            half = torch.from_numpy(qt.scale / 2).reshape((-1,) + (1,) * (qt.values.ndim - 1))
            sig = torch.maximum(layer.weight_mu.abs(), half) * 0.2  # a zero mean: step / 2
            layer.weight_rho.copy_(_inverse_softplus(sig))
    build = build_store(model, ckpt, "gaussian", [1.0], calib, [1, 8, 8, 1], samples=2, seed=3)
    assert build.store.index["version"] == 3
    for name, layer in _layers(model).items():
        L = build.store.index["layers"][name]
        assert (L["sigma_coding"], L["sigma_bits"]) == ("relative", 0), name
        assert build.store.array(f"{name}/sigma_index").size == 0
        mu = decode_point(build.store, name)
        step = build.store.array(f"{name}/step").reshape((-1,) + (1,) * (mu.ndim - 1))
        sigma = layer.weight_sigma.detach().numpy()
        ref = np.maximum(np.abs(mu), step / 2)  # the reference: mu_dec, at least step / 2
        for s in range(2):
            eps = normal(3 + s, stream_id(name), mu.size).reshape(mu.shape)
            live = np.abs(eps) > 0.1
            ratio = ((sample_weights(build.store, name, s) - mu) / eps / ref)[live]
            # one multiplier per layer (0 bits): the 0.2 it was built with
            np.testing.assert_allclose(ratio, 0.2, rtol=1e-3)
    old = build_store(model, ckpt, "gaussian", [1.0], calib, [1, 8, 8, 1], samples=2, seed=3,
                      sigma_rel_tol=None)
    assert old.store.index["version"] == 2
    assert all("sigma_coding" not in L and L["sigma_bits"] == 4
               for L in old.store.index["layers"].values())
    assert len(old.data) > len(build.data)


@pytest.mark.parametrize("kind", KINDS)
def test_every_width_is_a_prefix_of_the_store(stores, data, kind):
    """Width w's weights are the first rows/columns of the store's (the truncation plan's
    cuts), and a sample's narrow weights are the prefix of its full-width ones."""
    _, model, build = stores[kind]
    for w in WIDTHS:
        small = dict(model.truncate(w).named_modules())
        cuts = build.store.index["widths"][f"{w:.2f}"]["layers"]
        for name, L in build.store.index["layers"].items():
            full = decode_point(build.store, name)
            cut = cuts[name]
            spatial = int(np.prod(L.get("flat_hw") or [1, 1]))
            part = full[:cut["out"]][:, _cols(cut, L["shape"], spatial)] \
                if L["kind"] != "depthwise" else full[:cut["out"]]
            mu = small[name].weight_mu.detach().numpy()
            assert part.shape == mu.shape, name
            if kind != "gaussian":
                assert np.array_equal(part, mu), (w, name)
            sample = sample_weights(build.store, name, 1)
            assert np.array_equal(sample_weights(build.store, name, 1, cut["out"]),
                                  sample[:cut["out"]])
        assert cut["out"] <= L["shape"][0]
    assert any(c["out"] < build.store.index["layers"][n]["shape"][0]
               for n, c in build.store.index["widths"]["0.50"]["layers"].items())


def test_pwfn_point_slice_is_codebook_value_times_fold_scale_exactly(stores):
    _, model, build = stores["pwfn"]
    for w in WIDTHS:
        wk = f"{w:.2f}"
        fold = build.store.array(f"{wk}/fold")
        _, arrays, records = materialize_graph(build.store, build.graphs[wk], wk)
        cuts = build.store.index["widths"][wk]["layers"]
        int8 = 0
        for r in records:
            L, cut = build.store.index["layers"][r.layer], cuts[r.layer]
            spatial = int(np.prod(L.get("flat_hw") or [1, 1]))
            value = decode_point(build.store, r.layer)[:cut["out"]]
            if L["kind"] != "depthwise":
                value = value[:, _cols(cut, L["shape"], spatial)]
            a = fold[0, cut["fold"]:cut["fold"] + cut["out"]]
            want = value * a.reshape((-1,) + (1,) * (value.ndim - 1))
            assert np.array_equal(r.effective, want), (wk, r.layer)  # float32, bit for bit
            if L["route"] == "int8":
                int8 += 1
                assert r.codes and r.route == "dequantize" and f"{r.layer}/weight_int8" in arrays
        assert int8 >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_materialised_point_slice_equals_the_file_route(stores, data, kind):
    """Against the version-2 file route at the same width (export_point_slice of the sliced
    model): top-1 agreement and logits within the int8 grid (one full-width step per channel
    instead of one per slice). PWFN weights are exact on the store's power-of-two steps: they
    equal the file route's float32 weights up to float rounding; SQS's are not, and both routes
    quantize each slice per channel (layer route "slice"): the same logits."""
    ckpt, model, build = stores[kind]
    calib, x, _ = data
    for w in WIDTHS:
        wk = f"{w:.2f}"
        got = run_tflite(materialize(build.store, build.graphs[wk], wk), x)[:, 0]
        sl = make_slice(model, w, calib)
        ref = run_tflite(export_point_slice(sl, [1, 8, 8, 1], pow2_step=kind == "pwfn")[0],
                         x)[:, 0]
        agree = (got.argmax(1) == ref.argmax(1)).mean()
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert agree >= 0.96 and err <= 0.05, (w, agree, err)
        if kind == "pwfn":
            exact = run_tflite(export_point_slice(sl, [1, 8, 8, 1], "float")[0], x)[:, 0]
            assert np.abs(got - exact).max() <= 1e-5 * np.abs(exact).max(), w
        if kind == "sqs":  # route "slice": the files route's per-slice int8, the same logits
            assert np.abs(got - ref).max() <= 1e-6 * np.abs(ref).max(), w


def test_a_samples_batch_norm_is_recollected_on_the_weights_the_device_draws(stores, data):
    """The sampled slice's folds were re-collected on exactly the weights the device sampler
    generates: torch with those weights (and its own re-collection) matches the materialised
    slice; torch with another sample's weights does not match as well."""
    _, model, build = stores["gaussian"]
    calib, x, _ = data
    layers = _layers(model)

    def torch_logits(sample):
        ws = {n: torch.from_numpy(sample_weights(build.store, n, sample)) for n in layers}
        ref = make_slice(model, 0.5, calib, ws)
        with torch.no_grad():
            return ref(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()

    got = run_tflite(materialize(build.store, build.graphs["0.50"], "0.50", sample=1), x)[:, 0]
    right, wrong = torch_logits(1), torch_logits(0)
    err_right = np.abs(got - right).max() / np.abs(right).max()
    assert err_right <= 0.05 and (got.argmax(1) == right.argmax(1)).mean() >= 0.9
    assert err_right < np.abs(got - wrong).max() / np.abs(wrong).max()


# ------------------------------------------------------------------------------ bundles
@pytest.mark.parametrize("kind", KINDS)
def test_store_bundle_files_are_the_materialised_bytes(bundles, data, kind):
    """Every (virtual) file of every configuration, materialised from store.bin by its recipe,
    has the manifest's sha256 and tensors: what was measured is what the device builds."""
    out = bundles[kind]
    m = read_manifest(out, verify=True)
    assert m.schema_version >= 5 and m.layout == "store"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.yaml", "store.bin",
                                                     "uncertainty.bin"]
    # the point slice in every precision (float, dynamic range, int8), then heads and samples
    ids = [f"w{w:.2f}-{s}" for w in WIDTHS for s in
           ["point", "point-dyn", "point-int8", *(f"head{k}" for k in range(1, S + 1)),
            *(f"all{k}" for k in range(1, S + 1))]]
    assert list(m.ids) == ids
    raw = (out / "store.bin").read_bytes()
    # the container's version 2 (deflated): smaller than the version-1 bytes it inflates to,
    # and the manifest's sha256 / bytes are those of the compressed file
    version, inner = struct.unpack_from("<IQ", raw, 8)
    assert version == 2 and len(raw) < inner and m.store.bytes == len(raw)
    assert m.store.sha256 == hashlib.sha256(raw).hexdigest()
    store = decode_store(raw)
    assert store.nbytes == inner and len(encode_store(store)) == inner
    seen = {}
    for c in m.configurations:
        for i, f in enumerate(c.files):
            if f.name not in seen:
                buf = materialize_file(store, m, c, i)
                assert hashlib.sha256(buf).hexdigest() == f.sha256 and len(buf) == f.bytes
                check_slice(buf, f.name, c, m.input, m.batch_dim)
                seen[f.name] = buf
    # all S's files are the first S of all S_max's; every recorded accuracy is its files'
    _, x, y = data
    for w in WIDTHS:
        full = m.configuration(f"w{w:.2f}-all{S}")
        for k in range(1, S + 1):
            c = m.configuration(f"w{w:.2f}-all{k}")
            assert c.files == full.files[:k] and c.materialize == full.materialize[:k]
            logits = np.stack([run_tflite(seen[f.name], x)[:, 0] for f in c.files])
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs = (probs / probs.sum(-1, keepdims=True)).mean(0)
            assert c.test["raw"]["accuracy"] == pytest.approx((probs.argmax(1) == y).mean(),
                                                              abs=1e-6)
    # the runtime loads the compressed store and predicts what the materialised files say
    model = edge_sdk.load(out, profile=None, memory_reader=lambda: 1e9)
    assert model._slices.store.nbytes == inner
    spec = m.input  # the test inputs are normalised; predict() takes raw values
    raw = np.clip(x[:5] * np.float32(spec.std) + np.float32(spec.mean), *spec.value_range)
    for w in WIDTHS:
        c = m.configuration(f"w{w:.2f}-point")
        want = run_tflite(seen[c.files[0].name], x[:5])[:, 0].argmax(-1)
        assert [model.predict(xi, config_id=c.id).label for xi in raw] == want.tolist()


def test_a_store_bundle_records_each_configurations_validation_accuracy(bundles, checkpoints,
                                                                        tmp_path):
    """Schema version 10: every configuration's val_accuracy is the accuracy of its
    materialised files on the validation split (at its temperature); the compact store
    manifest writes it and ``edge-sdk materialize``'s files bundle keeps it."""
    import yaml

    from edge_sdk.store.to_files import materialize_bundle

    out = bundles["gaussian"]
    written = yaml.safe_load((out / "manifest.yaml").read_text())
    assert written["schema_version"] == SCHEMA_VERSION == 10
    assert all("val_accuracy" in c for c in written["configurations"])
    m = read_manifest(out, verify=True)
    ckpt = ckpt_io.load_checkpoint(checkpoints["gaussian"])
    d = load_data(config_from_dict(ckpt["config"]).data, ckpt_io.input_spec(ckpt))
    x, y = nhwc_inputs(d.val, MAX_EVAL)  # the exporter's validation inputs
    store = decode_store((out / "store.bin").read_bytes())
    for c in m.configurations:
        files = [materialize_file(store, m, c, i) for i in range(len(c.files))]
        if c.scope == "head":
            logits = np.transpose(run_tflite(files[0], x), (1, 0, 2))
        else:
            logits = np.stack([run_tflite(f, x)[:, 0] for f in files])
        z = np.asarray(logits, np.float64) / c.temperature
        probs = np.exp(z - z.max(-1, keepdims=True))
        probs = (probs / probs.sum(-1, keepdims=True)).mean(0)
        assert c.val_accuracy == pytest.approx((probs.argmax(1) == y).mean(), abs=1e-6), c.id
    files_bundle, _ = materialize_bundle(out, tmp_path / "files")
    again = read_manifest(files_bundle, verify=True)
    assert again.layout == "files"
    assert [c.val_accuracy for c in again.configurations] == \
        [c.val_accuracy for c in m.configurations]


def test_store_file_bytes_compresses_only_when_smaller():
    """The exporter's rule: version 2 when it is smaller than version 1 (and asked for)."""
    rng = np.random.default_rng(0)
    small = Store({"k": 1}, {"codes": np.tile(np.arange(8, dtype=np.int8), 512)})
    noise = Store({}, {"bytes": rng.integers(0, 256, 4096).astype(np.uint8)})
    for store in (small, noise):
        v1 = encode_store(store)
        assert store_file_bytes(store, compress=False) == v1
        got = store_file_bytes(store)
        assert len(got) <= len(v1)
        assert struct.unpack_from("<I", got, 8)[0] == (2 if store is small else 1)
        assert decode_store(got).nbytes == len(v1)
    assert len(store_file_bytes(small)) < len(encode_store(small)) // 4


def test_head_s_logits_are_the_first_s_rows_of_head_s_max(bundles, data):
    """Why head-S quality is computed from the S_max head: its logits are head S_max's first
    S rows (the stacked classifier is quantized per row)."""
    out = bundles["gaussian"]
    m = read_manifest(out)
    store = decode_store((out / "store.bin").read_bytes())
    _, x, _ = data
    for w in WIDTHS:
        big = m.configuration(f"w{w:.2f}-head{S}")
        rows = run_tflite(materialize_file(store, m, big, 0), x)  # [N, S, C]
        for k in range(1, S):
            c = m.configuration(f"w{w:.2f}-head{k}")
            got = run_tflite(materialize_file(store, m, c, 0), x)
            assert got.shape == (len(x), k, 10)
            assert np.abs(got - rows[:, :k]).max() <= 1e-5 * np.abs(rows).max()


def test_sample_counts_default_is_powers_of_two_plus_s_max():
    from exporters.layouts import sample_counts

    assert sample_counts(8) == (1, 2, 4, 8)
    assert sample_counts(6) == (1, 2, 4, 6)
    assert sample_counts(1) == (1,) and sample_counts(2) == (1, 2)
    assert sample_counts(8, "all") == tuple(range(1, 9))
    assert sample_counts(8, [8, 2, 1]) == (1, 2, 8)


def test_cli_sample_counts_option():
    import argparse

    from exporters.cli import _sample_counts

    assert _sample_counts("1,2,4,8") == [1, 2, 4, 8] and _sample_counts("all") == "all"
    with pytest.raises(argparse.ArgumentTypeError, match="'1,x'"):
        _sample_counts("1,x")


def _head_all_ids(m, w):
    return {sc: [c.samples for c in m.configurations if c.width == w and c.scope == sc]
            for sc in ("head", "all")}


@pytest.mark.parametrize("counts, want", [(None, [1, 2, 4]), ("all", [1, 2, 3, 4])])
def test_store_bundle_has_a_configuration_per_listed_sample_count(checkpoints, workdir,
                                                                  counts, want):
    """S_max = 4: by default head and all configurations for S = 1, 2, 4 only (head files for
    those S only), with "all" every S in 1..4; the all scope's sample files s0..s3 either way."""
    out = workdir / f"counts-{counts}"
    export_bundle(checkpoints["gaussian"], out, ExportOptions(
        widths=WIDTHS, samples=4, sample_counts=counts, scopes=["head", "all"], measure=False,
        max_eval=10), **QUIET)
    m = read_manifest(out, verify=True)
    for w in WIDTHS:
        assert _head_all_ids(m, w) == {"head": want, "all": want}
        c = m.configuration(f"w{w:.2f}-all4")
        assert [f.name for f in c.files] == [f"w{w:.2f}-s{i}.tflite" for i in range(4)]
        assert m.configuration(f"w{w:.2f}-head{want[-2]}").files[0].name == \
            f"w{w:.2f}-head{want[-2]}.tflite"
    assert len(m.configurations) == 2 * len(WIDTHS) * len(want)


@pytest.mark.parametrize("counts, named", [([1, 2, 9], "9"), ([1, 2], "include S_max"),
                                           ([0, 8], "0"), ("some", "'some'"), ([1.5, 8], "1.5")])
def test_a_bad_sample_counts_list_is_refused_naming_it(workdir, counts, named):
    """Refused before anything is read or written (the checkpoint need not exist)."""
    out = workdir / "bad-counts"
    with pytest.raises(ConfigError, match="sample_counts") as e:
        export_bundle(workdir / "no-such.pt", out, ExportOptions(
            samples=8, sample_counts=counts, scopes=["head"], measure=False), **QUIET)
    assert named in str(e.value) and not out.exists()


def test_a_store_bundle_with_a_flipped_bit_is_refused(bundles, workdir):
    bad = workdir / "flipped"
    shutil.copytree(bundles["pwfn"], bad)
    f = bad / "store.bin"
    blob = bytearray(f.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    f.write_bytes(bytes(blob))
    with pytest.raises(BundleError, match="checksum mismatch for 'store.bin'"):
        read_manifest(bad, verify=True)


def test_files_layout_writes_plain_tflite_files(checkpoints, workdir):
    out = workdir / "files"
    export_bundle(checkpoints["gaussian"], out, ExportOptions(
        widths=[1.0], scopes=["point"], measure=False, max_eval=10, layout="files",
        precisions=("float",)), **QUIET)
    m = read_manifest(out, verify=True)
    assert (m.schema_version, m.layout, m.store, m.graphs) == (SCHEMA_VERSION, "files", None, {})
    assert sorted(p.name for p in Path(out).iterdir()) == ["manifest.yaml", "uncertainty.bin",
                                                           "w1.00-point.tflite"]
    assert m.configurations[0].materialize is None


def test_pwfn_head_scope_is_the_same_slice_on_both_routes_given_the_same_draws(
        checkpoints, bundles, workdir, data, monkeypatch):
    """The files route's head slice, given the store route's classifier draws, computes the
    store's head logits: both run the point slice's codebook-exact backbone (PWFN) and the S
    sampled classifiers on the per-row int8 grid (docs/store.md §7). The files route once
    re-quantized a PWFN head's backbone on a max|w|/127 step (its own point slice used the
    exact power-of-two one), so its head ran another network than its point slice and the
    store's head: the routes' sampled scopes differed by more than the draws."""
    import exporters.layouts as L

    out = bundles["pwfn"]
    m = read_manifest(out)
    store = decode_store((out / "store.bin").read_bytes())
    names = list(store.index["layers"])

    def store_draws(model, ckpt, count, seed=0, sample_tau=None):
        return [{n: torch.from_numpy(sample_weights(store, n, s)) for n in names}
                for s in range(count)]

    monkeypatch.setattr(L, "posterior_samples", store_draws)
    files = workdir / "files-head-pwfn"
    export_bundle(checkpoints["pwfn"], files, ExportOptions(
        widths=WIDTHS, samples=S, scopes=["head"], measure=False, max_eval=MAX_EVAL,
        layout="files", force=True), **QUIET)
    fm = read_manifest(files)
    _, x, _ = data
    for w in WIDTHS:
        cid = f"w{w:.2f}-head{S}"
        want = run_tflite(materialize_file(store, m, m.configuration(cid), 0), x)
        got = run_tflite((files / fm.configuration(cid).files[0].name).read_bytes(), x)
        assert got.shape == want.shape == (len(x), S, 10)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), w
        assert fm.configuration(cid).test == m.configuration(cid).test, w


# ------------------------------------------------------------------------------ trainer.nest



def test_a_nested_concat_network_materialises_like_its_truncation():
    """Segmented input ranges and a forward-folded ReLU6 rescale (trainer.nest) in the store:
    the materialised point slice computes what the truncated torch model computes."""
    from support import randomise
    from trainer.nesting import nest

    torch.manual_seed(0)
    model = nest(ConcatNet(), groups=4).eval()
    randomise(model, 2)
    gen = torch.Generator().manual_seed(1)
    calib = [(torch.randn(16, 3, 8, 8, generator=gen), torch.zeros(16)) for _ in range(2)]
    plan = model.truncation_plan(0.5)
    assert plan["body.mix"].in_ranges == [(0, 8), (16, 32)]  # each segment at its offset
    assert plan["body.mix"].in_scale is not None  # the ReLU6 branch's keep probabilities
    build = build_store(model, {}, "gaussian", [0.5, 1.0], calib, [1, 8, 8, 3])
    assert build.store.index["widths"]["0.50"]["layers"]["body.mix"]["in"] == [[0, 8], [16, 32]]
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 3)).astype(np.float32)
    for w in (0.5, 1.0):
        ref = make_slice(model, w, calib)
        with torch.no_grad():
            want = ref(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
        got = run_tflite(materialize(build.store, build.graphs[f"{w:.2f}"], f"{w:.2f}"), x)
        assert np.abs(got[:, 0] - want).max() <= 0.05 * np.abs(want).max(), w
