"""Exporter pipeline: slices, posterior samples, calibration, measurement, bundle, CLI.

One tiny digits model is trained once per module (2 epochs); PWFN and SQS checkpoints are
quantized from it on first use. Every expectation is computed independently of the code under
test (hand-made examples, torch forwards, direct statistics), with ≤ 64 calibration samples and
``measure=False`` for the bundle exports.
"""
import copy
import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

torch.set_num_threads(1)

from edge_sdk.bundle import read_manifest  # noqa: E402
from edge_sdk.errors import BundleError, ConfigError  # noqa: E402
from exporters.calibrate import (MIN_CALIBRATION_SAMPLES, CalibrationWarning,  # noqa: E402
                                 confidence_thresholds, fit_temperature, predictive_probs)
from exporters.export import ExportOptions, export_bundle  # noqa: E402
from exporters.measure import latency_ms, memory_mb, run_tflite  # noqa: E402
from exporters.slice import (make_slice, posterior_kind, posterior_samples,  # noqa: E402
                             sliced_heads, stack_heads)
from exporters.tflite import export_point_slice  # noqa: E402
from trainer import checkpoint as ckpt_io  # noqa: E402
from trainer.config import config_from_dict, load_config  # noqa: E402
from trainer.data import load_data  # noqa: E402
from trainer.evaluate import batches  # noqa: E402

QUIET = dict(progress=False, log=lambda *a: None)
WIDTHS = [0.5, 1.0]
S = 2  # posterior samples per width in the bundle exports
MAX_EVAL = 50


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def trained(workdir):
    from trainer.train import train

    cfg = load_config("digits", ["train.epochs=2", "train.eval_every=100",
                                 "data.calib_samples=64"])
    res = train(cfg, workdir / "run", **QUIET)
    return res.checkpoint


_quantized = {}


def _quantize(trained, workdir, method):
    if method not in _quantized:
        from trainer.quantize.run import quantize_checkpoint

        over = {"pwfn": ["quantize.method=pwfn", "quantize.pwfn.schedule=[0.5,1.0]",
                         "quantize.pwfn.epochs_per_round=0", "quantize.pwfn.samples=1"],
                "sqs": ["quantize.method=sqs", "quantize.sqs.epochs=1",
                        "quantize.sqs.samples=1"]}[method]
        _quantized[method] = quantize_checkpoint(trained, load_config("digits", over),
                                                 workdir / method, **QUIET)
    return _quantized[method]


@pytest.fixture(scope="module")
def checkpoints(trained, workdir):
    """kind -> checkpoint path, quantizing lazily."""
    class _Lazy(dict):
        def __missing__(self, kind):
            self[kind] = trained if kind == "gaussian" else _quantize(trained, workdir, kind)
            return self[kind]
    return _Lazy()


@pytest.fixture(scope="module")
def data(trained):
    cfg = config_from_dict(ckpt_io.load_checkpoint(trained)["config"])
    return cfg, load_data(cfg.data)


@pytest.fixture(scope="module")
def calib(data):
    """The exporter's calibration subset: 64 training samples, one batch."""
    cfg, d = data
    out = batches(d.train, min(cfg.data.calib_samples, len(d.train)), cfg.seed, batch=256)
    assert len(out) == 1 and out[0][0].shape[0] == 64
    return out


def load(path):
    ckpt = ckpt_io.load_checkpoint(path)
    return ckpt, ckpt_io.model_from_checkpoint(ckpt)


def torch_logits(model, x_nchw):
    with torch.no_grad():
        return model.eval()(x_nchw).numpy()


def nhwc(x_nchw):
    return x_nchw.permute(0, 2, 3, 1).contiguous().numpy()


# ------------------------------------------------------------------ 1. head scope
def test_head_scope_file_equals_separate_torch_forwards(checkpoints, data, calib):
    ckpt, model = load(checkpoints["gaussian"])
    _, d = data
    width, samples = 0.5, 3
    point = make_slice(model, width, calib)
    draws = posterior_samples(model, ckpt, samples, seed=1)
    heads = sliced_heads(model, draws, width)
    kept = int(model.classifier.weight_mu.shape[1] * width)  # fc's kept outputs (8 groups)
    for h, ws in zip(heads, draws):  # each head is its sample's classifier cut to the slice
        assert torch.equal(h, ws["classifier"][:, :kept])
    buf, info = export_point_slice(stack_heads(point, heads), [1, 8, 8, 1], weights="float",
                                   output_shape=[samples, 10])
    assert info["output"]["shape"] == [samples, 10]
    x = d.test.x[:20]
    got = run_tflite(buf, nhwc(x))  # [N, S, C]
    assert got.shape == (20, samples, 10)
    want = []
    for h in heads:  # S separate forwards of the point slice with that head substituted
        m = copy.deepcopy(point)
        m.classifier.weight_mu.data = h.clone()
        want.append(torch_logits(m, x))
    want = np.stack(want, 1)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    # the heads really differ (otherwise the test could not tell samples apart)
    assert np.abs(want[:, 0] - want[:, 1]).max() > 1e-3 * np.abs(want).max()


