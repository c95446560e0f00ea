"""Sparse Quantized Sub-distributions (trainer/quantize/sqs.py, and sqs_posterior.py for one
tensor's posterior): exact pruning, outlier-aware windows, k-means / App. C initialisation,
codebook-only samples, the compression rate, gradient flow through the parametrization,
log-space responsibilities, truncation, the checkpoint and the CLI.

Expectations are computed by hand (dyadic numbers, so means and stds below are exact) or by an
independent reference in the test (numpy quantiles, a sorted-list top-k); nothing is copied from
a run. One short digits training run and one SQS run are shared by the module (``sqs_run``).
"""
import copy
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils import parametrize

from edge_sdk.errors import ConfigError
from trainer import checkpoint as ckpt_io
from trainer.config import SQSConfig, load_config
from trainer.layers import BayesNestedLayer, BayesNestedLinear
from trainer.quantize import sqs as sqs_mod
from trainer.quantize.sqs import compression_rate, prune_mask, sample_weights, sqs_
from trainer.quantize.sqs_posterior import SQSTensor, kmeans_1d, make_windows

torch.set_num_threads(1)

QUIET = lambda *a, **k: None  # noqa: E731
TRAIN_OVERRIDES = ["train.epochs=2", "train.eval_every=100", "data.calib_samples=128"]
SHORT_SQS = ["quantize.method=sqs", "quantize.sqs.epochs=1", "quantize.sqs.samples=2"]
WIDTHS = (0.25, 0.5, 0.75, 1.0)


# ----------------------------------------------------------------------------- helpers
def layers_of(model) -> dict[str, BayesNestedLayer]:
    return {n: m for n, m in model.named_modules() if isinstance(m, BayesNestedLayer)}


def rebuild_from_posterior(entry: dict) -> torch.Tensor:
    """The weight the posterior describes: codebook[window, index] where kept, else 0."""
    values = entry["codebook"][entry["window"].long(), entry["index"].long()]
    return torch.where(entry["mask"], values, torch.zeros(()))


def allowed_values(entry: dict) -> torch.Tensor:
    """Zero and every valid codebook entry of the tensor."""
    return torch.cat([entry["codebook"][entry["valid"]], torch.zeros(1)])


# ----------------------------------------------------------------------------- fixture
@pytest.fixture(scope="module")
def sqs_run(tmp_path_factory):
    """Train digits for 2 epochs once and SQS-quantize a copy (2 bits, 50 % non-zero).

    ``sample_weights`` is wrapped (not replaced) so the test can see the learned per-tensor
    posteriors, the latent thetas and the networks drawn for Bayesian averaging.
    """
    from trainer.data import load_data
    from trainer.train import train

    cfg = load_config("digits", TRAIN_OVERRIDES)
    trained = train(cfg, tmp_path_factory.mktemp("sqs_train"), progress=False, log=QUIET)
    data = load_data(cfg.data)
    scfg = SQSConfig(epochs=1, samples=2, nonzero=0.5, bits=2)
    model = copy.deepcopy(trained.model)
    seen = SimpleNamespace(post=None, thetas=None, masks=None, samples=[])
    real = sqs_mod.sample_weights

    def spy(post, thetas, masks, sample_tau, generator):
        out = real(post, thetas, masks, sample_tau, generator)
        seen.post, seen.thetas, seen.masks = post, thetas, masks
        seen.samples.append(out)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sqs_mod, "sample_weights", spy)
        result = sqs_(model, scfg, data, cfg, progress=False, log=QUIET)
    return SimpleNamespace(cfg=cfg, trained=trained, data=data, scfg=scfg, model=model,
                           result=result, seen=seen)


# ------------------------------------------------------------------- 1. exact pruning
@settings(max_examples=40, deadline=None)
@given(scores=st.lists(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32),
                                min_size=1, max_size=12), min_size=1, max_size=4),
       nonzero=st.floats(0.0, 1.0, exclude_min=True))
def test_prune_mask_global_keeps_exactly_floor_of_the_top_scores(scores, nonzero):
    tensors = [torch.tensor(s, dtype=torch.float32) for s in scores]
    masks = prune_mask(tensors, nonzero, "global")
    flat = [v for s in scores for v in s]
    keep = math.floor(nonzero * len(flat) + 1e-9)  # float noise (0.29*100) read as meant
    assert [m.shape for m in masks] == [t.shape for t in tensors]
    assert all(m.dtype == torch.bool for m in masks)
    got = torch.cat(masks)
    assert int(got.sum()) == keep
    # reference: sort by (-score, index): largest s first, ties by lower global index
    expected = sorted(range(len(flat)), key=lambda i: (-flat[i], i))[:keep]
    assert sorted(torch.nonzero(got).flatten().tolist()) == sorted(expected)


