"""Downhill ordering unit: the mathematical properties BN³ §2–3 and App. 7–8.2 rely on."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from edge_sdk.errors import ConfigError
from trainer.ordering import DownhillOrdering, exclusive_cumsum, tau_schedule


def unit(groups=8, frozen=1, seed=0, **kw):
    torch.manual_seed(seed)
    u = DownhillOrdering(groups, frozen, **kw)
    with torch.no_grad():
        u.mubar.copy_(torch.randn_like(u.mubar) * 2)
    return u


shapes = st.tuples(st.integers(1, 12), st.integers(1, 12)).filter(lambda t: t[1] <= t[0])


@settings(max_examples=30)
@given(gf=shapes, seed=st.integers(0, 10_000), tau=st.floats(0.05, 5.0))
def test_soft_samples_are_downhill(gf, seed, tau):
    groups, frozen = gf
    z = unit(groups, frozen, seed).sample(tau=tau, hard=False, shape=(64,))
    assert z.shape == (64, groups)
    assert bool(((z >= -1e-6) & (z <= 1 + 1e-6)).all())
    assert bool((z[:, 1:] <= z[:, :-1] + 1e-6).all()), "samples must be non-increasing along j"
    assert torch.allclose(z[:, :frozen], torch.ones(64, frozen))


@settings(max_examples=30)
@given(gf=shapes, seed=st.integers(0, 10_000))
def test_hard_samples_are_exactly_ordered_masks(gf, seed):
    groups, frozen = gf
    z = unit(groups, frozen, seed).sample(tau=0.5, hard=True, shape=(256,))
    ones = z.round()
    assert torch.allclose(z, ones, atol=1e-6)
    kept = ones.sum(1)
    expected = (torch.arange(groups) < kept[:, None]).float()
    assert torch.equal(ones, expected)
    assert bool((kept >= frozen).all())


def test_mean_of_hard_samples_matches_keep_probability():
    torch.manual_seed(1)
    u = unit(8, 2, seed=3)
    z = u.sample(tau=0.3, hard=True, shape=(20_000,)).detach()
    keep = u.keep_probability().detach()
    assert (z.mean(0) - keep).abs().max() < 0.02


@settings(max_examples=30)
@given(gf=shapes, seed=st.integers(0, 10_000))
def test_beta_normalised_and_keep_probability_identities(gf, seed):
    groups, frozen = gf
    u = unit(groups, frozen, seed)
    beta = u.beta()
    assert beta.shape == (groups - frozen + 1,)
    assert torch.isclose(beta.sum(), torch.tensor(1.0), atol=1e-5)
    keep = u.keep_probability()
    # keep_j = 1 - sum_{k<j} beta_k over the tail index (eq. 43-44); tails start at F.
    full_beta = torch.cat([torch.zeros(frozen - 1), beta])
    assert torch.allclose(keep, 1 - exclusive_cumsum(full_beta), atol=1e-5)
    # ... and = prod_{k<=j} mu_k with mu_1..F = 1 (App. 8.2).
    mu = torch.cat([torch.ones(frozen), torch.sigmoid(u.mubar)])
    assert torch.allclose(keep, torch.cumprod(mu, 0), atol=1e-6)
    assert torch.equal(keep[:frozen], torch.ones(frozen))


@settings(max_examples=30)
@given(gf=shapes, seed=st.integers(0, 10_000))
def test_kl_nonnegative(gf, seed):
    groups, frozen = gf
    assert unit(groups, frozen, seed).kl().item() >= -1e-6


def test_kl_zero_at_prior_and_positive_elsewhere():
    pi = [0.3, 0.8, 0.5, 0.9, 0.6]
    u = DownhillOrdering(6, 1, prior_pi=pi)
    with torch.no_grad():
        u.mubar.copy_(torch.logit(torch.tensor(pi)))
    assert torch.allclose(u.beta(), u.log_prior().exp(), atol=1e-6)
    assert abs(u.kl().item()) < 1e-6
    with torch.no_grad():
        u.mubar.add_(0.5)
    assert u.kl().item() > 1e-4


def test_prior_is_the_bernoulli_chain_product():
    # p(v_j) = (1 - pi_{j+1}) prod_{k<=j} pi_k, pi_1 = 1, pi_{G+1} = 0 (eq. 12)
    pi = [0.7, 0.4, 0.9]
    u = DownhillOrdering(4, 1, prior_pi=pi)
    full = [1.0] + pi + [0.0]
    expect = [(1 - full[j + 1]) * math.prod(full[: j + 1]) for j in range(4)]
    assert torch.allclose(u.log_prior().exp(), torch.tensor(expect), atol=1e-6)


@pytest.mark.parametrize("hard", [False, True])
def test_gradients_reach_ordering_parameters(hard):
    u = unit(6, 1)
    z = u.sample(tau=0.5, hard=hard, shape=(32,))
    (z * torch.arange(6.0)).sum().backward()
    assert u.mubar.grad is not None and u.mubar.grad.abs().sum() > 0


def test_fixed_width_mask_and_snapping():
    u = unit(8, 2)
    assert torch.equal(u.mask(0.5), torch.tensor([1.0] * 4 + [0.0] * 4))
    assert u.groups_for_width(0.3) == 3  # 2.4 groups snaps up to 3
    assert u.groups_for_width(1.0) == 8
    with pytest.raises(ConfigError, match="smallest width"):
        u.groups_for_width(0.1)
    for bad in (0.0, 1.5, float("nan"), -1):
        with pytest.raises(ConfigError, match=r"\(0, 1\]"):
            u.groups_for_width(bad)
    with u.fixed(0.5):
        m = u.forward_mask(3)
    assert torch.allclose(m[0, :4], u.keep_probability()[:4]) and m[0, 4:].abs().sum() == 0


def test_construction_errors():
    with pytest.raises(ConfigError, match="frozen"):
        DownhillOrdering(4, 0)
    with pytest.raises(ConfigError, match="frozen"):
        DownhillOrdering(4, 5)
    with pytest.raises(ConfigError, match="prior_pi"):
        DownhillOrdering(4, 1, prior_pi=1.0)
    with pytest.raises(ConfigError, match="prior_pi"):
        DownhillOrdering(4, 1, prior_pi=[0.5, 0.5])


def test_tau_schedule_anneals_monotonically():
    taus = [tau_schedule(s, 100, 1.0, 0.1) for s in range(100)]
    assert taus[0] == pytest.approx(1.0) and taus[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(taus, taus[1:]))


def test_rescale_of_follows_the_regime_and_switches_the_fixed_width_mask():
    from trainer.ordering import rescale_of

    # sampled Downhill masks -> the App. 8.2 rescale; fixed 0/1 widths only -> none
    assert rescale_of({"train": {"sampled_width": "downhill"}, "ordering": {}}) is True
    assert rescale_of({"train": {"sampled_width": "uniform"}, "ordering": {}}) is False
    assert rescale_of({"train": {"sampled_width": "uniform"},
                       "ordering": {"rescale": True}}) is True
    assert rescale_of(None) is True  # no recorded regime: the paper's rescale
    u = unit()
    keep = u.keep_probability().detach()
    with u.fixed(0.5):
        assert torch.allclose(u.forward_mask(1)[0], keep * (torch.arange(8) < 4))
    u.rescale = False
    with u.fixed(0.5):
        assert torch.equal(u.forward_mask(1)[0], (torch.arange(8) < 4).float())
    u.eval()
    assert torch.equal(u.forward_mask(1)[0], torch.ones(8))
    # the regulariser still sees the learned keep probabilities
    assert torch.equal(u.keep_probability().detach(), keep)
