"""Issue 36's promise, checked on a fixed-seed corpus of ~700 hostile bundles and calls
(tests/edge_sdk/fuzz_corpus.py): no case crashes the process, raises a raw exception or answers
NaN; each is refused with an EdgeSdkError subclass or answered with finite probabilities.
Every case runs in a child forked from a fresh process (tests/edge_sdk/fuzz_server.py), so a
crash is observed, not suffered. The CI step
``.ci/run fuzz`` runs this file alone (about a minute); ``benchmarks/fuzz.py`` runs a larger
sweep and prints the table. No torch (the session bundle is the only input)."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

import fuzz_corpus as fc

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the fork server needs fork()")


@pytest.fixture(scope="module")
def results(bundle, tmp_path_factory):
    """The CI corpus (400 byte-fuzzed slices, every shape patch ...), forked case by case from
    a fresh process, not from this one (its threads and handlers are not the children's)."""
    return fc.run_in_clean_process(bundle, tmp_path_factory.mktemp("fuzz"))


def _listing(results, outcomes) -> str:
    bad = [r for r in results if r.outcome in outcomes]
    return "\n".join(f"{r.case.cls} | {r.case.name} | {r.outcome} | {r.detail[:300]}"
                     for r in bad[:20])


def test_every_class_meets_the_audits_minimum(results):
    t = fc.table(results)
    print("\n" + fc.format_table(t))
    for cls, minimum in fc.MINIMUMS.items():
        assert t[cls]["cases"] >= minimum, (cls, t[cls]["cases"], minimum)


def test_no_case_crashes_raises_a_raw_exception_or_answers_nan(results):
    bad = _listing(results, ("crash", "raw", "nan"))
    assert not bad, f"\n{fc.format_table(fc.table(results))}\n{bad}"


def test_every_refusal_is_an_edge_sdk_error_with_a_bounded_one_line_message(results):
    for r in results:
        if r.outcome == "refused":
            assert "\n" not in r.detail, r.detail
    refused = {r.detail.split(":")[0] for r in results if r.outcome == "refused"}
    assert "SliceError" in refused  # the graph reader is what refuses most slice cases


def test_the_audits_crashing_fixtures_are_refused_by_the_graph_check(results):
    audit = [r for r in results if r.case.cls == "audit"]
    assert len(audit) == 2 and "'fc/weight'" in audit[0].case.name
    for r in audit:
        assert r.outcome == "refused", (r.case.name, r.outcome, r.detail)
        assert r.detail.startswith("SliceError: ") and "output recorded as float32" in r.detail


def test_the_control_cases_answer(results):
    control = [r for r in results if r.case.name == ".npy valid (control)"]
    assert [r.outcome for r in control] == ["answered"]
    assert any(r.outcome == "answered" for r in results if r.case.cls == "byte-fuzz")


# ------------------------------------------------------------------- the harness itself
def _segfault(directory):
    os.kill(os.getpid(), signal.SIGSEGV)


def _abort(directory):
    os.abort()


def _raw(directory):
    raise RuntimeError("a raw one")


def _nan(directory):
    return "nan"


def _hang(directory):
    signal.pause()


@pytest.mark.parametrize("run, outcome, detail", [
    (_segfault, "crash", "SIGSEGV"), (_abort, "crash", "SIGABRT"),
    (_raw, "raw", "RuntimeError: a raw one"), (_nan, "nan", ""),
    (_hang, "crash", "no answer within 2 s")])
def test_the_fork_server_reports_what_the_child_did(tmp_path, run, outcome, detail):
    """The corpus can only find crashes if its harness sees them: a child killed by SIGSEGV or
    SIGABRT, a raw exception, a NaN answer and a hang each come back as such."""
    r = fc.run_case(fc.Case("control", run.__name__, run), tmp_path, limit_s=2.0)
    assert r.outcome == outcome and detail in r.detail, (r.outcome, r.detail)


def test_the_corpus_is_deterministic(bundle):
    a = fc.corpus(bundle, byte_cases=20, shape_limit=10)
    b = fc.corpus(bundle, byte_cases=20, shape_limit=10)
    assert [(c.cls, c.name, c.files) for c in a] == [(c.cls, c.name, c.files) for c in b]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-s"]))