@settings(max_examples=30, deadline=None)
@given(scores=st.lists(st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32),
                                min_size=1, max_size=12), min_size=1, max_size=4),
       nonzero=st.floats(0.0, 1.0, exclude_min=True))
def test_prune_mask_layer_scope_keeps_floor_per_tensor(scores, nonzero):
    tensors = [torch.tensor(s, dtype=torch.float32) for s in scores]
    masks = prune_mask(tensors, nonzero, "layer")
    for s, m in zip(scores, masks):
        keep = math.floor(nonzero * len(s) + 1e-9)  # float noise (0.29*100) read as meant
        assert int(m.sum()) == keep
        expected = sorted(range(len(s)), key=lambda i: (-s[i], i))[:keep]
        assert sorted(torch.nonzero(m).flatten().tolist()) == sorted(expected)


def test_prune_mask_ties_break_by_lower_index():
    assert prune_mask([torch.ones(4)], 0.5)[0].tolist() == [True, True, False, False]
    # global index order runs across tensors: (t0[0], t0[1], t1[0], t1[1])
    m = prune_mask([torch.ones(2), torch.ones(2)], 0.75)
    assert [x.tolist() for x in m] == [[True, True], [True, False]]
    m = prune_mask([torch.tensor([0.5, 1.0]), torch.tensor([1.0, 0.5])], 0.5)
    assert [x.tolist() for x in m] == [[False, True], [True, False]]
    # the same in layer scope: each tensor keeps floor(0.5 * 3) = 1, its first maximum
    m = prune_mask([torch.tensor([2.0, 2.0, 1.0]), torch.tensor([0.0, 3.0, 3.0])], 0.5, "layer")
    assert [x.tolist() for x in m] == [[True, False, False], [False, True, False]]


def test_prune_mask_ranks_by_s_not_by_the_saturated_keep_probability():
    s = torch.tensor([1.0, 3.0, 2.0, 0.5, 2.5, 1.5])
    tau_prune = SQSConfig().tau_prune  # 0.0125: s / tau' >= 40, sigmoid is exactly 1 in fp32
    assert bool((torch.sigmoid(s / tau_prune) == 1.0).all())
    assert prune_mask([s], 0.5)[0].tolist() == [False, True, True, False, True, False]


def test_prune_mask_full_rate_and_bad_scope():
    s = [torch.randn(3, 4), torch.randn(5)]
    assert all(bool(m.all()) for m in prune_mask(s, 1.0))
    assert all(bool(m.all()) for m in prune_mask(s, 1.0, "layer"))
    with pytest.raises(ConfigError, match="prune_scope"):
        prune_mask(s, 0.5, "channel")


def test_prune_mask_decimal_rate_is_exact():
    assert int(prune_mask([torch.arange(100.0)], 0.29)[0].sum()) == 29


def test_final_network_has_exactly_floor_half_nonzero_weights(sqs_run):
    r, model = sqs_run.result, sqs_run.model
    layers = layers_of(model)
    total = sum(m.weight_mu.numel() for m in layers.values())
    assert r.total_weights == total
    assert r.nonzero_kept == math.floor(0.5 * total)
    nonzero = sum(int(torch.count_nonzero(m.weight_mu.detach())) for m in layers.values())
    assert nonzero == r.nonzero_kept
    masks = {n: e["mask"] for n, e in r.posterior["tensors"].items()}
    assert set(masks) == set(layers)
    assert sum(int(m.sum()) for m in masks.values()) == r.nonzero_kept
    for name, m in layers.items():  # zero exactly where pruned
        assert torch.equal(m.weight_mu.detach() != 0, masks[name]), name
    # the kept ones are the global top-k of the learned scores
    names = list(sqs_run.seen.post)
    ref = prune_mask([sqs_run.seen.post[n].s for n in names], 0.5)
    for n, m in zip(names, ref):
        assert torch.equal(m.view(masks[n].shape), masks[n]), n


# ---------------------------------------------------------------------------- 2. windows
def test_outlier_windows_hold_exactly_the_values_beyond_the_fences():
    bulk = list(range(-10, 11))
    x = torch.tensor(bulk + [-200, -150, 180, 300, 250], dtype=torch.float32)
    x = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(0))]
    q1, q3 = np.quantile(x.double().numpy(), [0.25, 0.75])  # numpy's default: linear
    lo, hi = q1 - 5 * (q3 - q1), q3 + 5 * (q3 - q1)
    assert -150 < lo < -10 and 10 < hi < 180  # the constructed outliers are the tails
    index, bounds = make_windows(x, "outlier", 5.0)
    xs = x.double()
    assert torch.equal(index == 0, xs < lo)
    assert torch.equal(index == 3, xs > hi)
    assert torch.equal(index == 1, (xs >= lo) & (xs < 0))
    assert torch.equal(index == 2, (xs >= 0) & (xs <= hi))
    assert bounds == [(-200.0, -150.0), (-10.0, -1.0), (0.0, 10.0), (180.0, 300.0)]


