"""Precision variants in the policy (edge_sdk.policy.variants), on synthetic configurations: one
choice per network, answered by the variant that runs fastest by the median of its recent
measurements; one slow call decides nothing; a variant not measured lately is probed; variants
of one route, or far apart in quality, are not grouped."""
from __future__ import annotations

from edge_sdk.bundle import Configuration
from edge_sdk.policy.budget import Budget, MemoryProbe
from edge_sdk.policy.policy import Policy
from edge_sdk.policy.variants import PROBE_CALLS, RECENT, RECHECK_CALLS
from test_policy import FakeClock, config

PLENTY_MB = 1e6


def variant(c: Configuration, weights: str, suffix: str, **fields) -> Configuration:
    d = {**c.to_dict(), "weights": weights, "id": c.id + suffix, **fields}
    d["files"] = [{**f, "name": f["name"].replace(".tflite", suffix + ".tflite")}
                  for f in d["files"]]
    return Configuration.from_dict(d)


def policy(latencies=(1.0, 0.4, 0.5), nll=(0.30, 0.305, 0.302)) -> tuple[Policy, list]:
    base = config("w1", width=1.0, latency_ms=latencies[0], val_nll=nll[0])
    configs = [base, variant(base, "hybrid", "-dyn", latency_ms=latencies[1], val_nll=nll[1]),
               variant(base, "int8", "-int8", latency_ms=latencies[2], val_nll=nll[2]),
               config("w05", width=0.5, latency_ms=0.2, val_nll=0.5)]
    return Policy(configs, MemoryProbe(lambda: PLENTY_MB), clock=FakeClock()), configs


def answers(pol: Policy) -> str:
    return pol.call_stages(Budget())[0].config.id


def test_a_network_s_variants_answer_as_one_the_predicted_fastest_first():
    pol, (f, d, i, w05) = policy()
    assert pol.variants(f) == (f, d, i) and pol.variants(w05) == (w05,)
    assert pol.candidates == [d, w05]  # the group at its best variant's place (f's NLL)
    assert answers(pol) == "w1-dyn"  # predicted fastest: the manifest's 0.4 ms
    assert [c.id for c in pol.ranked] == ["w1-dyn", "w1", "w1-int8", "w05"]


def test_measured_speed_decides_and_one_slow_call_does_not():
    pol, (f, d, i, _) = policy()
    for _ in range(RECHECK_CALLS + 1):
        pol.observe(d.id, 0.9)  # dyn measures slow here, steadily
    assert answers(pol) == "w1-int8"  # its prior 0.5 beats a median of 0.9
    for _ in range(RECHECK_CALLS - 1):
        pol.observe(i.id, 0.5)
    pol.observe(i.id, 50.0)  # one spike in the recheck's window: the median holds
    assert answers(pol) == "w1-int8"


def test_a_variant_not_measured_lately_is_probed_then_kept_if_faster():
    pol, (f, d, i, _) = policy(latencies=(2.0, 0.7, 0.5))
    assert answers(pol) == "w1-int8"
    probed = []
    for k in range(2 * PROBE_CALLS + 2 * RECHECK_CALLS):
        cid = answers(pol)
        if cid != "w1-int8":
            probed.append(cid)
        pol.observe(cid, {"w1": 2.0, "w1-dyn": 0.3, "w1-int8": 0.5}[cid])
    assert probed[:RECENT] == ["w1-dyn"] * RECENT  # in a row: the first one runs cold
    assert "w1" not in probed  # 4x slower by its prior: never worth a probe
    assert answers(pol) == "w1-dyn"  # measured 0.3 on its probes: it takes over


def test_a_small_gain_does_not_switch_variants():
    pol, (f, d, i, _) = policy(latencies=(1.0, 0.4, 0.41))
    for _ in range(RECHECK_CALLS + 1):
        pol.observe(d.id, 0.40)
    for _ in range(RECHECK_CALLS + 1):
        pol.observe(i.id, 0.39)  # 2.5 % faster: within timing noise, no switch
    assert answers(pol) == "w1-dyn"


def test_what_is_not_a_variant_is_not_grouped():
    base = config("a", latency_ms=1.0)
    same_route = config("b", latency_ms=0.1)  # the same network and route: two configurations
    pol = Policy([base, same_route], MemoryProbe(lambda: PLENTY_MB), clock=FakeClock())
    assert pol.variants(base) == (base,) and pol.candidates == pol.ranked
    worse = variant(base, "int8", "-int8", latency_ms=0.1, val_nll=base.val_nll + 0.02)
    pol = Policy([base, worse], MemoryProbe(lambda: PLENTY_MB), clock=FakeClock())
    assert pol.variants(worse) == (worse,)  # 0.02 NLL worse than the tolerance allows
    assert [c.id for c in pol.candidates] == ["a", "a-int8"]  # ranked by its own quality
    tolerant = Policy([base, worse], MemoryProbe(lambda: PLENTY_MB), clock=FakeClock(),
                      precision_tolerance=0.05)
    assert tolerant.variants(base) == (base, worse)
    assert tolerant.candidates == [worse]  # faster, and within the tolerance asked for
