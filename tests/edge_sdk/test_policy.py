"""edge_sdk.policy.policy: Budget, MemoryProbe and the selection rule, on fake configurations.

Pure unit tests: fake configurations built through the bundle schema, an injected memory
reader and a fake clock. Must not import torch, the trainer or the exporters.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_sdk.bundle import Configuration
from edge_sdk.errors import BudgetError
from edge_sdk.policy.budget import Budget, MemoryProbe
from edge_sdk.policy.policy import Policy

LABELS = 3
PLENTY_MB = 1e9


def config(cid: str, *, width: float = 1.0, scope: str = "point", samples: int = 1,
           val_nll: float = 0.3, latency_ms: float | None = 1.0, memory_mb: float | None = 1.0,
           macs: int = 100_000) -> Configuration:
    """A valid Configuration (through the bundle schema) with the fields the policy reads."""
    n_files = samples if scope == "all" else 1
    files = [{"name": f"{cid}-{i}.tflite",
              "sha256": hashlib.sha256(f"{cid}-{i}".encode()).hexdigest(), "bytes": 1000}
             for i in range(n_files)]
    return Configuration.from_dict({
        "id": cid, "width": width, "scope": scope, "samples": samples, "files": files,
        "invokes": n_files,
        "output": {"kind": "logits", "shape": [samples if scope == "head" else 1, LABELS]},
        "temperature": 1.0, "temperature_folded": False, "weights": "dequantize",
        "macs": macs, "params": 1000, "unique_values": None, "weight_entropy_bits": None,
        "thresholds": {"0.95": 0.8}, "val_nll": val_nll,
        "test": {"calibrated": {"accuracy": 0.9}},
        "latency_ms": latency_ms, "memory_mb": memory_mb,
    })


class FakeClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Reader:
    """An injectable 'available memory' reader that counts its calls."""

    def __init__(self, mb: float = PLENTY_MB):
        self.mb, self.calls = mb, 0

    def __call__(self) -> float:
        self.calls += 1
        return self.mb


def policy(configs, available_mb: float = PLENTY_MB, **kw) -> Policy:
    kw.setdefault("clock", FakeClock())  # measurements never age unless a test moves time
    return Policy(configs, MemoryProbe(reader=lambda: available_mb, clock=FakeClock()), **kw)


# --------------------------------------------------------------------------- reference rule


def reference(configs, budget: Budget, available_mb: float) -> tuple[set[str], bool]:
    """Brute force, written independently of Policy: the ids the rule allows and budget_met."""
    def fits(c):
        return ((budget.latency_ms is None or c.latency_ms <= budget.latency_ms)
                and (budget.memory_mb is None or c.memory_mb <= budget.memory_mb)
                and c.memory_mb <= available_mb)

    feasible = [c for c in configs if fits(c)]
    if feasible:
        lowest = min(c.val_nll for c in feasible)
        tied = [c for c in feasible if c.val_nll == lowest]
        widest = max(c.width for c in tied)
        tied = [c for c in tied if c.width == widest]
        fewest = min(c.invokes for c in tied)
        return {c.id for c in tied if c.invokes == fewest}, True
    limit = min(available_mb, budget.memory_mb or math.inf)
    in_memory = [c for c in configs if c.memory_mb <= limit]
    if in_memory:  # only latency is out of reach: the fastest that fits memory
        fastest = min(c.latency_ms for c in in_memory)
        tied = [c for c in in_memory if c.latency_ms == fastest]
        smallest = min(c.memory_mb for c in tied)
        return {c.id for c in tied if c.memory_mb == smallest}, False
    smallest = min(c.memory_mb for c in configs)  # nothing fits memory: the smallest
    tied = [c for c in configs if c.memory_mb == smallest]
    fastest = min(c.latency_ms for c in tied)
    return {c.id for c in tied if c.latency_ms == fastest}, False


SHAPES = [("point", 1), ("head", 2), ("head", 4), ("all", 2), ("all", 3)]
# small discrete sets make ties and boundary equalities (latency == budget) common
LATENCIES = st.one_of(st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0]),
                      st.floats(0.01, 20.0, allow_nan=False))
MEMORIES = st.one_of(st.sampled_from([1.0, 5.0, 10.0, 50.0]), st.floats(0.0, 100.0))


@st.composite
def config_sets(draw):
    specs = draw(st.lists(st.tuples(
        st.sampled_from([0.25, 0.5, 0.75, 1.0]), st.sampled_from(SHAPES),
        st.one_of(st.sampled_from([0.1, 0.2, 0.3]), st.floats(0.0, 3.0)),
        LATENCIES, MEMORIES), min_size=1, max_size=7))
    return [config(f"c{i}", width=w, scope=s, samples=n, val_nll=nll, latency_ms=lat,
                   memory_mb=mem)
            for i, (w, (s, n), nll, lat, mem) in enumerate(specs)]


budgets = st.builds(Budget, latency_ms=st.none() | LATENCIES, memory_mb=st.none() | MEMORIES.filter(
    lambda m: m > 0))
availability = st.one_of(st.just(PLENTY_MB), MEMORIES)


@settings(max_examples=300)
@given(configs=config_sets(), budget=budgets, available=availability)
def test_choose_matches_brute_force_rule(configs, budget, available):
    allowed, met = reference(configs, budget, available)
    choice, budget_met = policy(configs, available).choose(budget)
    assert choice.id in allowed
    assert budget_met is met
    if met:
        assert policy(configs, available).choose(budget, strict=True)[0].id in allowed
    else:
        with pytest.raises(BudgetError):
            policy(configs, available).choose(budget, strict=True)


@settings(max_examples=150)
@given(configs=config_sets(), budgets_seq=st.lists(budgets, min_size=1, max_size=8),
       available=availability)
def test_hysteresis_only_ever_keeps_the_previous_choice_while_it_fits(configs, budgets_seq,
                                                                     available):
    """Over a sequence of budgets on one Policy: each choice is the rule's, or - while the
    previous choice still fits - the best configuration strictly better than it that fits with
    10 % headroom, else the previous choice itself."""
    p = policy(configs, available)
    previous = None
    for budget in budgets_seq:
        allowed, met = reference(configs, budget, available)
        choice, budget_met = p.choose(budget)
        assert budget_met is met  # hysteresis never turns a met budget into a miss
        if choice.id not in allowed:
            assert previous is not None and budget.latency_ms is not None

            def fits(c, slack=1.0):
                return (c.latency_ms <= budget.latency_ms * slack
                        and (budget.memory_mb is None or c.memory_mb <= budget.memory_mb)
                        and c.memory_mb <= available)

            assert fits(previous)  # an incumbent is kept only while it fits
            pref = Policy.preference
            better = [c for c in configs if pref(c) < pref(previous) and fits(c, 0.9)]
            if better:
                top = min(pref(c) for c in better)
                assert choice.id in {c.id for c in better if pref(c) == top}
            else:
                assert choice.id == previous.id
        if budget_met:
            previous = choice


@settings(max_examples=100)
@given(configs=config_sets(), budgets_seq=st.lists(budgets, min_size=1, max_size=8),
       available=availability)
def test_without_hysteresis_every_choice_is_the_rules(configs, budgets_seq, available):
    p = policy(configs, available, hysteresis=0.0)
    for budget in budgets_seq:
        allowed, met = reference(configs, budget, available)
        choice, budget_met = p.choose(budget)
        assert choice.id in allowed and budget_met is met


# --------------------------------------------------------------------------- the rule, by hand


def test_lowest_val_nll_wins_among_fitting():
    cs = [config("a", val_nll=0.5, latency_ms=1), config("b", val_nll=0.2, latency_ms=3),
          config("c", val_nll=0.1, latency_ms=9)]
    assert policy(cs).choose(Budget())[0].id == "c"
    assert policy(cs).choose(Budget(latency_ms=5))[0].id == "b"
    assert policy(cs).choose(Budget(latency_ms=1))[0].id == "a"


def test_ties_go_to_larger_width_then_fewer_invokes():
    cs = [config("narrow", width=0.5, val_nll=0.2),
          config("all3", width=1.0, scope="all", samples=3, val_nll=0.2),
          config("head4", width=1.0, scope="head", samples=4, val_nll=0.2),
          config("all2", width=1.0, scope="all", samples=2, val_nll=0.2)]
    choice, met = policy(cs).choose(Budget())
    assert met and choice.invokes == 1 and choice.width == 1.0  # head4: one invoke
    choice, _ = policy([c for c in cs if c.id != "head4"]).choose(Budget())
    assert choice.id == "all2"


def test_a_config_exactly_at_the_budget_fits():
    cs = [config("fast", val_nll=0.9, latency_ms=1.0), config("good", val_nll=0.1, latency_ms=4.0)]
    assert policy(cs).choose(Budget(latency_ms=4.0)) == (cs[1], True)


def test_memory_budget_is_respected():
    cs = [config("w1.0", width=1.0, val_nll=0.1, memory_mb=100),
          config("w0.5", width=0.5, val_nll=0.3, memory_mb=30)]
    choice, met = policy(cs).choose(Budget(memory_mb=50))
    assert (choice.id, met) == ("w0.5", True)
    assert policy(cs).choose(Budget(memory_mb=100))[0].id == "w1.0"


def test_low_available_memory_steps_the_width_down_and_back_up():
    cs = [config("w1.0", width=1.0, val_nll=0.10, memory_mb=100),
          config("w0.75", width=0.75, val_nll=0.20, memory_mb=60),
          config("w0.5", width=0.5, val_nll=0.30, memory_mb=30)]
    reader, clock = Reader(1000), FakeClock()
    p = Policy(cs, MemoryProbe(reader=reader, clock=clock))
    steps = [(1000, "w1.0", True), (80, "w0.75", True), (40, "w0.5", True),
             (10, "w0.5", False), (1000, "w1.0", True)]
    for available, want, want_met in steps:
        reader.mb = available
        clock.t += 0.2  # past the probe's 100 ms interval
        choice, met = p.choose(Budget())
        assert (choice.id, met) == (want, want_met), available
        assert not met or p.memory_need_mb(choice) <= available


def test_infeasible_budget_gives_the_cheapest_flagged_or_raises_in_strict_mode():
    cs = [config("best", width=1.0, val_nll=0.1, latency_ms=5.0, memory_mb=10),
          config("cheap-big", width=0.5, val_nll=0.3, latency_ms=2.0, memory_mb=8),
          config("cheap-small", width=0.25, val_nll=0.5, latency_ms=2.0, memory_mb=4),
          config("mid", width=0.75, val_nll=0.2, latency_ms=3.0, memory_mb=1)]
    budget = Budget(latency_ms=1.5, memory_mb=200)
    choice, met = policy(cs).choose(budget)
    assert (choice.id, met) == ("cheap-small", False)  # lowest latency, then lowest memory
    with pytest.raises(BudgetError, match=r"latency 1\.5 ms") as info:
        policy(cs).choose(budget, strict=True)
    assert "200" in str(info.value) and "memory" in str(info.value)
    # a memory budget nothing meets: the smallest, and the error names the shortfall
    choice, met = policy(cs).choose(Budget(memory_mb=0.5))
    assert (choice.id, met) == ("mid", False)
    with pytest.raises(BudgetError, match=r"memory budget 0\.5 MB") as info:
        policy(cs).choose(Budget(memory_mb=0.5), strict=True)
    assert "needs 1 MB: 0.5 MB short" in str(info.value) and " ms" not in str(info.value)


def test_infeasible_then_feasible_again():
    cs = [config("w1", width=1.0, val_nll=0.1, latency_ms=5.0),
          config("w05", width=0.5, val_nll=0.3, latency_ms=2.0)]
    p = policy(cs)
    assert p.choose(Budget(latency_ms=1.0)) == (cs[1], False)
    assert p.choose(Budget(latency_ms=10.0)) == (cs[0], True)
    assert p.choose(Budget(latency_ms=3.0)) == (cs[1], True)


def test_missing_manifest_latency_uses_a_macs_estimate_that_grows_with_macs():
    small = config("small", latency_ms=None, macs=100_000)
    big = config("big", latency_ms=None, macs=10_000_000)
    p = policy([small, big])
    assert 0 < p.predicted_latency_ms(small) < p.predicted_latency_ms(big)
    assert math.isfinite(p.predicted_latency_ms(big))


def test_no_configurations_is_an_error():
    with pytest.raises(BudgetError):
        policy([])


# --------------------------------------------------------------------------- EWMA


def test_measured_latency_overrides_the_manifest_then_moves_by_the_ewma_factor():
    c = config("c", latency_ms=1.0)
    p = policy([c])
    assert p.predicted_latency_ms(c) == 1.0
    p.observe("c", 3.0)
    assert p.predicted_latency_ms(c) == 1.0  # the first measurement is held
    p.observe("c", 3.0)
    assert p.predicted_latency_ms(c) == pytest.approx(3.0)  # median(prior, 3, 3) replaces it
    p.observe("c", 5.0)
    assert p.predicted_latency_ms(c) == pytest.approx(3.0)  # median(3, 3, 5): one call alone
    p.observe("c", 5.0)
    assert p.predicted_latency_ms(c) == pytest.approx(3.0 + 0.2 * (5.0 - 3.0))  # sustained
    p.observe("c", 3.4)
    assert p.predicted_latency_ms(c) == pytest.approx(3.4 + 0.2 * (5.0 - 3.4))  # median 5


@given(st.lists(st.floats(0.01, 100.0), min_size=2, max_size=20))
def test_ewma_moves_toward_each_median_of_three_by_a_fifth(measurements):
    """... of the median of the last three measurements clipped at twice the estimate; the
    estimate starts at the median of the prior and the first two."""
    c = config("c", latency_ms=50.0)
    p = policy([c])
    p.observe("c", measurements[0])
    assert p.predicted_latency_ms(c) == 50.0
    p.observe("c", measurements[1])
    assert p.predicted_latency_ms(c) == pytest.approx(sorted([50.0, *measurements[:2]])[1])
    for i, m in enumerate(measurements[2:], 2):
        before = p.predicted_latency_ms(c)
        p.observe("c", m)
        med = sorted(measurements[i - 2:i + 1])[1]
        want = before + 0.2 * (min(med, 2 * before) - before)
        assert p.predicted_latency_ms(c) == pytest.approx(want, rel=1e-12)


def test_a_single_spike_does_not_move_the_estimate_but_a_slowdown_is_followed():
    c = config("c", latency_ms=1.0)
    p = policy([c])
    p.observe("c", 1.0)
    p.observe("c", 1.0)
    p.observe("c", 10.0)  # one 10x preemption spike
    assert p.predicted_latency_ms(c) == pytest.approx(1.0)
    p.observe("c", 1.0)
    assert p.predicted_latency_ms(c) == pytest.approx(1.0)
    for _ in range(30):  # the device really became 3x slower
        p.observe("c", 3.0)
    assert p.predicted_latency_ms(c) == pytest.approx(3.0, rel=0.01)


def test_measurements_change_the_choice():
    fast = config("fast", width=0.5, val_nll=0.3, latency_ms=1.0)
    slow = config("slow", width=1.0, val_nll=0.1, latency_ms=4.0)
    p = policy([fast, slow])
    budget = Budget(latency_ms=5.0)
    assert p.choose(budget)[0].id == "slow"
    p.observe("slow", 20.0)  # this device is much slower than the manifest says:
    assert p.choose(budget)[0].id == "slow"  # one measurement alone does not steer
    p.observe("slow", 20.0)  # the second confirms it
    assert p.choose(budget) == (fast, True)


def test_observing_one_config_leaves_the_others_alone():
    a, b = config("a", latency_ms=1.0), config("b", latency_ms=2.0)
    p = policy([a, b])
    p.observe("a", 9.0)
    assert p.predicted_latency_ms(b) == 2.0


# --------------------------------------------------------------------------- hysteresis


def two_widths() -> tuple[Configuration, Configuration]:
    wide = config("wide", width=1.0, val_nll=0.1, latency_ms=10.0)
    narrow = config("narrow", width=0.5, val_nll=0.3, latency_ms=5.0)
    return wide, narrow


def test_the_incumbent_is_dropped_as_soon_as_it_no_longer_fits():
    wide, narrow = two_widths()
    p = policy([wide, narrow])
    budget = Budget(latency_ms=10.0)
    assert p.choose(budget) == (wide, True)
    p.observe("wide", 10.5)
    p.observe("wide", 10.5)  # over the budget, twice: never kept beyond it
    assert p.choose(budget) == (narrow, True)


def test_a_better_configuration_needs_ten_percent_headroom_to_replace_the_incumbent():
    wide, narrow = two_widths()
    p = policy([wide, narrow])
    assert p.choose(Budget(latency_ms=9.0))[0] is narrow  # wide (10 ms) does not fit
    assert p.choose(Budget(latency_ms=10.5))[0] is narrow  # fits, but 10 > 0.9 * 10.5
    assert p.choose(Budget(latency_ms=11.2))[0] is wide  # 10 <= 0.9 * 11.2 = 10.08
    # with no incumbent the rule applies as stated: a fresh policy takes wide at 10.5
    assert policy([wide, narrow]).choose(Budget(latency_ms=10.5))[0] is wide


def test_hysteresis_does_not_flap_when_the_budget_hovers():
    wide, narrow = two_widths()
    p = policy([wide, narrow])
    assert p.choose(Budget(latency_ms=10.0))[0] is wide
    hovering = [9.5, 10.2, 9.3, 10.4, 9.7, 10.0, 9.2]  # wide (10 ms) in and out of the budget
    assert [p.choose(Budget(latency_ms=b))[0].id for b in hovering] == ["narrow"] * len(hovering)
    # without hysteresis the same trace flaps
    q = policy([wide, narrow], hysteresis=0.0)
    q.choose(Budget(latency_ms=10.0))
    ids = [q.choose(Budget(latency_ms=b))[0].id for b in hovering]
    assert "narrow" in ids and "wide" in ids


def test_hysteresis_does_not_keep_a_choice_that_no_longer_fits_memory():
    wide = config("wide", width=1.0, val_nll=0.1, latency_ms=1.0, memory_mb=100)
    narrow = config("narrow", width=0.5, val_nll=0.3, latency_ms=1.0, memory_mb=10)
    reader, clock = Reader(1000), FakeClock()
    p = Policy([wide, narrow], MemoryProbe(reader=reader, clock=clock))
    assert p.choose(Budget())[0] is wide
    reader.mb, clock.t = 99.0, 1.0  # 1 % short: there is no band for memory
    assert p.choose(Budget()) == (narrow, True)
    assert p.choose(Budget(memory_mb=105))[0] is narrow


def test_a_better_config_with_headroom_replaces_the_kept_one():
    narrow = config("narrow", width=0.5, val_nll=0.3, latency_ms=5.0)
    mid = config("mid", width=0.75, val_nll=0.2, latency_ms=6.0)
    p = policy([narrow, mid])
    assert p.choose(Budget(latency_ms=5.0))[0] is narrow
    assert p.choose(Budget(latency_ms=6.5))[0] is narrow  # mid fits, not with headroom
    assert p.choose(Budget(latency_ms=7.0))[0] is mid  # 6 <= 6.3: no stickiness


# --------------------------------------------------------------------------- MemoryProbe


def test_memory_probe_reads_at_most_every_100_ms():
    reader, clock = Reader(500), FakeClock(10.0)
    probe = MemoryProbe(reader=reader, clock=clock)
    assert probe.available_mb() == 500 and reader.calls == 1
    reader.mb = 100
    for t in (10.0, 10.01, 10.05, 10.099):
        clock.t = t
        assert probe.available_mb() == 500  # cached
    assert reader.calls == 1
    clock.t = 10.2
    assert probe.available_mb() == 100 and reader.calls == 2
    clock.t = 10.25
    probe.available_mb()
    assert reader.calls == 2


@given(st.lists(st.floats(0.0, 0.5), min_size=1, max_size=60))
def test_memory_probe_property(steps):
    """Reads are >= 100 ms apart, and the value is never older than 100 ms."""
    reader, clock = Reader(1), FakeClock(0.0)
    probe = MemoryProbe(reader=reader, clock=clock)
    reads = []
    for dt in steps:
        clock.t += dt
        before = reader.calls
        reader.mb = clock.t  # the value tells when it was read
        value = probe.available_mb()
        if reader.calls > before:
            reads.append(clock.t)
        assert clock.t - value < 0.1 + 1e-9
    assert reads[0] == steps[0]
    assert all(b - a >= 0.1 - 1e-9 for a, b in zip(reads, reads[1:]))


def test_choose_does_not_read_memory_on_every_call():
    cs = [config(f"c{i}", width=(i + 1) / 4, memory_mb=i + 1) for i in range(4)]
    reader, clock = Reader(1000), FakeClock()
    p = Policy(cs, MemoryProbe(reader=reader, clock=clock))
    for _ in range(50):
        p.choose(Budget(latency_ms=5.0))
    assert reader.calls == 1
    clock.t = 0.15
    for _ in range(50):
        p.choose(Budget(memory_mb=2.0))
    assert reader.calls == 2


def test_default_memory_probe_reads_psutil():
    psutil = pytest.importorskip("psutil")
    mb = MemoryProbe().available_mb()
    total = psutil.virtual_memory().total / 2 ** 20
    assert 0 < mb <= total


# --------------------------------------------------------------------------- Budget


@pytest.mark.parametrize("field", ["latency_ms", "memory_mb"])
@pytest.mark.parametrize("bad", [-1, -0.5, 0, 0.0, float("nan"), True, False, "5", [5], {}])
def test_invalid_budget_values_raise_budget_error(field, bad):
    with pytest.raises(BudgetError, match=field):
        Budget(**{field: bad})


@given(st.floats(min_value=1e-6, max_value=1e6), st.floats(min_value=1e-6, max_value=1e6))
def test_positive_budgets_are_accepted(lat, mem):
    b = Budget(latency_ms=lat, memory_mb=mem)
    assert (b.latency_ms, b.memory_mb) == (lat, mem)
    assert Budget() == Budget(None, None)
    assert Budget(latency_ms=5, memory_mb=64).latency_ms == 5


def test_budget_is_frozen():
    b = Budget(latency_ms=5)
    with pytest.raises(AttributeError):
        b.latency_ms = 1  # type: ignore[misc]


def test_budget_accepts_numpy_scalars():
    b = Budget(latency_ms=np.float32(5.0), memory_mb=np.int64(64))
    assert b.latency_ms == 5.0 and b.memory_mb == 64