def test_outlier_fence_is_inclusive_and_empty_windows_are_renumbered():
    # sorted, n = 9: q1 = x[2] = -1, q3 = x[6] = 1, IQR 2; factor 1.5: fences exactly -4 and 4
    x = torch.tensor([0.0, 4.5, -1.0, 1.0, -4.0, 0.0, 1.0, -1.0, 0.0])
    index, bounds = make_windows(x, "outlier", 1.5)
    # -4 sits on the fence (not beyond): negative bulk; 4.5 is the only tail; no lower tail,
    # so the windows are renumbered 0 (neg bulk), 1 (non-neg bulk), 2 (upper tail)
    assert index.tolist() == [1, 2, 0, 1, 0, 1, 1, 0, 1]
    assert bounds == [(-4.0, -1.0), (0.0, 1.0), (4.5, 4.5)]


def test_no_outliers_gives_two_windows_split_at_zero():
    x = torch.arange(-5.0, 6.0)
    index, bounds = make_windows(x, "outlier", 5.0)
    assert index.tolist() == [0] * 5 + [1] * 6
    assert bounds == [(-5.0, -1.0), (0.0, 5.0)]
    index, bounds = make_windows(torch.tensor([3.0, 1.0, 2.0]), "outlier", 5.0)
    assert index.tolist() == [0, 0, 0] and bounds == [(1.0, 3.0)]


def test_positive_only_data_gets_its_lower_tail():
    # sorted: 1, 9, 9, 10, 10, 10, 11, 11, 12: q1 = 9, q3 = 11, fences 6 and 14 (factor 1.5)
    x = torch.tensor([12.0, 11, 11, 10, 10, 10, 9, 9, 1])
    index, bounds = make_windows(x, "outlier", 1.5)
    assert index.tolist() == [1] * 8 + [0]
    assert bounds == [(1.0, 1.0), (9.0, 12.0)]


def test_negative_only_data_gets_its_upper_tail():
    # the mirror of the test above: fences -14 and -6, so -1 is beyond the upper fence
    x = -torch.tensor([12.0, 11, 11, 10, 10, 10, 9, 9, 1])
    index, bounds = make_windows(x, "outlier", 1.5)
    assert index.tolist() == [0] * 8 + [1]
    assert bounds == [(-12.0, -9.0), (-1.0, -1.0)]


def test_equal_windows_and_bad_mode():
    x = torch.arange(0.0, 9.0)  # [0, 8]: edges 0, 2, 4, 6, 8 (an edge value goes up)
    index, bounds = make_windows(x, "equal")
    assert index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 3]
    assert bounds == [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0), (6.0, 8.0)]
    index, bounds = make_windows(torch.tensor([0.0, 0.5, 8.0]), "equal")  # middle two empty
    assert index.tolist() == [0, 0, 1] and bounds == [(0.0, 0.5), (8.0, 8.0)]
    with pytest.raises(ConfigError, match="windows"):
        make_windows(x, "quantile")


# ------------------------------------------------------------- 3. k-means and App. C init
def test_kmeans_recovers_three_clumps():
    a, b, c = [-4.25, -4.0, -3.75], [-0.5, -0.25, 0.0, 0.25, 0.5], [10.0, 10.5]
    values = a + b + c
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(1))
    x = torch.tensor(values, dtype=torch.float64)[perm]
    label = torch.tensor([0] * 3 + [1] * 5 + [2] * 2)[perm]
    centres, assign = kmeans_1d(x, 3)
    assert centres.tolist() == [-4.0, 0.0, 10.25]  # the clump means, exactly (dyadic)
    assert torch.equal(assign, label)


def test_kmeans_caps_k_at_distinct_values():
    x = torch.tensor([2.0, 1.0, 2.0, 1.0, 2.0])
    centres, assign = kmeans_1d(x, 4)
    assert centres.tolist() == [1.0, 2.0] and assign.tolist() == [1, 0, 1, 0, 1]
    centres, assign = kmeans_1d(x, 1)
    assert centres.tolist() == [1.6] and assign.tolist() == [0] * 5
    centres, assign = kmeans_1d(torch.tensor([0.5, 0.5]), 16)
    assert centres.tolist() == [0.5] and assign.tolist() == [0, 0]


