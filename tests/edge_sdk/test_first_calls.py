"""The runtime as a new user meets it: after ``load()`` and ``warm_up()`` the first call
imports and builds nothing and is measured like the hundredth, and a cascade's target
accuracy picks the plan exported for it.

No torch here (only the ``bundle`` fixture needs it, or ``EDGE_SDK_TEST_BUNDLE``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_runtime import PLENTY_MB, manifest, with_thresholds, xs  # noqa: F401 (fixtures)

import edge_sdk
from edge_sdk.bundle.configuration import cascade_plan
from edge_sdk.errors import ConfigError
from edge_sdk.runtime.warm import WARM_CALLS, synthetic_sample

REPO_ROOT = Path(__file__).resolve().parents[2]

FIRST_CALL = """
import json, sys, numpy as np, edge_sdk
m = edge_sdk.load(sys.argv[1]); m.warm_up()
x = np.asarray(json.loads(sys.argv[2]), dtype=m.input_spec.dtype)
before = set(sys.modules)
built = dict(m.first_use_ms)
p = m.predict(x)
if x.shape[-1] == 1:  # the general input path too: a grey [H, W] float64 array
    m.predict(x[..., 0].astype(np.float64))
print(json.dumps({"new_modules": sorted(set(sys.modules) - before),
                  "built_in_call": sorted(set(m.first_use_ms) - set(built)),
                  "config_id": p.config_id}))
"""


def test_the_first_call_after_warm_up_imports_and_builds_nothing(bundle, xs):
    """In a fresh process (a module imported on first use shows only there): numpy.ma was
    imported by the first call's input check of an array that was not already the declared
    shape and dtype (40-75 ms, the whole first call)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))}
    out = subprocess.run([sys.executable, "-c", FIRST_CALL, str(bundle),
                          json.dumps(np.asarray(xs[0]).tolist())],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["new_modules"] == [] and got["built_in_call"] == []


def test_warm_up_measures_every_configuration_a_call_could_run(bundle):
    """The plan's stages and their precision variants are built and called end to end, so
    the policy holds this device's estimates (two measurements make one: the first is held)."""
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    stages = [s.config for s in m.policy.preview(m.budget).stages]
    built = m.warm_up()
    want = {v.id for c in stages for v in m.policy.variants(c)}
    assert set(built) == want
    for cid in want:
        assert "measured" in m.policy.latency_source(m.manifest.configuration(cid))
    assert WARM_CALLS >= 2


def test_warm_up_can_measure_a_batch_size(bundle):
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    c = m.policy.preview(m.budget).stages[-1].config
    m.warm_up(config_ids=[c.id], batch_size=8)
    assert (c.id, 8) in m.policy._measured
    for bad in (0, 1.5, True, "8"):
        with pytest.raises(ConfigError, match="batch_size"):
            m.warm_up(batch_size=bad)


def test_the_synthetic_sample_is_valid_input(bundle):
    m = edge_sdk.load(bundle, memory_reader=lambda: PLENTY_MB)
    x = synthetic_sample(m.input_spec, 3)
    assert x.shape == (3, *m.input_spec.shape[1:]) and x.dtype == np.dtype(m.input_spec.dtype)
    m.predict_batch(x)  # no InputError


# ---------------------------------------------------------------- target accuracy, cascade


@pytest.fixture(scope="module")
def targeted(bundle, tmp_path_factory) -> Path:
    """Every plan answers everything at target 0.9 and only near-certain answers at 0.99."""
    plan = {"threshold": 0.5, "coverage": 0.6, "max_loss": 0.002,
            "targets": {"0.9": {"threshold": 0.0, "coverage": 1.0},
                        "0.99": {"threshold": 0.999, "coverage": 0.3}}}
    return with_thresholds(bundle, tmp_path_factory.mktemp("targeted") / "b",
                           {"0.9": 0.0, "0.95": 0.5, "0.99": 0.999}, plan)


@pytest.mark.parametrize("target", [0.9, 0.95, 0.99])
def test_the_target_accuracy_picks_the_threshold_exported_for_it(targeted, xs, target):
    """The first stage's answer stands exactly when its confidence reaches the threshold of
    the plan for this target (0.95 has none of its own: the plan's 0.5)."""
    m = edge_sdk.load(targeted, policy="cascade", target_accuracy=target,
                      memory_reader=lambda: PLENTY_MB, abstain_on_ood=False)
    stages = m.policy.preview(m.budget).stages
    assert len(stages) == 2
    first, final = stages[0].config, stages[1].config
    threshold = cascade_plan(first, final.id, f"{target:g}")[0]
    assert stages[0].accept == threshold == {0.9: 0.0, 0.95: 0.5, 0.99: 0.999}[target]
    for x in xs:
        alone = m.predict(x, config_id=first.id)
        p = m.predict(x)
        assert p.config_id == (first.id if alone.confidence >= threshold else final.id)


def test_a_lax_target_answers_more_from_the_first_stage(targeted, xs):
    firsts = {}
    for target in (0.9, 0.99):
        m = edge_sdk.load(targeted, policy="cascade", target_accuracy=target,
                          memory_reader=lambda: PLENTY_MB, abstain_on_ood=False)
        first = m.policy.preview(m.budget).stages[0].config.id
        firsts[target] = sum(m.predict(x).config_id == first for x in xs)
    assert firsts[0.9] == len(xs) > firsts[0.99]
