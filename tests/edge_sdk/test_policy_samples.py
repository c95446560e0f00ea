"""The policy over (width, scope, S) candidates (issue 21): a store bundle lists one
configuration per S in 1 .. S_max for the head and all scopes, 68 for 4 widths x (point +
head 1..8 + all 1..8), the all-scope ones listing the same sample files. The rule, the memory
need and the cascade climb must treat S as a candidate dimension. Fake configurations through
the bundle schema; no torch, no interpreter."""
from __future__ import annotations

import hashlib

import pytest

from edge_sdk.bundle import Configuration
from edge_sdk.policy.budget import Budget, MemoryProbe
from edge_sdk.policy.policy import Policy

LABELS = 3
WIDTHS = (0.25, 0.5, 0.75, 1.0)
S_MAX = 8
SLICE = 40_000  # bytes of a full-width slice (the widths scale it by width^2)


def _entry(name: str, size: int) -> dict:
    return {"name": name, "sha256": hashlib.sha256(name.encode()).hexdigest(), "bytes": size}


def candidates() -> list[Configuration]:
    """4 widths x (point, head S, all S), S = 1 .. 8: NLL falls with width and with S, latency
    grows with width and (all scope) with S; all S lists sample files s0 .. s(S-1)."""
    out = []
    for w in WIDTHS:
        key, size = f"{w:.2f}", int(SLICE * w * w)
        base = {"width": w, "temperature": 1.0, "temperature_folded": False,
                "weights": "dequantize", "params": 1000, "unique_values": None,
                "weight_entropy_bits": None, "thresholds": {"0.95": 0.8},
                "test": {"calibrated": {"accuracy": 0.9}}, "memory_mb": None,
                "macs": int(1e6 * w * w)}
        out.append({**base, "id": f"w{key}-point", "scope": "point", "samples": 1,
                    "files": [_entry(f"w{key}-point.tflite", size)], "invokes": 1,
                    "output": {"kind": "logits", "shape": [1, LABELS]},
                    "val_nll": 1.0 - 0.2 * w, "latency_ms": 1.0 * w})
        for s in range(1, S_MAX + 1):
            out.append({**base, "id": f"w{key}-head{s}", "scope": "head", "samples": s,
                        "files": [_entry(f"w{key}-head{s}.tflite", size + 100 * s)],
                        "invokes": 1, "output": {"kind": "logits", "shape": [s, LABELS]},
                        "val_nll": 1.0 - 0.2 * w - 0.01 * s, "latency_ms": 1.0 * w + 0.01 * s})
            out.append({**base, "id": f"w{key}-all{s}", "scope": "all", "samples": s,
                        "files": [_entry(f"w{key}-s{i}.tflite", size) for i in range(s)],
                        "invokes": s, "output": {"kind": "logits", "shape": [1, LABELS]},
                        "val_nll": 1.0 - 0.2 * w - 0.02 * s, "latency_ms": 1.0 * w * s})
    return [Configuration.from_dict(c) for c in out]


def policy(**kw) -> Policy:
    return Policy(candidates(), MemoryProbe(lambda: 1e9), **kw)


def test_68_candidates_are_ranked_and_chosen_by_the_rule():
    pol = policy()
    assert len(pol.configs) == 68 == len(pol.ranked)
    for latency in (0.3, 0.6, 1.05, 2.0, 3.5, 8.5, None):
        for memory in (None, 0.05, 0.2, 1.0):
            budget = Budget(latency_ms=latency, memory_mb=memory)
            chosen, ok, _ = pol.decide(budget)
            fits = [c for c in pol.configs if pol.fits(c, budget)]
            if fits:
                assert ok and chosen == min(fits, key=Policy.preference)
            else:
                assert not ok


def test_memory_need_grows_with_s_and_all_scope_files_are_shared():
    pol = policy()
    by_id = {c.id: c for c in pol.configs}
    for w in WIDTHS:
        key = f"{w:.2f}"
        one = pol.memory_need_mb(by_id[f"w{key}-all1"])
        for s in range(1, S_MAX + 1):
            c = by_id[f"w{key}-all{s}"]
            assert pol.memory_need_mb(c) == pytest.approx(s * one)
            assert c.files == by_id[f"w{key}-all{S_MAX}"].files[:s]  # a prefix of S_max's
    # 4 widths x (1 point + 8 heads + 8 samples) distinct files behind 68 configurations
    assert len({f.name for c in pol.configs for f in c.files}) == 68


def test_a_memory_budget_picks_the_largest_s_that_fits():
    pol = policy()
    by_id = {c.id: c for c in pol.configs}
    four = pol.memory_need_mb(by_id["w1.00-all4"])
    chosen, ok, _ = pol.decide(Budget(memory_mb=four * 1.01))
    assert ok and chosen.scope == "all"
    same = [c for c in pol.configs if c.scope == "all" and c.width == chosen.width
            and pol.memory_need_mb(c) <= four * 1.01]
    assert chosen.samples == max(c.samples for c in same)  # the most samples that fit
    chosen, ok, _ = pol.decide(Budget(memory_mb=four * 1.01), among=[
        c for c in pol.configs if c.width == 1.0 and c.scope == "all"])
    assert ok and chosen.id == "w1.00-all4"


def test_the_cascade_climb_keeps_s():
    """No exported plans: the climb is one rung per width at the chosen scope *and* S."""
    pol = Policy([c for c in candidates() if c.scope == "all"], MemoryProbe(lambda: 1e9),
                 mode="cascade")
    plan = pol.plan(Budget(latency_ms=4.5))
    assert plan.stages[-1].config.id == "w1.00-all4"
    assert [s.config.id for s in plan.stages] == [f"w{w:.2f}-all4" for w in WIDTHS]