def test_kmeans_returns_no_empty_cluster():
    centres, assign = kmeans_1d(torch.tensor([1.0, 3.0, 5.0, 5.0]), 4)
    counts = torch.bincount(assign, minlength=len(centres))
    assert bool((counts > 0).all()), (centres, counts)


def test_sqs_tensor_init_is_group_mean_unbiased_std_and_proportion():
    neg = [-3.5, -3.0, -1.25, -1.0, -0.75]            # K=2: {-3.5, -3}, {-1.25, -1, -0.75}
    pos = [0.0, 0.25, 0.5, 2.0, 2.25, 2.5, 2.75]      # K=2: {0, .25, .5}, {2, 2.25, 2.5, 2.75}
    flat = torch.tensor([2.25, -1.0, 0.0, -3.5, 2.75, 0.5, -0.75, 2.0, -3.0, 0.25, -1.25, 2.5])
    assert sorted(flat.tolist()) == sorted(neg + pos)
    theta = flat.view(3, 4)
    t = SQSTensor(theta, SQSConfig(bits=1))
    assert t.window.tolist() == [1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0, 1]
    assert t.valid.tolist() == [[True, True], [True, True]]
    assert t.mu.tolist() == [[-3.25, -1.0], [0.25, 2.375]]
    expected_sigma = [[math.sqrt(0.125), 0.25], [0.25, math.sqrt(0.3125 / 3)]]
    assert expected_sigma[1][1] == pytest.approx(np.std([2.0, 2.25, 2.5, 2.75], ddof=1))
    assert t.log_sigma.exp().tolist() == [pytest.approx(r, rel=1e-6) for r in expected_sigma]
    pi = torch.log_softmax(t.pi_logit.masked_fill(~t.valid, -math.inf), -1).exp()
    assert pi.tolist() == [pytest.approx([0.4, 0.6], rel=1e-6),
                           pytest.approx([3 / 7, 4 / 7], rel=1e-6)]


def test_sqs_tensor_marks_missing_components_invalid():
    # window 0 has two distinct values, window 1 four: with K=4 the first has 2 valid slots
    t = SQSTensor(torch.tensor([-1.0, -1.0, -2.0, 0.5, 1.0, 1.5, 2.0]), SQSConfig(bits=2))
    assert t.valid.tolist() == [[True, True, False, False], [True] * 4]
    assert t.mu[0, :2].tolist() == [-2.0, -1.0] and t.mu[1].tolist() == [0.5, 1.0, 1.5, 2.0]
    pi = torch.log_softmax(t.pi_logit.masked_fill(~t.valid, -math.inf), -1).exp()
    assert pi[0].tolist() == pytest.approx([1 / 3, 2 / 3, 0, 0], abs=1e-6)


def test_every_valid_component_is_a_nonempty_group_inside_its_window():
    # windows: {-2, -1} and {1, 3, 5, 5}; K = 4 caps at 3 distinct values in window 1
    t = SQSTensor(torch.tensor([-2.0, -1.0, 1.0, 3.0, 5.0, 5.0]), SQSConfig(bits=2))
    pi = torch.log_softmax(t.pi_logit.masked_fill(~t.valid, -math.inf), -1).exp()
    for w, (lo, hi) in enumerate(t.bounds):
        mu = t.mu[w][t.valid[w]]
        assert bool(((mu >= lo) & (mu <= hi)).all()), (w, mu, (lo, hi))
        assert bool((pi[w][t.valid[w]] > 1e-6).all()), (w, pi[w])


