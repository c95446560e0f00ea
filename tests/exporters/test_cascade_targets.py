"""exporters.calibrate.cascade_threshold: one cascade plan per target accuracy (schema
version 8), each the largest first-stage coverage whose composite validation accuracy reaches
the target, or gives up at most ``max_loss`` where the wider configuration itself does not."""
from __future__ import annotations

import re

import numpy as np
import pytest
from test_export import _cascade_case


@pytest.mark.parametrize("max_loss", [0.0, 0.002, 0.02])
def test_each_target_gets_the_largest_coverage_that_reaches_it(max_loss):
    from exporters.calibrate import cascade_threshold

    narrow, wide, labels = _cascade_case(wide_skill=2.5)
    targets = (0.5, 0.7, 0.8, 0.9, 0.99)
    plan = cascade_threshold(narrow, wide, labels, max_loss, targets)
    conf = narrow.max(1)
    here, there = narrow.argmax(1) == labels, wide.argmax(1) == labels

    def composite(t):
        accept = conf >= t
        return np.where(accept, here, there).mean(), accept.mean()

    coverages = []
    for t in targets:
        # a target left out plans at the plan's own threshold
        e = plan.get("targets", {}).get(f"{t:g}", plan)
        floor = min(t, there.mean() - max_loss)  # the target, or what the wide one allows
        if e["threshold"] is None:
            assert e["coverage"] == 0.0
            coverages.append(0.0)
            continue
        acc, cov = composite(e["threshold"])
        assert acc >= floor - 1e-12
        assert cov == pytest.approx(e["coverage"], rel=5e-4)  # 4 significant digits
        # no lower threshold (more coverage) among the observed confidences reaches it
        assert all(composite(v)[0] < floor - 1e-12 for v in np.sort(conf[conf < e["threshold"]]))
        coverages.append(cov)
    # a laxer target lets the first stage answer at least as much
    assert coverages == sorted(coverages, reverse=True)
    assert coverages[0] > coverages[-1]
    # a target above the wide configuration's accuracy is the max_loss plan: left out
    assert "0.99" not in plan["targets"] and "0.5" in plan["targets"]


def test_the_plan_s_targets_round_trip_through_the_manifest_checks():
    """The configuration reader keeps the targets and refuses a malformed one, naming it."""
    from edge_sdk.bundle.configuration import _cascade, cascade_plan
    from edge_sdk.errors import BundleError

    entry = {"threshold": 0.9, "coverage": 0.5, "max_loss": 0.002,
             "targets": {"0.9": {"threshold": 0.4, "coverage": 0.95},
                         "0.99": {"threshold": 0.9, "coverage": 0.5}}}
    got = _cascade({"w1": entry}, "c.cascade")
    assert got["w1"] == entry

    class C:
        cascade = got

    assert cascade_plan(C, "w1", "0.9") == (0.4, 0.95)  # type: ignore[arg-type]
    assert cascade_plan(C, "w1", "0.95") == (0.9, 0.5)  # no plan for it: the plan's own
    assert cascade_plan(C, "w2", "0.9") is None  # type: ignore[arg-type]
    for bad, where in (({"0.9": {"threshold": 0.4}}, "c.cascade.w1.targets['0.9']"),
                       ({"x": {"threshold": 0.4, "coverage": 1.0}}, "c.cascade.w1.targets"),
                       ({"0.9": {"threshold": 1.4, "coverage": 1.0}}, "threshold")):
        with pytest.raises(BundleError, match=re.escape(where)):
            _cascade({"w1": {**entry, "targets": bad}}, "c.cascade")
