"""Probabilistic Weight Fixing (trainer/quantize/pwfn.py, and pwfn_cluster.py for the
clustering): centres, sigma init, one clustering round (Algorithm 1), the whole-network verb,
its checkpoint and the CLI.

Expectations are computed by hand (dyadic numbers, so every distance below is exact) or by an
independent re-implementation in the test; nothing is copied from a run. One short digits
training run and one PWFN run are shared by the module (``pwfn_run``).
"""
import collections
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
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from edge_sdk.errors import CheckpointError, ConfigError
from trainer import checkpoint as ckpt_io
from trainer.config import PWFNConfig, load_config
from trainer.layers import BayesNestedLayer, BayesNestedLinear
from trainer.quantize import pwfn
from trainer.quantize.pwfn import fix_weights_, weight_entropy_bits
from trainer.quantize.pwfn_cluster import (_group_std, candidate_centres, cluster_round, nearest,
                                           pow2_sigma)

torch.set_num_threads(1)

QUIET = lambda *a, **k: None  # noqa: E731
TRAIN_OVERRIDES = ["train.epochs=2", "train.eval_every=100", "data.calib_samples=128"]
SHORT_PWFN = ["quantize.method=pwfn", "quantize.pwfn.schedule=[0.5,1.0]",
              "quantize.pwfn.epochs_per_round=1", "quantize.pwfn.samples=2"]
NAN = float("nan")
S6 = 2.0 ** -6  # a sigma that makes every distance below a small dyadic number of sigmas