# ------------------------------------------------- 4. samples and greedy on the codebook
def _outlier_tensor(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(20, 15, generator=g) * 0.1
    x.view(-1)[:3] = torch.tensor([3.0, 2.5, -4.0])  # tails: 4 windows
    return x


def test_sample_weights_stay_on_the_window_codebook_or_zero():
    theta = _outlier_tensor(0)
    t = SQSTensor(theta, SQSConfig(bits=2))
    assert len(t.bounds) == 4 and bool((~t.valid).any())  # tails have < K distinct values
    mask = torch.rand(theta.numel(), generator=torch.Generator().manual_seed(1)) < 0.6
    gen = torch.Generator().manual_seed(2)
    picks = []
    for _ in range(5):
        w = sample_weights({"w": t}, {"w": theta}, {"w": mask}, 1.0, gen)["w"]
        assert w.shape == theta.shape
        flat = w.flatten()
        assert bool((flat[~mask] == 0).all())
        options = t.mu.detach()[t.window]                    # [n, K]: own window's components
        hit = (flat[:, None] == options) & t.valid[t.window]  # a valid component of that window
        assert bool(hit[mask].any(-1).all())
        assert not bool((flat[mask] == 0).any())
        picks.append(hit.float().argmax(-1))
    # a large sample tau: the draws really vary, so the check above saw several components
    assert bool((torch.stack(picks)[:, mask] != picks[0][mask]).any())


def test_greedy_is_the_argmax_component_and_samples_are_on_the_codebook(sqs_run):
    r, seen, model = sqs_run.result, sqs_run.seen, sqs_run.model
    layers = layers_of(model)
    assert len(seen.samples) == sqs_run.scfg.samples
    for name, entry in r.posterior["tensors"].items():
        t, theta = seen.post[name], seen.thetas[name]
        shape = layers[name].weight_mu.shape
        for key in ("window", "index", "mask"):
            assert entry[key].shape == shape, (name, key)
        assert entry["codebook"].shape == entry["valid"].shape == (len(t.bounds), 4)
        # the model carries codebook[window, index] where kept, zero elsewhere
        assert torch.equal(layers[name].weight_mu.detach(), rebuild_from_posterior(entry)), name
        # index = argmax_k phi_k(theta), a valid component of the weight's own window
        k_star = t.phi(theta).argmax(-1)
        assert torch.equal(entry["index"].long().flatten(), k_star), name
        assert torch.equal(entry["window"].long().flatten(), t.window), name
        assert bool(entry["valid"][t.window, k_star].all()), name
        # log_resp: the kept weights only, fp16; its row max sits at the stored index
        keep = entry["mask"].flatten()
        lr = entry["log_resp"]
        assert lr.dtype == torch.float16 and lr.shape == (int(keep.sum()), 4)
        at_index = lr.gather(1, entry["index"].long().flatten()[keep][:, None]).squeeze(1)
        assert torch.equal(at_index, lr.max(-1).values), name
        # every Bayesian-averaging network is sparse with the same mask and on the codebook
        for sample in seen.samples:
            w = sample[name].flatten()
            assert torch.equal(w != 0, keep), name
            ok = (w[:, None] == entry["codebook"][t.window]) & entry["valid"][t.window]
            assert bool(ok[keep].any(-1).all()), name


# ------------------------------------------------------------------ 5. compression rate
def test_compression_rate_is_eq_14():
    assert compression_rate(4, 0.5) == 16
    assert compression_rate(2, 0.5) == 32
    assert compression_rate(4, 1.0) == 8
    assert compression_rate(1, 0.25) == 128


def test_reported_rate_and_bits(sqs_run):
    r = sqs_run.result
    assert r.rate == 32  # 32 / 2 bits / 0.5
    assert r.posterior["kind"] == "sqs" and r.posterior["bits"] == 2
    for name, row in r.per_tensor.items():
        entry = r.posterior["tensors"][name]
        assert row["components"] == int(entry["valid"].sum()), name
        assert row["index_bits"] == math.ceil(math.log2(row["components"])), name
        assert row["nonzero"] == int(entry["mask"].sum()), name


# --------------------------------------------------------------------- 6. gradient flow
def test_gradients_reach_theta_scores_and_components():
    torch.manual_seed(0)
    layer = BayesNestedLinear(6, 4, activation=None)
    # tau = 5e-4 (the default) makes phi = softmax(r / tau) one-hot to float precision, so
    # d phi / d theta (and d phi / d pi) vanish numerically; a larger tau keeps phi soft and
    # lets the check see the gradient path through the responsibilities
    cfg = SQSConfig(tau=0.5, bits=1)
    t = SQSTensor(layer.weight_mu, cfg)
    parametrize.register_parametrization(layer, "weight_mu", t)
    assert layer.parametrizations.weight_mu[0] is t
    theta = layer.parametrizations.weight_mu.original
    layer.mode = "mean"
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(3))
    loss = (layer(x) ** 2).mean() + t.kl(theta, prior_keep=0.5, prior_sigma=1.0) / 100
    loss.backward()
    for name, grad in [("theta", theta.grad), ("s", t.s.grad), ("mu", t.mu.grad),
                       ("log_sigma", t.log_sigma.grad), ("pi_logit", t.pi_logit.grad)]:
        assert grad is not None, name
        assert bool(torch.isfinite(grad).all()), name
        assert bool((grad != 0).any()), name
    assert bool((t.s.grad != 0).all())  # every keep score: lambda scales every weight
    assert bool((t.mu.grad[t.valid] != 0).all())