# ---------------------------------------------------- 2. re-collected batch norm
def _stats(y):
    """Per-channel mean and unbiased variance over (N, H, W): what one cumulative BN batch
    records (torch's running_var is the unbiased batch variance)."""
    y = y.double().transpose(0, 1).flatten(1)
    return y.mean(1), y.var(1, unbiased=True)


@pytest.mark.parametrize("width", [0.5, 1.0])
def test_recollected_bn_equals_empirical_statistics(checkpoints, calib, width):
    ckpt, model = load(checkpoints["gaussian"])
    x = calib[0][0]
    conv1, conv2 = model.features[0], model.features[1]
    c1 = int(conv1.out_channels * width)
    c2 = int(conv2.out_channels * width)
    sl = make_slice(model, width, calib)

    # first layer: conv(x, weight_mu) before BN, restricted to the kept channels
    y1 = F.conv2d(x, conv1.weight_mu.detach(), padding=1)
    mean1, var1 = _stats(y1)
    bn1 = sl.features[0].bn
    assert bn1.running_mean.shape == (c1,)
    torch.testing.assert_close(bn1.running_mean.double(), mean1[:c1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn1.running_var.double(), var1[:c1], rtol=1e-5, atol=1e-6)

    # second layer: its inputs are layer 1 at this width (BN in train mode: batch statistics,
    # biased variance; ReLU; dropped channels zero, kept ones times their keep probability)
    b = conv1.bn
    h = (y1 - y1.mean((0, 2, 3), keepdim=True)) / torch.sqrt(
        y1.var((0, 2, 3), unbiased=False, keepdim=True) + b.eps)
    h = torch.relu(h * b.weight.detach().view(1, -1, 1, 1) + b.bias.detach().view(1, -1, 1, 1))
    unit = conv1.ordering
    scale = torch.zeros(conv1.out_channels)
    per = conv1.out_channels // unit.groups
    scale[:c1] = unit.keep_probability().detach().repeat_interleave(per)[:c1]
    h = h * scale.view(1, -1, 1, 1)
    y2 = F.conv2d(h, conv2.weight_mu.detach(), padding=1)
    mean2, var2 = _stats(y2)
    bn2 = sl.features[1].bn
    assert bn2.running_mean.shape == (c2,)
    torch.testing.assert_close(bn2.running_mean.double(), mean2[:c2], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bn2.running_var.double(), var2[:c2], rtol=1e-4, atol=1e-6)


def test_sampled_slice_recollects_bn_with_its_own_weights(checkpoints, calib):
    ckpt, model = load(checkpoints["gaussian"])
    draw = posterior_samples(model, ckpt, 1, seed=3)[0]
    x = calib[0][0]
    sl = make_slice(model, 0.5, calib, draw)
    mean, var = _stats(F.conv2d(x, draw["features.0"], padding=1))
    torch.testing.assert_close(sl.features[0].bn.running_mean.double(), mean[:16],
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sl.features[0].bn.running_var.double(), var[:16],
                               rtol=1e-5, atol=1e-6)
    # and the slice runs that sample's weights
    assert torch.equal(sl.features[0].weight_mu.detach(), draw["features.0"][:16])


# ------------------------------------------------------------- 3. posterior samples
N_DRAWS = 200


def _check_gaussian_moments(model, draws, sigmas):
    """mean ≈ mu and std ≈ sigma per weight, within sampling error of N_DRAWS draws."""
    for name, layer in [(n, m) for n, m in model.named_modules() if hasattr(m, "weight_mu")]:
        mu = layer.weight_mu.detach().double()
        sig = sigmas[name].double()
        w = torch.stack([d[name] for d in draws]).double()
        live = sig > 0
        z = (w - mu) / torch.where(live, sig, torch.ones_like(sig))
        zm, zs = z.mean(0)[live], z.std(0)[live]
        n = N_DRAWS
        # aggregated over every weight of the layer: tight
        assert abs(float(zm.mean())) < 6 / math.sqrt(n * zm.numel())
        assert abs(float((zm * math.sqrt(n)).std()) - 1) < 0.15
        assert abs(float(zs.mean()) - 1) < 0.02 + 6 / math.sqrt(2 * n * zs.numel())
        # per weight: no weight far off (6 standard errors)
        assert float(zm.abs().max()) < 6 / math.sqrt(n) * 1.2
        assert float((zs - 1).abs().max()) < 6 / math.sqrt(2 * n) * 1.2


def test_gaussian_samples_have_posterior_moments(checkpoints):
    ckpt, model = load(checkpoints["gaussian"])
    assert posterior_kind(ckpt) == "gaussian"
    draws = posterior_samples(model, ckpt, N_DRAWS, seed=0)
    sig = {n: m.weight_sigma.detach() for n, m in model.named_modules()
           if hasattr(m, "weight_mu")}
    _check_gaussian_moments(model, draws, sig)


def test_pwfn_samples_have_posterior_moments_and_fixed_weights_stay_on_codebook(checkpoints):
    ckpt, model = load(checkpoints["pwfn"])
    post = ckpt["posterior"]
    assert posterior_kind(ckpt) == "pwfn"
    codebook = post["codebook"]
    layers = {n: m for n, m in model.named_modules() if hasattr(m, "weight_mu")}
    sig = {n: post["tensors"][f"{n}.weight"]["sigma"] for n in layers}
    # the point network is the codebook means
    for n, m in layers.items():
        idx = post["tensors"][f"{n}.weight"]["indices"].long()
        assert torch.equal(m.weight_mu.detach(), codebook[idx])
    draws = posterior_samples(model, ckpt, N_DRAWS, seed=0)
    _check_gaussian_moments(model, draws, sig)
    zero = 0
    cb = set(codebook.tolist())
    for n, m in layers.items():
        fixed = sig[n] == 0
        zero += int(fixed.sum())
        for d in draws[:5]:
            assert torch.equal(d[n][fixed], m.weight_mu.detach()[fixed])
            assert set(d[n][fixed].tolist()) <= cb
    assert zero > 0  # the checkpoint has weights with sigma 0, so the check above bit


def test_sqs_samples_stay_on_codebook_with_exact_sparsity(checkpoints):
    ckpt, model = load(checkpoints["sqs"])
    post = ckpt["posterior"]
    assert posterior_kind(ckpt) == "sqs"
    draws = posterior_samples(model, ckpt, 4, seed=0)
    layers = {n: m for n, m in model.named_modules() if hasattr(m, "weight_mu")}
    for name, t in post["tensors"].items():
        mask, window = t["mask"], t["window"].long()
        cands = t["codebook"][window]  # [..., K] each weight's window components
        valid = t["valid"][window]
        # the point network: pruned greedy weights
        greedy = torch.where(mask, t["codebook"][window, t["index"].long()], torch.zeros(()))
        assert torch.equal(layers[name].weight_mu.detach(), greedy)
        for d in draws:
            w = d[name]
            assert w.shape == mask.shape
            assert bool((w[~mask] == 0).all())
            hit = ((cands == w.unsqueeze(-1)) & valid).any(-1)
            assert bool(hit[mask].all())
    # the draws are not all the greedy network (at the checkpoint's sampling temperature)
    assert any(not torch.equal(d[n], layers[n].weight_mu.detach())
               for d in draws for n in post["tensors"])
    # at a vanishing sampling temperature the draw is the greedy network (argmax phi)
    cold = posterior_samples(model, ckpt, 1, seed=5, sample_tau=1e-6)[0]
    same = sum(int((cold[n] == layers[n].weight_mu.detach()).sum()) for n in post["tensors"])
    total = sum(layers[n].weight_mu.numel() for n in post["tensors"])
    assert same / total > 0.99


@pytest.mark.parametrize("kind", ["gaussian", "pwfn", "sqs"])
def test_samples_are_reproducible_in_the_seed(checkpoints, kind):
    ckpt, model = load(checkpoints[kind])
    a = posterior_samples(model, ckpt, 2, seed=7)
    b = posterior_samples(model, ckpt, 2, seed=7)
    c = posterior_samples(model, ckpt, 2, seed=8)
    assert a[0].keys() == b[0].keys() == c[0].keys()
    for x, y in zip(a, b):
        assert all(torch.equal(x[k], y[k]) for k in x)
    assert any(not torch.equal(a[i][k], c[i][k]) for i in range(2) for k in a[i])
    assert any(not torch.equal(a[0][k], a[1][k]) for k in a[0])  # two draws differ


# ------------------------------------------------------------------- 4. calibration
def _nll(probs, labels):
    return float(-np.mean(np.log(probs[np.arange(len(labels)), labels])))


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _calibrated(n=4000, c=10, seed=0):
    """Logits z and labels drawn from softmax(z): calibrated by construction (true T = 1)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, (n, c))
    p = _softmax(z)
    labels = np.array([rng.choice(c, p=row) for row in p])
    return z, labels


def test_predictive_probs_is_the_sample_average_at_temperature():
    logits = np.array([[[0.0, math.log(3.0)]], [[math.log(3.0), 0.0]]])  # [S=2, N=1, C=2]
    np.testing.assert_allclose(predictive_probs(logits), [[0.5, 0.5]], atol=1e-12)
    np.testing.assert_allclose(predictive_probs(logits[0]), [[0.25, 0.75]], atol=1e-12)
    np.testing.assert_allclose(predictive_probs(logits[0] * 2, 2.0), [[0.25, 0.75]], atol=1e-12)


def test_temperature_recovers_known_over_confidence():
    z, y = _calibrated()
    t = fit_temperature(5 * z, y)
    assert t == pytest.approx(5.0, rel=0.1)
    assert _nll(_softmax(5 * z / t), y) < _nll(_softmax(5 * z), y)
    # a calibrated model keeps T ≈ 1
    assert fit_temperature(z, y) == pytest.approx(1.0, rel=0.1)


def test_temperature_lowers_nll_for_sampled_logits():
    z, y = _calibrated(seed=1)
    rng = np.random.default_rng(2)
    logits = np.stack([5 * (z + 0.3 * rng.standard_normal(z.shape)) for _ in range(4)])
    t = fit_temperature(logits, y)
    assert t > 2
    mean_at = lambda T: _softmax(logits / T).mean(0)  # noqa: E731
    assert _nll(mean_at(t), y) < _nll(mean_at(1.0), y)
    np.testing.assert_allclose(predictive_probs(logits, t), mean_at(t), atol=1e-12)


def test_too_few_validation_samples_warn():
    z, y = _calibrated(n=17, seed=3)
    with pytest.warns(CalibrationWarning, match=r"only 17 validation samples .*fewer than 100"):
        fit_temperature(5 * z, y)


def test_the_digits_validation_split_does_not_warn():
    val = load_data(load_config("digits").data).val
    assert len(val) == 179 >= MIN_CALIBRATION_SAMPLES  # the demo's validation split
    z, y = _calibrated(n=len(val), seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        fit_temperature(z, y)


def _rows(confidences, correct):
    """Two-class probability rows with the given max and labels making them right or wrong."""
    probs = np.array([[c, 1 - c] for c in confidences])
    labels = np.array([0 if ok else 1 for ok in correct])
    return probs, labels


def test_confidence_thresholds_hand_example():
    probs, labels = _rows([0.8, 0.99, 0.7, 0.9], [0, 1, 1, 1])  # shuffled on purpose
    got = confidence_thresholds(probs, labels, (1.0, 0.8, 0.75, 0.5))
    assert got == {"1": pytest.approx(0.9), "0.8": pytest.approx(0.9),
                   "0.75": pytest.approx(0.7), "0.5": pytest.approx(0.7)}
    # the most confident prediction is wrong: accuracy 1.0 is unreachable
    probs, labels = _rows([0.99, 0.9], [0, 1])
    assert confidence_thresholds(probs, labels, (1.0, 0.5)) == {"1": None,
                                                                "0.5": pytest.approx(0.9)}


@pytest.mark.parametrize("order", [[0, 1, 2], [1, 0, 2], [2, 1, 0]])
def test_confidence_thresholds_ties_are_all_in_or_all_out(order):
    # two predictions at exactly 0.9 (one wrong, one right), one right at 0.8
    probs = np.array([[0.9, 0.1], [0.1, 0.9], [0.8, 0.2]])
    labels = np.array([1, 1, 0])
    probs, labels = probs[order], labels[order]
    got = confidence_thresholds(probs, labels, (1.0, 0.6, 0.5))
    # cutting between the tied 0.9s would reach 1.0; all-in gives 1/2, all three 2/3
    assert got == {"1": None, "0.6": pytest.approx(0.8), "0.5": pytest.approx(0.8)}


def test_the_record_carries_the_validation_predictions_accuracy():
    """Schema version 10's val_accuracy: the argmax of the sample-averaged validation
    probabilities against the labels (the same at any temperature), 6 significant digits."""
    from exporters.configs import Configurations, EvalSets

    rng = np.random.default_rng(7)
    y = np.array([0, 1, 2, 0, 1, 2, 0])
    # two samples whose average is right on 4 of the 7 rows (rows 4..6 lean to a wrong class)
    lean = np.eye(3)[np.where(np.arange(7) < 4, y, (y + 1) % 3)]
    val = np.stack([3 * lean + rng.normal(0, 0.3, (7, 3)) for _ in range(2)])
    ev = EvalSets(np.zeros((7, 1, 1, 1), np.float32), y, np.zeros((7, 1, 1, 1), np.float32), y)
    out = Configurations(ev, (0.9,), "dequantize", measure=False, classes=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)  # (7 validation samples)
        rec = out.add("c", 1.0, "head", 2, ["c.tflite"], [b"slice"], (val, val, None),
                      {"macs": 1, "params": 1})
    want = (predictive_probs(val, rec["temperature"]).argmax(1) == y).mean()
    assert want == pytest.approx(4 / 7) and rec["val_accuracy"] == 0.571429
    assert list(rec).index("val_accuracy") == list(rec).index("val_nll") + 1


# --------------------------------------------------------------- 5. export_bundle

@pytest.fixture(scope="module")
def bundles(checkpoints, workdir):
    class _Lazy(dict):
        def __missing__(self, kind):
            out = workdir / f"bundle-{kind}"
            # layout files: these tests read the written .tflite files (a store bundle's
            # slices are materialised: tests/exporters/test_store.py)
            path = export_bundle(checkpoints[kind], out, ExportOptions(
                widths=WIDTHS, samples=S, scopes=["point", "head", "all"], measure=False,
                max_eval=MAX_EVAL, layout="files", precisions=("float",)), **QUIET)
            assert Path(path) == out.resolve()
            self[kind] = out
            return out
    return _Lazy()


def _expected_ids():
    return [f"w{w:.2f}-{s}" for w in WIDTHS for s in ("point", f"head{S}", f"all{S}")]


@pytest.mark.parametrize("kind", ["gaussian", "pwfn", "sqs"])
def test_bundle_manifest_and_files(bundles, kind):
    out = bundles[kind]
    man = read_manifest(out, verify=True)
    assert list(man.ids) == _expected_ids()
    assert man.source["posterior"] == kind
    assert list(man.labels) == [str(i) for i in range(10)]
    assert tuple(man.input.shape) == (1, 8, 8, 1)
    names = []
    for c in man.configurations:
        expect = {"point": (1, 1, [1, 10]), "head": (S, 1, [S, 10]), "all": (S, S, [1, 10])}
        samples, invokes, shape = expect[c.scope]
        assert (c.samples, c.invokes, list(c.output.shape)) == (samples, invokes, shape)
        assert len(c.files) == invokes
        assert c.width in WIDTHS
        assert c.temperature > 0 and math.isfinite(c.val_nll)
        assert c.val_accuracy is not None and 0.0 <= c.val_accuracy <= 1.0  # schema version 10
        assert c.latency_ms is None and c.memory_mb is None  # measure=False
        assert set(c.thresholds) == {"0.9", "0.95", "0.99"}
        assert set(c.test) == {"raw", "calibrated"}
        names += [f.name for f in c.files]
    assert len(names) == 2 * (1 + 1 + S)
    # issue 33: uncertainty.bin, listed in the manifest like the slices
    assert man.uncertainty is not None and man.uncertainty.name == "uncertainty.bin"
    assert sorted(p.name for p in out.iterdir()) == sorted(names + ["manifest.yaml",
                                                                    "uncertainty.bin"])
    # nothing half-written left next to the bundle
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


def _cut(t, *slices):
    return t[tuple(slices)]


@pytest.mark.parametrize("kind", ["gaussian", "pwfn", "sqs"])
def test_bundle_files_match_torch_slices(bundles, checkpoints, data, calib, kind):
    out = bundles[kind]
    man = read_manifest(out, verify=True)
    ckpt, model = load(checkpoints[kind])
    _, d = data
    x_test, y_test = d.test.x[:MAX_EVAL], d.test.y[:MAX_EVAL].numpy()
    x_val, y_val = nhwc(d.val.x[:MAX_EVAL]), d.val.y[:MAX_EVAL].numpy()
    draws = posterior_samples(model, ckpt, S, seed=0)  # the exporter's seed
    for c in man.configurations:
        files = [(out / f.name).read_bytes() for f in c.files]
        point = make_slice(model, c.width, calib)
        if c.scope == "point":
            refs = [torch_logits(point, x_test)]
        elif c.scope == "head":
            refs = []
            for h in sliced_heads(model, draws, c.width):
                m = copy.deepcopy(point)
                m.classifier.weight_mu.data = h.clone()
                refs.append(torch_logits(m, x_test))
        else:
            refs = [torch_logits(make_slice(model, c.width, calib, ws), x_test) for ws in draws]
        if c.scope == "head":
            got = run_tflite(files[0], nhwc(x_test))
            assert got.shape == (MAX_EVAL, S, 10)
            got = list(np.transpose(got, (1, 0, 2)))
        else:
            got = [run_tflite(f, nhwc(x_test))[:, 0] for f in files]
        for g, r in zip(got, refs):  # int8 weights: a few per cent of the logit range
            assert np.abs(g - r).max() <= 0.05 * np.abs(r).max(), c.id
            assert (g.argmax(1) == r.argmax(1)).mean() >= 0.9, c.id
        # recorded numbers recomputed from the files: raw test accuracy, validation NLL at T
        probs = np.mean([_softmax(np.asarray(g, np.float64)) for g in got], 0)
        assert c.test["raw"]["accuracy"] == pytest.approx((probs.argmax(1) == y_test).mean())
        if c.scope == "head":
            val = np.transpose(run_tflite(files[0], x_val), (1, 0, 2))
        else:
            val = np.stack([run_tflite(f, x_val)[:, 0] for f in files])
        val = np.asarray(val, np.float64)
        val_probs = _softmax(val / c.temperature).mean(0)
        at_t = _nll(val_probs, y_val)
        assert c.val_nll == pytest.approx(at_t, rel=1e-6)
        # schema version 10: the validation predictions' accuracy (6 significant digits)
        assert c.val_accuracy == pytest.approx((val_probs.argmax(1) == y_val).mean(), abs=1e-6)
        assert at_t <= _nll(_softmax(val).mean(0), y_val) + 1e-12  # T never hurts validation


def test_pwfn_point_unique_values_count_codebook_entries(bundles, checkpoints, calib):
    man = read_manifest(bundles["pwfn"])
    ckpt, model = load(checkpoints["pwfn"])
    tensors = ckpt["posterior"]["tensors"]
    for w in WIDTHS:
        c = man.configuration(f"w{w:.2f}-point")
        c1, c2, h = int(32 * w), int(64 * w), int(128 * w)
        kept = {"features.0.weight": (slice(0, c1),),
                "features.1.weight": (slice(0, c2), slice(0, c1)),
                "fc.weight": (slice(0, h), slice(0, c2 * 16)),  # (C, H, W) columns, 4x4
                "classifier.weight": (slice(None), slice(0, h)),
                "classifier.bias": (slice(None),)}
        assert set(tensors) == set(kept)
        idx = torch.cat([_cut(tensors[n]["indices"], *s).flatten() for n, s in kept.items()])
        assert c.unique_values == int(torch.unique(idx).numel())
        sl = make_slice(model, w, calib)
        vals = torch.cat([p.detach().flatten() for n, p in sl.named_parameters()
                          if n.endswith("weight_mu") or n.endswith(".bias") and "bn" not in n])
        assert c.unique_values == int(torch.unique(vals).numel())
        _, counts = np.unique(idx.numpy(), return_counts=True)  # entropy over the indices
        p = counts / counts.sum()
        assert c.weight_entropy_bits == pytest.approx(float(-(p * np.log2(p)).sum()), rel=1e-9)


def test_bundle_is_not_overwritten_without_force(bundles, checkpoints):
    out = bundles["gaussian"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(BundleError):
        export_bundle(checkpoints["gaussian"], out,
                      ExportOptions(widths=[1.0], scopes=["point"], measure=False,
                                    max_eval=10), **QUIET)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # a corrupted copy is detected
    bad = out.parent / "corrupt"
    shutil.copytree(out, bad)
    f = bad / "w1.00-point.tflite"
    blob = bytearray(f.read_bytes())
    blob[-1] ^= 0xFF
    f.write_bytes(bytes(blob))
    with pytest.raises(BundleError, match="checksum"):
        read_manifest(bad, verify=True)


def test_force_replaces_the_bundle(checkpoints, workdir):
    out = workdir / "forced"
    opts = dict(scopes=["point"], measure=False, max_eval=10, precisions=("float",))
    export_bundle(checkpoints["gaussian"], out, ExportOptions(widths=[0.5, 1.0], **opts),
                  **QUIET)
    # store.bin is the container's version 2 (deflated) by default ...
    assert (out / "store.bin").read_bytes()[8:12] == (2).to_bytes(4, "little")
    export_bundle(checkpoints["gaussian"], out, ExportOptions(widths=[1.0], force=True,
                                                              compress_store=False, **opts),
                  **QUIET)
    man = read_manifest(out, verify=True)
    assert list(man.ids) == ["w1.00-point"]
    # the default layout: one weight store, the slice materialised from it
    assert sorted(p.name for p in out.iterdir()) == ["manifest.yaml", "store.bin",
                                                     "uncertainty.bin"]
    # ... and version 1 with compress_store=False (for a device reader older than version 2)
    assert (out / "store.bin").read_bytes()[8:12] == (1).to_bytes(4, "little")
    assert not [p for p in workdir.iterdir() if p.name.startswith(".forced")]


@pytest.mark.parametrize("opts", [dict(scopes=["point", "bogus"]), dict(scopes=[]),
                                  dict(widths=[0.1]), dict(widths=[0.0]), dict(widths=[1.5])])
def test_bad_options_raise_config_error(checkpoints, workdir, opts):
    out = workdir / "never"
    with pytest.raises(ConfigError):
        export_bundle(checkpoints["gaussian"], out,
                      ExportOptions(measure=False, max_eval=10, **opts), **QUIET)
    assert not out.exists()


def test_zero_samples_is_a_config_error(checkpoints, workdir):
    with pytest.raises(ConfigError, match="samples must be an integer >= 1"):
        export_bundle(checkpoints["gaussian"], workdir / "zero",
                      ExportOptions(widths=[1.0], samples=0, scopes=["head"], measure=False,
                                    max_eval=10), **QUIET)


def test_manifest_records_the_snapped_width(checkpoints, workdir):
    out = workdir / "snapped"
    export_bundle(checkpoints["gaussian"], out,
                  ExportOptions(widths=[0.3], scopes=["point"], measure=False, max_eval=10,
                                precisions=("float",)), **QUIET)
    (c,) = read_manifest(out).configurations
    assert c.width == pytest.approx(0.375)


def test_widths_that_snap_to_the_same_network_are_exported_once(checkpoints, workdir):
    out = workdir / "dedupe"
    export_bundle(checkpoints["gaussian"], out,
                  ExportOptions(widths=[0.3, 0.35, 1.0], scopes=["point"], measure=False,
                                max_eval=10, precisions=("float",)), **QUIET)
    assert [c.width for c in read_manifest(out).configurations] == [0.375, 1.0]


def test_unlabelled_eval_data_fails_before_anything_is_exported(checkpoints, workdir):
    """--eval-data is scored against labels: an npz with only x_test is refused at once, with
    the message naming what is missing (OOD data may come without labels, evaluation data not)."""
    from edge_sdk.errors import DataError

    npz = workdir / "unlabelled_eval.npz"
    np.savez(npz, x_test=np.random.default_rng(0).uniform(0, 16, (20, 8, 8)).astype(np.float32))
    out = workdir / "unlabelled_eval"
    with pytest.raises(DataError, match="has x_test but no y_test: evaluation data needs labels"):
        export_bundle(checkpoints["gaussian"], out,
                      ExportOptions(widths=[1.0], scopes=["point"], measure=False, max_eval=10,
                                    eval_data=f"npz:{npz}"), **QUIET)
    assert not out.exists()


# ------------------------------------------------------------------------ 6. CLI
def test_cli_export(checkpoints, workdir):
    out = workdir / "cli" / "b"
    exe = Path(sys.executable).parent / "edge-sdk"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # OOD data as users have it: grey N x H x W images in x_test, no labels, no training split
    ood = workdir / "cli" / "ood.npz"
    ood.parent.mkdir(parents=True, exist_ok=True)
    np.savez(ood, x_test=np.random.default_rng(0).uniform(0, 16, (20, 8, 8)).astype(np.float32))
    r = subprocess.run([str(exe), "export", str(checkpoints["gaussian"]), "--out", str(out),
                        "--widths", "1.0", "--samples", "2", "--scope", "point,head",
                        "--no-measure", "--max-eval", "20", "--no-progress",
                        "--ood-data", f"npz:{ood}"],
                       capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert Path(last).resolve() == out.resolve()
    # --max-eval 20 leaves 20 validation samples: said once, in one line, for all configurations
    warned = [ln for ln in r.stderr.splitlines() if "validation samples" in ln]
    assert warned == [warned[0]] and warned[0].startswith("warning: only 20 validation samples")
    assert "CalibrationWarning" not in r.stderr and "XNNPACK" not in r.stderr, r.stderr
    manifest = read_manifest(out, verify=True)
    # the default layout, store: S is a run-time choice, one head configuration per S
    assert manifest.layout == "store"
    # the point slice in each precision (exporters.precision), then the heads
    assert list(manifest.ids) == ["w1.00-point", "w1.00-point-dyn", "w1.00-point-int8",
                                  "w1.00-head1", "w1.00-head2"]
    for c in manifest.configurations:  # noise against digits: an easy OOD task
        assert c.test["calibrated"]["ood_auroc"] > 0.5, c.test


# -------------------------------------------------------------------- 7. measure
def test_latency_and_memory(checkpoints, calib):
    _, model = load(checkpoints["gaussian"])
    buf, info = export_point_slice(make_slice(model, 0.5, calib), [1, 8, 8, 1])
    x = np.zeros((8, 8, 1), np.float32)
    ms = latency_ms(buf, x, repeats=10)
    assert math.isfinite(ms) and ms > 0
    big = 64 * 2 ** 20  # far above what this tiny model's interpreter allocates
    assert memory_mb(buf, big) == pytest.approx(big / 2 ** 20)
    small = info["params"]
    assert memory_mb(buf, small) >= small / 2 ** 20


# ----------------------------------------------------------------------------- cascade plans
def _cascade_case(n=3000, c=5, seed=1, wide_skill=2.0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c, n)
    def probs(skill):
        z = rng.normal(0, 1, (n, c))
        z[np.arange(n), labels] += skill * rng.uniform(0, 3, n)
        return _softmax(z)
    return probs(1.0), probs(wide_skill), labels  # narrow, wide


@pytest.mark.parametrize("max_loss", [0.0, 0.002, 0.01, 0.05])
def test_cascade_threshold_bounds_the_loss_and_takes_the_largest_coverage(max_loss):
    from exporters.calibrate import cascade_threshold

    narrow, wide, labels = _cascade_case()
    plan = cascade_threshold(narrow, wide, labels, max_loss)
    conf = narrow.max(1)
    here, there = narrow.argmax(1) == labels, wide.argmax(1) == labels

    def loss(t):
        accept = conf >= t
        return (np.where(accept, here, there).mean() - there.mean()) * -1, accept.mean()

    assert plan["max_loss"] == max_loss
    if plan["threshold"] is None:
        assert plan["coverage"] == 0.0
        return
    got, coverage = loss(plan["threshold"])
    assert got <= max_loss + 1e-12 and coverage == pytest.approx(plan["coverage"], rel=5e-4)  # 4 digits
    # no lower threshold (more coverage) among the observed confidences keeps the bound
    lower = np.sort(conf[conf < plan["threshold"]])
    assert all(loss(t)[0] > max_loss + 1e-12 for t in lower)


def test_cascade_threshold_accepts_everything_when_the_narrow_one_is_as_good():
    from exporters.calibrate import cascade_threshold

    narrow, _, labels = _cascade_case()
    plan = cascade_threshold(narrow, narrow, labels, 0.0)
    # every validation sample accepted: any threshold in (0, lowest confidence], the shortest
    assert plan["coverage"] == 1.0 and 0 < plan["threshold"] <= narrow.max(1).min()


# ----------------------------------------------------------------- 8. the carried input spec
@pytest.mark.filterwarnings("ignore::exporters.calibrate.CalibrationWarning")  # 9 val samples
def test_export_and_quantize_refuse_data_that_changed_since_training(workdir):
    """The checkpoint carries the input spec training normalised with; export and quantize
    reload the data against it, and data that changed since (here: pixel values rescaled in
    the npz) stop both before anything is written, naming both values."""
    import dataclasses

    from edge_sdk.errors import CheckpointError, InputSpecMismatchError
    from trainer.quantize.run import quantize_checkpoint
    from trainer.train import train

    rng = np.random.default_rng(0)
    x_train = rng.uniform(0, 16, (90, 8, 8)).astype(np.float32)
    x_test = rng.uniform(0, 16, (30, 8, 8)).astype(np.float32)
    y_train, y_test = np.arange(90) % 3, np.arange(30) % 3
    npz = workdir / "drift.npz"
    np.savez(npz, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    cfg = load_config("digits", [f"data.source=npz:{npz}", "train.epochs=1",
                                 "train.eval_every=100", "data.calib_samples=16"])
    checkpoint = train(cfg, workdir / "drift_run", **QUIET).checkpoint
    carried = ckpt_io.input_spec(ckpt_io.load_checkpoint(checkpoint))
    assert carried.classes == ("0", "1", "2") and carried.shape == (1, 8, 8, 1)
    opts = ExportOptions(widths=[1.0], scopes=["point"], measure=False, max_eval=10)
    bundle = export_bundle(checkpoint, workdir / "drift_ok", opts, **QUIET)  # unchanged data
    manifest = read_manifest(bundle)
    assert manifest.input == dataclasses.replace(carried, classes=None)
    assert manifest.labels == carried.classes

    np.savez(npz, x_train=x_train * 0.5, y_train=y_train, x_test=x_test, y_test=y_test)
    now = load_data(cfg.data).spec
    out = workdir / "drift_bundle"
    with pytest.raises(InputSpecMismatchError) as err:
        export_bundle(checkpoint, out, opts, **QUIET)
    msg = str(err.value)
    assert "no longer matches the input spec the checkpoint was trained with" in msg
    assert (f"mean: the checkpoint has ({carried.mean[0]:.9g},), "
            f"the data give ({now.mean[0]:.9g},)") in msg
    assert not out.exists()
    with pytest.raises(InputSpecMismatchError, match="value_range: the checkpoint has"):
        quantize_checkpoint(checkpoint, load_config("digits", ["quantize.method=pwfn"]),
                            workdir / "drift_pwfn", **QUIET)
    assert not (workdir / "drift_pwfn").exists()

    broken = ckpt_io.load_checkpoint(checkpoint)
    broken["input_spec"]["std"] = [0.0]
    ckpt_io.save_checkpoint(broken, workdir / "broken_spec.pt")
    with pytest.raises(CheckpointError, match=r"input spec is not valid: input_spec\.std\[0\]"):
        export_bundle(workdir / "broken_spec.pt", workdir / "broken_bundle", opts, **QUIET)


def test_weights_float_in_the_store_layout_is_refused_not_misstated(checkpoints, workdir):
    """Issue 35: a gaussian store holds int8 codes; a manifest saying `weights: float` would lie."""
    out = workdir / "float-store"
    with pytest.raises(ConfigError, match="--weights float: the store layout keeps"):
        export_bundle(checkpoints["gaussian"], out, ExportOptions(
            widths=[1.0], measure=False, max_eval=20, layout="store", weights="float"), **QUIET)
    assert not out.exists()