# ----------------------------------------------------------------------------- helpers
def quantized_tensors(model) -> dict[str, torch.Tensor]:
    """Every tensor PWFN quantizes: each Bayesian layer's weight mean and its bias."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, BayesNestedLayer):
            out[f"{name}.weight"] = m.weight_mu.detach()
            if m.bias is not None:
                out[f"{name}.bias"] = m.bias.detach()
    return out


def all_values(model) -> torch.Tensor:
    return torch.cat([t.flatten() for t in quantized_tensors(model).values()])


def small_centres():
    """precision 2, max_order 2 around max_abs 0.6: C^1 = {0, +-1/4, +-1/2}, C^2 adds +-3/4."""
    return candidate_centres(0.6, precision=2, max_order=2)


def run_round(mu, sigma, target, *, free=None, **kw):
    mu = torch.tensor(mu, dtype=torch.float32)
    sigma = torch.tensor(sigma, dtype=torch.float32) if isinstance(sigma, list) \
        else torch.full_like(mu, sigma)
    free = torch.ones(len(mu), dtype=torch.bool) if free is None else torch.tensor(free)
    centres, order = kw.pop("centres", None) or small_centres()
    value, gsig, stats = cluster_round(mu, sigma, free, target, centres, order, **kw)
    return value, gsig, stats, free


def assert_same(actual: torch.Tensor, expected: list[float]):
    """Equal element-wise, NaN where expected is NaN."""
    exp = torch.tensor(expected, dtype=actual.dtype)
    assert torch.equal(torch.isnan(actual), torch.isnan(exp)), (actual, exp)
    ok = ~torch.isnan(exp)
    assert torch.equal(actual[ok], exp[ok]), (actual, exp)


def entropy_bits_by_hand(values: np.ndarray) -> float:
    counts = np.array(list(collections.Counter(values.ravel().tolist()).values()), dtype=float)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


class _Bar:  # the progress-bar interface _retrain needs
    def set_postfix_str(self, *a, **k):
        pass


# ----------------------------------------------------------------------------- fixture
@pytest.fixture(scope="module")
def pwfn_run(tmp_path_factory):
    """Train digits for 2 epochs once and PWFN-quantize a copy with a 3-round schedule."""
    from trainer.data import load_data
    from trainer.train import train

    cfg = load_config("digits", TRAIN_OVERRIDES)
    trained = train(cfg, tmp_path_factory.mktemp("pwfn_train"), progress=False, log=QUIET)
    data = load_data(cfg.data)
    pcfg = PWFNConfig(schedule=[0.5, 0.9, 1.0], epochs_per_round=1, samples=2)
    model = copy.deepcopy(trained.model)
    result = fix_weights_(model, pcfg, data, cfg, progress=False, log=QUIET)
    return SimpleNamespace(cfg=cfg, trained=trained, data=data, pcfg=pcfg, model=model,
                           result=result)


# ------------------------------------------------------------------------ 1. centres
def test_candidate_centres_small_case_by_hand():
    c, o = small_centres()
    assert c.tolist() == [-0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75]
    assert o.tolist() == [2, 1, 1, 0, 1, 1, 2]
    c, o = candidate_centres(1.0, precision=1, max_order=4)  # R = {1, 1/2}
    assert c.tolist() == [-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5]
    assert o.tolist() == [2, 1, 1, 0, 1, 1, 2]


@settings(max_examples=20, deadline=None)
@given(max_abs=st.floats(2.0 ** -7, 8.0, width=32),  # fix_weights_ passes a float32 maximum
       precision=st.integers(0, 7),
       max_order=st.integers(1, 4))
def test_candidate_centres_are_sums_of_few_distinct_powers(max_abs, precision, max_order):
    top = math.frexp(max_abs)[1] - 1  # floor(log2(max_abs)), computed without log2
    assume(top >= -precision)
    n = top + precision + 1  # powers 2^top ... 2^-precision
    c, o = candidate_centres(max_abs, precision, max_order)
    assert c.dtype == torch.float64 and o.dtype == torch.int64
    expected = 2 * sum(math.comb(n, k) for k in range(1, max_order + 1)) + 1
    assert len(c) == len(o) == expected
    assert bool((c[1:] > c[:-1]).all()), "sorted and distinct"
    assert torch.equal(c, -c.flip(0)), "symmetric"
    for ci, oi in zip(c.tolist(), o.tolist()):
        scaled = abs(ci) * 2.0 ** precision
        assert scaled == int(scaled), f"{ci} is not a multiple of 2^-{precision}"
        bits = bin(int(scaled)).count("1")
        assert bits == oi <= max_order, (ci, oi)
        assert abs(ci) < 2.0 ** (top + 1), (ci, top)
    assert o[c == 0].tolist() == [0]


def test_candidate_centres_top_power_just_below_a_power_of_two():
    max_abs = math.nextafter(8.0, 0.0)  # 8 - 1 ulp: the top power must be 4, not 8
    c, _ = candidate_centres(max_abs, precision=0, max_order=1)
    assert c.tolist() == [-4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0]


def test_fixed_network_lies_on_the_centre_set_and_codebook(pwfn_run):
    r, cfg = pwfn_run.result, pwfn_run.pcfg
    before = all_values(pwfn_run.trained.model)  # the unquantized copy
    centres, _ = candidate_centres(float(before.abs().max()), cfg.precision, cfg.max_order)
    after = quantized_tensors(pwfn_run.model)
    assert set(after) == set(r.posterior["tensors"]) == set(r.per_tensor)
    assert any(name.endswith(".bias") for name in after), "biases are quantized too"
    for name, t in after.items():
        assert bool(torch.isin(t.double(), centres).all()), f"{name} has off-centre values"
    codebook = r.posterior["codebook"]
    assert torch.equal(codebook, torch.unique(all_values(pwfn_run.model)))
    assert r.codebook == codebook.tolist()
    assert r.posterior["kind"] == "pwfn"


# ---------------------------------------------------------------- 2. cluster_round by hand
def test_mean_rule_admits_far_weight_behind_zeros_strict_does_not():
    # nearest in C^1: 0.25, 0.25, 0.25, 0.5, 0.5 -> k* = 0.25; D to 0.25 = 0, 0, 2.5, 16, 16
    mu = [0.25, 0.25, 0.2890625, 0.5, 0.5]
    value, gsig, stats, free = run_round(mu, S6, 3, rule="mean")
    assert_same(value, [0.25, 0.25, 0.25, NAN, NAN])  # running mean 0, 0, 5/6 <= 1
    assert free.tolist() == [False, False, False, True, True]
    assert (stats.searches, stats.escalations, stats.max_order_used) == (1, 0, 1)
    assert gsig[:3].tolist() == pytest.approx([np.std(mu[:3])] * 3, rel=1e-6)

    value, gsig, stats, free = run_round(mu, S6, 3, rule="strict")
    # search 1 takes the two zeros (2.5 > 1); search 2: votes 0.25:1, 0.5:2 -> k* = 0.5, one
    # more needed
    assert value[:3].tolist()[:2] == [0.25, 0.25] and math.isnan(value[2])
    assert int((value[3:] == 0.5).sum()) == 1 and int(torch.isnan(value[3:]).sum()) == 1
    assert int((~free).sum()) == 3 and bool(free[2])
    assert (stats.searches, stats.escalations) == (2, 0)


def test_strict_rule_full_round_traced_by_hand():
    mu = [0.25, 0.25, 0.2890625, 0.5, 0.5]
    value, gsig, stats, free = run_round(mu, S6, 5, rule="strict", max_order=2)
    # search 1: {0, 1} -> 0.25; search 2: {3, 4} -> 0.5 (k* by 2 votes to 1);
    # search 3: the far weight alone, D = 2.5: delta 1 fails, (omega 2) delta 2 fails, 4 passes
    assert_same(value, [0.25, 0.25, 0.25, 0.5, 0.5])
    assert (stats.searches, stats.escalations, stats.max_order_used) == (5, 2, 2)
    assert gsig.tolist() == [0.0] * 5  # groups {0,1}, {3,4} of equal means and a singleton
    assert not bool(free.any())

    value, gsig, stats, _ = run_round(mu, S6, 5, rule="mean")
    assert_same(value, [0.25, 0.25, 0.25, 0.5, 0.5])
    assert (stats.searches, stats.escalations) == (2, 0)


def test_mean_rule_boundary_and_target_cap():
    # D to 0.25: 0, 0.5, 2.5 -> running means 0, 0.25, exactly 1.0 (<= delta: admitted)
    mu = [0.25, 0.2578125, 0.2890625, 0.5, 0.5]
    value, _, stats, _ = run_round(mu, S6, 3)
    assert_same(value, [0.25, 0.25, 0.25, NAN, NAN])
    assert stats.searches == 1
    # the cap: only what the round still needs, nearest first
    value, _, _, free = run_round(mu, S6, 2)
    assert_same(value, [0.25, 0.25, NAN, NAN, NAN])
    assert free.tolist() == [False, False, True, True, True]
    # a hair further and the running mean of three exceeds 1: the far weight stays out
    mu_far = [0.25, 0.2578125, 0.2890625 + 2.0 ** -20, 0.5, 0.5]
    value, _, _, _ = run_round(mu_far, S6, 3)
    assert value[:2].tolist() == [0.25, 0.25] and math.isnan(value[2])
    assert int((value[3:] == 0.5).sum()) == 1


def test_target_counts_weights_already_fixed():
    mu = [0.25, 0.25, 0.2890625, 0.5, 0.5]
    # two weights already fixed: target 3 needs one more; free ones vote 0.25:1, 0.5:2
    value, _, stats, free = run_round(mu, S6, 3, free=[False, False, True, True, True])
    assert torch.isnan(value[:3]).all() and int((value[3:] == 0.5).sum()) == 1
    assert int((~free).sum()) == 3
    # target already met: nothing happens
    value, gsig, stats, free = run_round(mu, S6, 2, free=[False, False, True, True, True])
    assert torch.isnan(value).all() and torch.isnan(gsig).all() and stats.searches == 0
    assert free.tolist() == [False, False, True, True, True]


def test_assign_centre_vs_nearest():
    # D to 0.25 = 0, 0, 0, 4 -> running mean of four exactly 1: the whole prefix qualifies, but
    # the last weight's own nearest centre is 0.5 (0.09375 away vs 0.15625)
    mu = [0.25, 0.25, 0.25, 0.40625]
    sigma = [S6, S6, S6, 0.0390625]
    value, gsig, stats, _ = run_round(mu, sigma, 4, assign="centre")
    assert_same(value, [0.25] * 4)
    assert gsig.tolist() == pytest.approx([np.std(mu)] * 4, rel=1e-6)
    assert stats.searches == 1

    value, gsig, stats, _ = run_round(mu, sigma, 4, assign="nearest")
    assert_same(value, [0.25, 0.25, 0.25, 0.5])
    assert gsig.tolist() == [0.0] * 4  # {0,1,2} have equal means; the 0.5 one is alone
    assert stats.searches == 1

    # strict: the far weight waits for its own search: D to 0.5 is 2.4 -> delta 1, 2 fail, 4 ok
    value, gsig, stats, _ = run_round(mu, sigma, 4, rule="strict", assign="centre")
    assert_same(value, [0.25, 0.25, 0.25, 0.5])
    assert (stats.searches, stats.escalations) == (4, 2)


def test_escalation_when_nobody_is_within_delta():
    # D = 32 sigmas to 0.25 for both: delta 1, 2, 4, 8, 16 fail, 32 admits both
    value, gsig, stats, free = run_round([0.28125, 0.28125], 2.0 ** -10, 2, max_order=2)
    assert_same(value, [0.25, 0.25])
    assert (stats.searches, stats.escalations, stats.max_order_used) == (6, 5, 2)
    assert gsig.tolist() == [0.0, 0.0] and not bool(free.any())


def test_escalation_reaches_higher_order_centre_and_respects_the_cap():
    # 0.71875: nearest in C^1 is 0.5 (224 sigmas); after one escalation C^2 holds 0.75 (32 sigmas)
    value, _, stats, _ = run_round([0.71875], 2.0 ** -10, 1, max_order=2)
    assert_same(value, [0.75])
    assert (stats.escalations, stats.max_order_used) == (5, 2)  # deltas 1 | 2, 4, 8, 16 fail
    # omega capped at 1: 0.75 is never a candidate; 224 sigmas to 0.5 needs delta 256
    value, _, stats, _ = run_round([0.71875], 2.0 ** -10, 1, max_order=1)
    assert_same(value, [0.5])
    assert (stats.escalations, stats.max_order_used) == (8, 1)


def test_cluster_round_rejects_unknown_rule_and_assign():
    with pytest.raises(ConfigError, match="rule"):
        run_round([0.25], S6, 1, rule="median")
    with pytest.raises(ConfigError, match="assign"):
        run_round([0.25], S6, 1, assign="random")


def test_nearest_picks_closest_and_breaks_ties_low():
    c = torch.tensor([-0.5, 0.0, 0.25, 1.0], dtype=torch.float64)
    x = torch.tensor([-3.0, -0.25, 0.1, 0.125, 0.2, 0.625, 0.7, 5.0, 0.25], dtype=torch.float64)
    assert nearest(c, x).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 2]


def test_target_larger_than_numel_is_refused():
    with pytest.raises(ConfigError, match="target must be between 0 and the 3 entries"):
        run_round([0.1, 0.2, 0.3], 0.01, 4)


# ------------------------------------------------------------------ cluster_round properties
@st.composite
def round_inputs(draw):
    n = draw(st.integers(1, 40))
    floats = st.floats(-2.0, 2.0, allow_nan=False, width=32)
    mu = draw(st.lists(floats, min_size=n, max_size=n))
    sigma = draw(st.lists(st.one_of(st.just(0.0), st.floats(2.0 ** -20, 0.25, width=32)),
                          min_size=n, max_size=n))
    free = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return dict(mu=mu, sigma=sigma, free=free, target=draw(st.integers(0, n)),
                precision=draw(st.integers(0, 7)), max_order=draw(st.integers(1, 4)),
                rule=draw(st.sampled_from(["mean", "strict"])),
                assign=draw(st.sampled_from(["centre", "nearest"])),
                delta0=draw(st.sampled_from([0.5, 1.0, 3.0])))


@settings(max_examples=20, deadline=None)
@given(args=round_inputs())
def test_cluster_round_properties(args):
    mu = torch.tensor(args["mu"], dtype=torch.float32)
    sigma = torch.tensor(args["sigma"], dtype=torch.float32)
    free0 = torch.tensor(args["free"])
    free = free0.clone()
    centres, order = candidate_centres(float(mu.abs().max()), args["precision"], args["max_order"])
    value, gsig, stats = cluster_round(mu, sigma, free, args["target"], centres, order,
                                       delta0=args["delta0"], max_order=args["max_order"],
                                       rule=args["rule"], assign=args["assign"])
    already = int((~free0).sum())
    # exactly the target is fixed (or nothing changes when it is already met); none unfixed
    assert int((~free).sum()) == max(args["target"], already)
    assert not bool((free & ~free0).any())
    new = free0 & ~free
    assert torch.equal(~torch.isnan(value), new) and torch.equal(~torch.isnan(gsig), new)
    if not bool(new.any()):
        assert stats.searches == 0
        return
    assert 1 <= stats.max_order_used <= args["max_order"]
    assert stats.escalations < stats.searches
    allowed = centres[order <= stats.max_order_used]
    v, m = value[new].double(), mu[new].double()
    assert bool(torch.isin(v, allowed).all())
    # group sigma: a population std of means within one destination, so within half their range
    g = gsig[new].double()
    assert bool((g >= 0).all()) and bool(torch.isfinite(g).all())
    for c in torch.unique(v):
        same = v == c
        half_range = (m[same].max() - m[same].min()) / 2
        assert bool((g[same] <= half_range + 1e-6).all())
    if args["rule"] == "strict":
        bound = args["delta0"] * 2.0 ** min(stats.escalations, 1000)
        s = sigma[new].double().clamp_min(1e-12)
        assert bool(((v - m).abs() / s <= bound * (1 + 1e-9)).all())
    if args["assign"] == "nearest":
        for vi, mi in zip(v.tolist(), m.tolist()):
            options = []
            for k in range(1, stats.max_order_used + 1):
                ck = centres[order <= k]
                options.append(float(ck[int(torch.argmin((ck - mi).abs()))]))
            assert vi in options, (mi, vi, options)


# ------------------------------------------------------------------------ 3. group sigma
def test_group_std_is_population_std_per_destination():
    x = torch.tensor([1.0, 2.0, 3.0, 10.0, -4.0], dtype=torch.float64)
    groups = torch.tensor([0.5, 0.5, 0.5, 0.25, -1.0], dtype=torch.float64)
    got = _group_std(x, groups)
    assert got[:3].tolist() == pytest.approx([math.sqrt(2 / 3)] * 3, rel=1e-12)
    assert got[3:].tolist() == [0.0, 0.0]  # singletons: 0, not NaN
    assert not bool(torch.isnan(_group_std(x[:1], groups[:1])).any())


def test_group_sigma_of_a_round_matches_numpy_population_std():
    # one search, assign=centre: four means move to 0.25 together
    mu = [0.25, 0.2578125, 0.2890625, 0.2421875]  # D: 0, 0.5, 2.5, 0.5 -> mean of 4 = 0.875
    value, gsig, _, _ = run_round(mu, S6, 4, assign="centre")
    assert_same(value, [0.25] * 4)
    assert gsig.tolist() == pytest.approx([float(np.std(np.float32(mu), ddof=0))] * 4, rel=1e-6)


# ------------------------------------------------------------------------- 4. pow2 sigma
def test_pow2_sigma_by_hand():
    mu = torch.tensor([0.75, 0.375, -1.5, 0.0, 0.6], dtype=torch.float64)
    # (D_d, D_u): 0.75 -> (1/2, 1/4); 0.375 -> (1/2, 1/4); 1.5 -> (1/2, 1/4); 0.6 -> (0.2, 0.4)
    # Q_0.75 of D_u over nonzero [1/4, 1/4, 1/4, 0.4]: position 2.25 -> 0.25 + 0.25 * 0.15
    q = 0.2875
    expected = [0.0025 * 0.5 * 0.25 / q] * 3 + [2.0 ** -30, 0.0025 * 0.2 * 0.4 / q]
    got = pow2_sigma(mu)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(expected, rel=1e-9)
    assert got[3].item() == 2.0 ** -30


def test_pow2_sigma_clamps_and_vanishes_at_powers_of_two():
    # D_u of 0.999 is 0.001 (its Q_0.75 too): f(0.75) = 0.0025 * 0.125 / 0.001 > 0.05
    mu = torch.tensor([0.999, 0.999, 0.999, 0.999, 0.75], dtype=torch.float64)
    got = pow2_sigma(mu)
    assert got[4].item() == 0.05
    assert got[:4].tolist() == pytest.approx([0.0025 * 0.001 * 0.998 / 0.001] * 4, rel=1e-9)
    powers = torch.tensor([1.0, -0.5, 0.25, 2.0 ** -7, 4.0, 0.0, 0.3, -0.7])
    got = pow2_sigma(powers)
    assert got.dtype == torch.float32
    assert got[:6].tolist() == [2.0 ** -30] * 6
    assert bool((got[6:] > 2.0 ** -30).all())
    # just above a power of two: f is positive but tiny -> the 2^-30 floor
    tiny = pow2_sigma(torch.tensor([0.5 + 1e-12, 0.75], dtype=torch.float64))
    assert tiny[0].item() == 2.0 ** -30


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([-1.0, 1.0]),
                          st.one_of(st.just(0.0), st.floats(2.0 ** -20, 4.0, width=32))),
                min_size=1, max_size=30),
       st.integers(-3, 3))
def test_pow2_sigma_properties(values, k):
    mu = torch.tensor([s * a for s, a in values], dtype=torch.float32)
    s = pow2_sigma(mu)
    assert bool((s >= 2.0 ** -30).all()) and bool((s <= 0.05).all())
    assert torch.equal(pow2_sigma(-mu), s)  # depends on |mu| only
    assert torch.equal(pow2_sigma(mu * 2.0 ** k), s)  # relative distances: scale-free by 2^k


# -------------------------------------------------- 5. rounds and fixed weights staying put
def test_rounds_reach_their_schedule_and_indices_map_back(pwfn_run):
    r, model = pwfn_run.result, pwfn_run.model
    assert [row["target"] for row in r.rounds] == pwfn_run.pcfg.schedule
    total = all_values(model).numel()
    for row in r.rounds:
        fixed = round(row["fraction"] * total)
        assert fixed >= math.ceil(row["target"] * total - 1e-9), row
    assert r.rounds[-1]["fraction"] == 1.0
    fractions = [row["fraction"] for row in r.rounds]
    assert fractions == sorted(fractions)
    codebook = r.posterior["codebook"]
    for name, t in quantized_tensors(model).items():
        entry = r.posterior["tensors"][name]
        assert entry["indices"].shape == t.shape
        assert torch.equal(codebook[entry["indices"].long()], t), name
        assert entry["sigma"].shape == t.shape
        assert bool(torch.isfinite(entry["sigma"]).all()) and bool((entry["sigma"] >= 0).all())
        if name.endswith(".weight"):  # the model carries the fixed groups' sigmas
            layer = model.get_submodule(name.rsplit(".", 1)[0])
            assert torch.allclose(layer.weight_sigma.detach(), entry["sigma"], rtol=1e-3,
                                  atol=1e-10), name


def test_fixed_state_masks_gradients_and_restores_after_weight_decay():
    torch.manual_seed(0)
    layer = BayesNestedLinear(4, 3, activation=None)  # weight 3x4 (offsets 0-11), bias (12-14)
    net = torch.nn.Sequential(layer)
    entries = pwfn._entries(net, include_bias=True)
    assert [(e.name, e.offset, e.numel) for e in entries] == [("0.weight", 0, 12),
                                                              ("0.bias", 12, 3)]
    state = pwfn._FixedState(entries, 15)
    idx = torch.tensor([0, 5, 13])
    state.fixed[idx] = True
    state.value[idx] = torch.tensor([0.5, -0.25, 0.125])
    state.sigma[idx] = torch.tensor([0.01, 0.0, 0.02])
    state.apply_()
    w, b = layer.weight_mu.detach().view(-1), layer.bias.detach()
    assert (w[0].item(), w[5].item(), b[1].item()) == (0.5, -0.25, 0.125)
    sig = layer.weight_sigma.detach().view(-1)
    assert sig[0].item() == pytest.approx(0.01, rel=1e-5)
    assert 0 < sig[5].item() < 1e-9  # a zero group sigma becomes a vanishing one
    rho_fixed = layer.weight_rho.detach().view(-1)[[0, 5]].clone()

    layer.mode = "sample_weights"  # gradients reach rho through the sampled weights
    x = torch.randn(16, 4)
    loss = (net(x) ** 2).sum() + layer.weight_sigma.sum()
    loss.backward()
    gw, grho, gb = (layer.weight_mu.grad.view(-1), layer.weight_rho.grad.view(-1),
                    layer.bias.grad)
    assert gw[[0, 5]].tolist() == [0.0, 0.0] and grho[[0, 5]].tolist() == [0.0, 0.0]
    assert gb[1].item() == 0.0
    free_w = torch.ones(12, dtype=torch.bool)
    free_w[[0, 5]] = False
    assert bool((gw[free_w] != 0).all()) and bool((grho[free_w] != 0).all())
    assert gb[0].item() != 0.0 and gb[2].item() != 0.0

    opt = torch.optim.SGD(net.parameters(), lr=0.1, weight_decay=0.5)
    opt.step()  # weight decay moves even zero-gradient entries ...
    assert layer.weight_mu.detach().view(-1)[0].item() != 0.5
    state.apply_()  # ... and apply_ puts them back exactly
    w, b = layer.weight_mu.detach().view(-1), layer.bias.detach()
    assert (w[0].item(), w[5].item(), b[1].item()) == (0.5, -0.25, 0.125)
    assert torch.equal(layer.weight_rho.detach().view(-1)[[0, 5]], rho_fixed)

    state.remove()
    layer.zero_grad()
    (net(x) ** 2).sum().backward()
    assert layer.weight_mu.grad.view(-1)[0].item() != 0.0  # hooks gone


def test_retraining_never_moves_fixed_weights(pwfn_run):
    model = copy.deepcopy(pwfn_run.trained.model)
    model.set_weight_kl(None)
    cfg = pwfn_run.pcfg
    entries = pwfn._entries(model, include_bias=True)
    total = sum(e.numel for e in entries)
    mu = pwfn._flat(entries, lambda e: e.mu)
    centres, order = candidate_centres(float(mu.abs().max()), cfg.precision, cfg.max_order)
    state = pwfn._FixedState(entries, total)
    try:
        free = torch.ones(total, dtype=torch.bool)
        value, gsig, _ = cluster_round(mu, torch.full_like(mu, 0.01), free, total // 2,
                                       centres, order)
        new = ~torch.isnan(value)
        state.value[new], state.sigma[new], state.fixed[new] = value[new], gsig[new], True
        state.apply_()
        mu_before = pwfn._flat(entries, lambda e: e.mu)
        rho_before = torch.cat([e.layer.weight_rho.detach().flatten() for e in entries
                                if e.kind == "weight"])
        pwfn._retrain(model, pwfn_run.data, cfg, pwfn_run.cfg, state, 1,
                      torch.Generator().manual_seed(0), _Bar())
        mu_after = pwfn._flat(entries, lambda e: e.mu)
        rho_after = torch.cat([e.layer.weight_rho.detach().flatten() for e in entries
                               if e.kind == "weight"])
    finally:
        state.remove()
    assert torch.equal(mu_after[new], value[new])
    assert torch.equal(mu_after[new], mu_before[new])
    is_w = torch.cat([torch.full((e.numel,), e.kind == "weight") for e in entries])
    fixed_w = new[is_w]
    assert torch.equal(rho_after[fixed_w], rho_before[fixed_w])
    assert bool((mu_after[~new] != mu_before[~new]).any()), "free weights did not train"


# ------------------------------------------------------------------ 6. counts and entropy
def test_unique_counts_and_entropy_match_numpy(pwfn_run):
    r = pwfn_run.result
    tensors = {k: v.numpy() for k, v in quantized_tensors(pwfn_run.model).items()}
    everything = np.concatenate([t.ravel() for t in tensors.values()])
    assert r.unique_values == len(np.unique(everything)) == len(r.codebook)
    assert r.entropy_bits == pytest.approx(entropy_bits_by_hand(everything), abs=1e-9)
    assert set(r.per_tensor) == set(tensors)
    for name, t in tensors.items():
        assert r.per_tensor[name]["unique"] == len(np.unique(t)), name
        assert r.per_tensor[name]["entropy_bits"] == pytest.approx(entropy_bits_by_hand(t),
                                                                   abs=1e-9)
    assert r.posterior["unique_values"] == r.unique_values
    assert r.unique_values > 1


def test_weight_entropy_bits_on_known_histograms():
    assert weight_entropy_bits(np.array([1, 1, 2, 2])) == pytest.approx(1.0)
    assert weight_entropy_bits(np.array([3, 3, 3, 3])) == 0.0
    assert weight_entropy_bits(np.arange(8) * 0.125) == pytest.approx(3.0)
    assert weight_entropy_bits(np.array([[0.5, 0.5], [0.5, -0.25]])) == pytest.approx(
        -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)))
    # exact values, no bins: values a hair apart are distinct
    assert weight_entropy_bits(np.array([1.0, 1.0 + 1e-12])) == pytest.approx(1.0)


# ------------------------------------------------------------------------- 7. truncation
def test_every_truncated_width_uses_only_codebook_values(pwfn_run):
    codebook = pwfn_run.result.posterior["codebook"]
    full = all_values(pwfn_run.model).numel()
    for w in (0.25, 0.5, 0.75, 1.0):
        small = pwfn_run.model.truncate(w)
        layers = [m for m in small.modules() if isinstance(m, BayesNestedLayer)]
        assert layers
        n = 0
        for m in layers:
            assert bool(torch.isin(m.weight_mu.detach(), codebook).all()), (w, m)
            n += m.weight_mu.numel()
            if m.bias is not None:
                assert bool(torch.isin(m.bias.detach(), codebook).all()), (w, m)
                n += m.bias.numel()
        assert (n < full) if w < 1.0 else (n == full), (w, n, full)


# ------------------------------------------------------- 8. checkpoints and config errors
def _quantize_cfg():
    return load_config("digits", TRAIN_OVERRIDES + SHORT_PWFN)


def test_quantized_model_round_trips_through_its_checkpoint(pwfn_run, tmp_path):
    from trainer.quantize.run import quantize_model

    model = copy.deepcopy(pwfn_run.trained.model)
    path = quantize_model(model, _quantize_cfg(), pwfn_run.data, tmp_path / "q",
                          progress=False, log=QUIET)
    assert path == tmp_path / "q" / "checkpoint.pt" and path.is_file()
    raw = torch.load(path, map_location="cpu", weights_only=True)
    assert raw["posterior"]["kind"] == "pwfn"
    loaded = ckpt_io.model_from_checkpoint(ckpt_io.load_checkpoint(path))
    x = pwfn_run.data.test.x[:64]
    model.eval()
    for w in (0.25, 0.5, 0.75, 1.0):
        with torch.no_grad(), model.width(w), loaded.width(w):
            assert torch.equal(model(x), loaded(x)), w


def test_quantize_checkpoint_writes_a_consistent_checkpoint_and_refuses_twice(pwfn_run,
                                                                             tmp_path):
    from trainer.quantize.run import quantize_checkpoint

    cfg = _quantize_cfg()
    path = quantize_checkpoint(pwfn_run.trained.checkpoint, cfg, tmp_path / "q", progress=False,
                               log=QUIET)
    ckpt = ckpt_io.load_checkpoint(path)
    post = ckpt["posterior"]
    assert post["kind"] == "pwfn" and ckpt["config"]["quantize"]["pwfn"]["schedule"] == [0.5, 1.0]
    assert "pwfn" in ckpt["metrics"]
    loaded = ckpt_io.model_from_checkpoint(ckpt)
    codebook = post["codebook"]
    # the stored weights are exactly codebook[indices]; rebuilding them from the posterior
    # alone gives the same network outputs
    rebuilt = ckpt_io.model_from_checkpoint(ckpt)
    with torch.no_grad():
        for name, t in quantized_tensors(loaded).items():
            idx = post["tensors"][name]["indices"].long()
            assert torch.equal(codebook[idx], t), name
            mod, kind = name.rsplit(".", 1)
            target = rebuilt.get_submodule(mod)
            (target.weight_mu if kind == "weight" else target.bias).copy_(codebook[idx])
    x = pwfn_run.data.test.x[:64]
    for w in (0.25, 1.0):
        with torch.no_grad(), loaded.width(w), rebuilt.width(w):
            assert torch.equal(loaded(x), rebuilt(x))

    with pytest.raises(CheckpointError, match="already quantized"):
        quantize_checkpoint(path, cfg, tmp_path / "again", progress=False, log=QUIET)
    assert not (tmp_path / "again").exists()


@pytest.mark.parametrize("schedule", ["[0.5,0.9]", "[0.9,0.5,1.0]", "[0.5,0.5,1.0]",
                                      "[0.0,1.0]", "[]"])
def test_invalid_schedule_is_a_config_error(schedule):
    with pytest.raises(ConfigError, match=r"quantize\.pwfn\.schedule"):
        load_config("digits", [f"quantize.pwfn.schedule={schedule}"])


def test_valid_pwfn_config_loads_and_bad_version_is_refused(pwfn_run):
    cfg = load_config("digits", ["quantize.pwfn.schedule=[0.3,1.0]", "quantize.pwfn.rule=strict"])
    assert cfg.quantize.pwfn.schedule == [0.3, 1.0] and cfg.quantize.pwfn.rule == "strict"
    with pytest.raises(ConfigError, match="version"):
        fix_weights_(copy.deepcopy(pwfn_run.trained.model), PWFNConfig(version=2),
                     pwfn_run.data, pwfn_run.cfg, progress=False, log=QUIET)


def test_fix_weights_validates_a_config_built_in_code(pwfn_run):
    model = copy.deepcopy(pwfn_run.trained.model)
    with pytest.raises(ConfigError, match=r"quantize\.pwfn\.schedule.*end at 1\.0"):
        fix_weights_(model, PWFNConfig(schedule=[0.5], epochs_per_round=0, samples=1),
                     pwfn_run.data, pwfn_run.cfg, progress=False, log=QUIET)


# ----------------------------------------------------------------------------- 9. the CLI
def test_cli_quantize_end_to_end(pwfn_run, tmp_path):
    exe = Path(sys.executable).parent / "edge-sdk"
    assert exe.is_file(), exe
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = tmp_path / "cli"
    proc = subprocess.run(
        [str(exe), "quantize", str(pwfn_run.trained.checkpoint), "--out", str(out),
         "--no-progress", "--set", "quantize.pwfn.schedule=[0.5,1.0]",
         "--set", "quantize.pwfn.epochs_per_round=1", "--set", "quantize.pwfn.samples=2"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    path = Path(last)
    assert path.is_file() and path.parent == out, proc.stdout
    ckpt = ckpt_io.load_checkpoint(path)
    post = ckpt["posterior"]
    assert post["kind"] == "pwfn" and post["rounds"][-1]["fraction"] == 1.0
    model = ckpt_io.model_from_checkpoint(ckpt)
    codebook = post["codebook"]
    for name, t in quantized_tensors(model).items():
        assert bool(torch.isin(t, codebook).all()), name
        assert torch.equal(codebook[post["tensors"][name]["indices"].long()], t), name