def test_one_parametrization_per_step_gives_the_per_pass_gradients():
    """step_parametrization evaluates phi once for a sandwich step's four passes; every
    parameter's gradient (theta, the GMM, the keep scores, the rest of the network) equals the
    one from re-evaluating the parametrization in every pass."""
    from trainer.models import create_model
    from trainer.regime import regime_step

    cfg = load_config("digits", ["train.sandwich=true", "train.sampled_width=uniform",
                                 "train.sampled_passes=2", "ordering.mask_scope=batch"])
    torch.manual_seed(0)
    base = create_model("nested_cnn_small", num_classes=10, in_channels=1, input_size=8)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 1, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g)
    grads = []
    for cached in (False, True):
        model = copy.deepcopy(base)
        model.train()
        model.set_mask_scope("batch")
        layers = [(n, m) for n, m in model.named_modules() if isinstance(m, BayesNestedLayer)]
        post = {}
        for n, m in layers:
            post[n] = SQSTensor(m.weight_mu, SQSConfig(tau=0.5, bits=2))
            parametrize.register_parametrization(m, "weight_mu", post[n])

        def reg(k_stars=None):
            return sum(post[n].kl(m.parametrizations.weight_mu.original, 0.7, 1.0,
                                  None if k_stars is None else k_stars[n])
                       for n, m in layers) / 100

        torch.manual_seed(7)  # the same middle widths in both runs
        with model.weight_mode("mean"):
            if cached:
                with sqs_mod.step_parametrization(post, layers) as k_stars:
                    regime_step(model, model, x, y, cfg, noise=False,
                                regularizer=lambda: reg(k_stars))
            else:
                regime_step(model, model, x, y, cfg, noise=False, regularizer=reg)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None})
        assert all(t.step_weight is None for t in post.values())  # the block cleans up
    assert grads[0].keys() == grads[1].keys()
    assert any("original" in n for n in grads[0]) and any(".s" in n for n in grads[0])
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-7, msg=n)


# ----------------------------------------------------------- 7. phi and log-space maths
def _expression_mean(t: SQSTensor, theta: torch.Tensor) -> torch.Tensor:
    """The mean weight written as the [n x K] tensor expression of eq. 2 (the reference)."""
    return t.keep_probability() * (t.phi(theta) * t.mu[t.window]).sum(-1)


@pytest.mark.parametrize("tau", [5e-4, 0.05, 0.5])
def test_fused_mean_equals_the_expression_in_value_mode_and_gradient(tau, monkeypatch):
    """mean_and_mode's chunked, hand-differentiated route (trainer/quantize/sqs_mean.py) gives
    the tensor expression's mean, arg-max and gradients -- both in float64, where rounding
    cannot hide a wrong term -- with windows of fewer than K components (the tails) and chunks
    that do not divide the window."""
    from trainer.quantize import sqs_mean
    monkeypatch.setattr(sqs_mean, "CPU_CHUNK", 7)
    theta = _outlier_tensor(6).double()
    t = SQSTensor(theta, SQSConfig(bits=3, tau=tau)).double()
    assert bool((~t.valid).any())  # some window has fewer than K components
    # move theta off its initialisation so every weight sits between components
    th = (theta + 0.03 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(1),
                                     dtype=torch.float64)).requires_grad_()
    params = [th, t.mu, t.log_sigma, t.pi_logit, t.s]
    upstream = torch.randn(theta.numel(), generator=torch.Generator().manual_seed(2),
                           dtype=torch.float64)
    mean, mode = t.mean_and_mode(th)
    ref = _expression_mean(t, th)
    one_hot = (t.phi(th) > 0).sum(-1) == 1  # the backward's shortcut rows (sqs_mean.py)
    if tau == 5e-4:
        assert bool(one_hot.any()) and bool((~one_hot).any())  # both routes are exercised
    torch.testing.assert_close(mean.flatten(), ref, rtol=1e-10, atol=1e-12)
    assert mode.tolist() == t.phi(th).argmax(-1).tolist()
    got = torch.autograd.grad((mean.flatten() * upstream).sum(), params)
    want = torch.autograd.grad((ref * upstream).sum(), params)
    for name, a, b in zip(["theta", "mu", "log_sigma", "pi_logit", "s"], got, want):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10, msg=name)
    if tau >= 0.05:  # soft enough for phi's gradient to be seen (see the test above)
        assert bool((got[0] != 0).any()) and bool((got[2] != 0).any())


def test_fused_mean_passes_torch_gradcheck():
    """The hand-written backward against finite differences (float64)."""
    from trainer.quantize.sqs_mean import WindowMean
    g = torch.Generator().manual_seed(0)
    x = torch.randn(11, generator=g, dtype=torch.float64, requires_grad=True)
    mu = torch.tensor([-1.0, -0.2, 0.4, 1.5], dtype=torch.float64, requires_grad=True)
    inv_sigma = torch.tensor([2.0, 1.5, 3.0, 1.0], dtype=torch.float64, requires_grad=True)
    c = torch.tensor([0.1, -0.3, 0.2, 0.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: WindowMean.apply(*a, 0.3, 4)[0],
                                    (x, mu, inv_sigma, c))


def test_phi_is_a_distribution_over_the_weights_own_window():
    theta = _outlier_tensor(4)
    t = SQSTensor(theta, SQSConfig(bits=2, tau=0.05))
    for th in (theta, torch.zeros_like(theta)):  # at init, and every theta moved to 0
        phi = t.phi(th)
        assert bool((phi >= 0).all())
        assert phi.sum(-1).tolist() == pytest.approx([1.0] * theta.numel(), abs=1e-5)
        assert bool((phi[~t.valid[t.window]] == 0).all())  # invalid slots of its own window
        # the mean never leaves the range of its own window's components, even where theta
        # now sits in another window's range
        mean = (phi * t.mu.detach()[t.window]).sum(-1)
        comp = t.mu.detach()[t.window].masked_fill(~t.valid[t.window], math.nan)
        lo, hi = comp.nan_to_num(math.inf).min(-1).values, comp.nan_to_num(-math.inf).max(-1).values
        assert bool(((mean >= lo - 1e-5) & (mean <= hi + 1e-5)).all())
    # the upper-tail weight (3.0) moved to 0 still picks a component of its tail {2.5, 3.0}
    # (the nearer one: equal weights and equal floor sigmas), not the bulk's near 0
    tail = int(t.window[0])
    assert t.window[1] == tail and t.mu[tail][t.valid[tail]].tolist() == [2.5, 3.0]
    k = int(t.phi(torch.zeros_like(theta))[0].argmax())
    assert t.mu[tail, k].item() == 2.5


def test_responsibilities_far_from_every_component_do_not_underflow():
    theta = _outlier_tensor(5)
    t = SQSTensor(theta, SQSConfig(bits=2))
    far = theta.clone()
    far.view(-1)[10:14] = torch.tensor([1e3, -1e3, 500.0, -750.0])  # bulk weights, sigma ~ 0.03
    with torch.no_grad():
        lj = t.log_joint(far)[10:14]
        assert float(lj.exp().sum()) == 0.0  # the densities themselves underflow
        r = t.responsibilities(far)
        phi = t.phi(far)
    for p in (r, phi):
        assert not bool(torch.isnan(p).any())
        assert p.sum(-1).tolist() == pytest.approx([1.0] * theta.numel(), abs=1e-5)
    # far away the quadratic term dominates: the winner is the component with the best
    # log pi - (theta - mu)^2 / (2 sigma^2) - log sigma, recomputed here in float64
    mu, sig = t.mu.detach().double(), t.log_sigma.detach().double().exp()
    log_pi = torch.log_softmax(t.pi_logit.detach().double().masked_fill(~t.valid, -math.inf), -1)
    for i in range(10, 14):
        w, th = int(t.window[i]), float(far.view(-1)[i])
        score = log_pi[w] - (th - mu[w]) ** 2 / (2 * sig[w] ** 2) - sig[w].log()
        assert int(phi[i].argmax()) == int(score.masked_fill(~t.valid[w], -math.inf).argmax())
        assert float(phi[i].max()) == pytest.approx(1.0, abs=1e-6)


# ---------------------------------------------------------------------- 8. truncation
def test_every_truncated_width_keeps_the_quantization(sqs_run):
    tensors = sqs_run.result.posterior["tensors"]
    full = sum(m.weight_mu.numel() for m in layers_of(sqs_run.model).values())
    for w in WIDTHS:
        small = sqs_run.model.truncate(w)
        layers = layers_of(small)
        assert set(layers) == set(tensors)
        n = 0
        for name, m in layers.items():
            assert bool(torch.isin(m.weight_mu.detach(), allowed_values(tensors[name])).all()), \
                (w, name)
            n += m.weight_mu.numel()
        assert (n < full) if w < 1.0 else (n == full), (w, n, full)


# ------------------------------------------------------- 9. checkpoint and config errors
def test_quantize_checkpoint_writes_a_loadable_sqs_checkpoint(sqs_run, tmp_path):
    from trainer.quantize.run import quantize_checkpoint

    cfg = load_config("digits", SHORT_SQS)
    path = quantize_checkpoint(sqs_run.trained.checkpoint, cfg, tmp_path / "q", progress=False,
                               log=QUIET)
    assert path == tmp_path / "q" / "checkpoint.pt" and path.is_file()
    raw = torch.load(path, map_location="cpu", weights_only=True)
    assert raw["posterior"]["kind"] == "sqs"
    ckpt = ckpt_io.load_checkpoint(path)
    post, m = ckpt["posterior"], ckpt["metrics"]["sqs"]
    assert post["bits"] == 4 and post["nonzero"] == 0.5
    assert m["rate"] == 16  # 32 / 4 bits / 0.5
    assert m["nonzero_kept"] == math.floor(0.5 * m["total_weights"])
    assert ckpt["config"]["quantize"]["method"] == "sqs"
    assert ckpt["config"]["quantize"]["sqs"]["epochs"] == 1

    loaded = ckpt_io.model_from_checkpoint(ckpt)
    rebuilt = ckpt_io.model_from_checkpoint(ckpt)
    layers, targets = layers_of(loaded), layers_of(rebuilt)
    assert set(layers) == set(post["tensors"])
    with torch.no_grad():
        for name, entry in post["tensors"].items():
            w = rebuild_from_posterior(entry)
            assert torch.equal(layers[name].weight_mu.detach(), w), name
            targets[name].weight_mu.copy_(w)
    assert sum(int(e["mask"].sum()) for e in post["tensors"].values()) == m["nonzero_kept"]
    x = sqs_run.data.test.x[:64]
    for w in (0.25, 1.0):
        with torch.no_grad(), loaded.width(w), rebuilt.width(w):
            assert torch.equal(loaded(x), rebuilt(x)), w


@pytest.mark.parametrize("override, key", [("quantize.sqs.bits=0", r"quantize\.sqs\.bits"),
                                           ("quantize.sqs.nonzero=0", r"quantize\.sqs\.nonzero"),
                                           ("quantize.sqs.nonzero=1.5",
                                            r"quantize\.sqs\.nonzero")])
def test_bad_sqs_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config("digits", [override])


def test_sqs_validates_a_config_built_in_code(sqs_run):
    with pytest.raises(ConfigError, match=r"quantize\.sqs\.nonzero"):
        sqs_(copy.deepcopy(sqs_run.trained.model), SQSConfig(nonzero=0.0), sqs_run.data,
             sqs_run.cfg, progress=False, log=QUIET)


# ----------------------------------------------------------------------------- 10. CLI
def test_cli_quantize_sqs_end_to_end(sqs_run, tmp_path):
    exe = Path(sys.executable).parent / "edge-sdk"
    assert exe.is_file(), exe
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = tmp_path / "cli"
    proc = subprocess.run(
        [str(exe), "quantize", str(sqs_run.trained.checkpoint), "--method", "sqs",
         "--out", str(out), "--no-progress", "--set", "quantize.sqs.epochs=1",
         "--set", "quantize.sqs.samples=0"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.parent == out, proc.stdout
    ckpt = ckpt_io.load_checkpoint(path)
    assert ckpt["posterior"]["kind"] == "sqs"
    assert ckpt["metrics"]["sqs"]["rate"] == 16
    # samples 0: the point network is reported, the sampled ensemble is not evaluated
    assert ckpt["metrics"]["sqs"]["bayes"] == {}
    assert set(ckpt["metrics"]["sqs"]["greedy"]) == {"0.25", "0.5", "0.75", "1"}
    assert " - " in proc.stdout.split("SQS:")[1]


# ------------------------------------------------------------------- fine-tuning subset
def test_fine_tuning_subset_is_a_seeded_sample_of_the_training_split():
    from trainer.data import ArrayDataset

    n = 50
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous()
    train = ArrayDataset(x, torch.arange(n) % 3, np.zeros((n, 2, 2, 1), np.uint8))
    assert sqs_mod.fine_tuning_set(train, None, 0) is train
    assert sqs_mod.fine_tuning_set(train, n + 5, 0) is train  # larger than the split: all of it
    a, b = (sqs_mod.fine_tuning_set(train, 20, s) for s in (0, 0))
    rows = a.x[:, 0, 0, 0].long()
    assert len(a) == 20 and len(set(rows.tolist())) == 20  # distinct rows of the split
    assert torch.equal(a.x, b.x) and torch.equal(a.y, train.y[rows])  # seeded, labels follow
    assert not torch.equal(sqs_mod.fine_tuning_set(train, 20, 1).x, a.x)
    with pytest.raises(ConfigError, match="subset"):
        load_config("digits", ["quantize.sqs.subset=0"])
