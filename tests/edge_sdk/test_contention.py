"""edge_sdk.device.contention: the stall rate measured from the runtime's own calls (no device,
no clock: ``note(expected_ms, latency_ms)`` is all it sees)."""
from __future__ import annotations

import math

import pytest

from edge_sdk.device.contention import (MIN_SLICE_MS, QUIET_MS, QUIET_SLICES, REJUDGE,
                                        Contention)
from edge_sdk.device.state import Signal

SLICE = 4.0  # another task's slice, ms: what a stall on a shared core costs


def calls(ct: Contention, n: int, expected: float = 1.0) -> None:
    for _ in range(n):
        ct.note(expected, expected)


def test_calls_at_their_expected_time_are_not_stalls():
    ct = Contention(slower_than=1.5)
    calls(ct, 100)
    ct.note(1.0, 1.49)
    assert ct.stalls == 0 and not ct.engaged and ct.rate == 0.0
    assert ct.work_ms == pytest.approx(101.0)


def test_a_short_stall_within_the_target_is_the_bodys_jitter():
    ct = Contention(slower_than=1.5, target_ms=1.0)
    ct.note(0.07, 0.07 * 1.5 + MIN_SLICE_MS / 10)  # 1.5x a small call, far within the target
    assert ct.stalls == 0 and ct.rate == 0.0


def test_a_slice_stall_counts_but_one_is_not_contention():
    sig = Signal()
    ct = Contention(slower_than=1.5, slow_window_ms=400.0, signal=sig)
    ct.note(1.0, 1.0 + SLICE)
    assert ct.stalls == 1 and ct.engaged and not ct.contended
    assert ct.extra_ms == pytest.approx(SLICE)
    assert ct.rate == pytest.approx(1 / 400.0)  # one stall in the slow window
    assert sig.n == 0  # nothing a rule must judge yet


def test_two_slice_stalls_within_the_window_are_contention():
    sig = Signal()
    ct = Contention(window_ms=40.0, signal=sig)
    ct.note(1.0, 1.0 + SLICE)
    calls(ct, 10)
    ct.note(1.0, 1.0 + SLICE)
    assert ct.contended and sig.n == 1  # judged at once
    # a fair scheduler's slices: at least one stall per stall length from now on
    assert ct.rate >= 1 / SLICE - 1e-12
    assert ct.p_stall(0.8) == pytest.approx(1 - math.exp(-ct.rate * 0.8))


def test_slice_stalls_far_apart_are_not_contention():
    ct = Contention(window_ms=40.0)
    ct.note(1.0, 1.0 + SLICE)
    calls(ct, 50)  # 50 ms of calls between them
    ct.note(1.0, 1.0 + SLICE)
    assert not ct.contended and ct.stalls == 2


def test_a_miss_of_the_target_counts_in_the_rate_not_in_the_stall_size():
    ct = Contention(slower_than=1.5, target_ms=1.2)
    ct.note(1.0, 1.3)  # over the target, not 1.5x its expected time
    assert ct.stalls == 1 and ct.extra_ms == 0.0 and ct.rate > 0


def test_the_rules_judge_again_every_rejudge_stalls():
    sig = Signal()
    ct = Contention(window_ms=40.0, signal=sig)
    for _ in range(REJUDGE):
        ct.note(1.0, 1.0 + SLICE)
    assert ct.contended
    assert sig.n == 2  # turned contended at the second, and judged again at the REJUDGE-th


def test_contention_ends_after_quiet_slices_without_a_stall():
    sig = Signal()
    ct = Contention(window_ms=40.0, signal=sig)
    ct.note(1.0, 1.0 + SLICE)
    ct.note(1.0, 1.0 + SLICE)
    assert ct.contended
    quiet = max(QUIET_SLICES / ct.rate, QUIET_MS)  # ms of calls with no stall
    calls(ct, int(quiet) - 1)
    assert ct.contended  # not yet: such a gap comes by chance once in e^10
    calls(ct, 2)
    assert not ct.contended and not ct.engaged and ct.rate == 0.0
    assert sig.n == 2  # turned contended, turned quiet


def test_stalls_forgotten_without_contention_stop_the_checks():
    sig = Signal()
    ct = Contention(slow_window_ms=400.0, signal=sig)
    ct.note(1.0, 1.0 + SLICE)
    assert ct.engaged
    calls(ct, 5 * 400 + 2)
    assert not ct.engaged and ct.stalls == 0 and sig.n == 0


def test_clear_forgets_everything():
    ct = Contention()
    ct.note(1.0, 1.0 + SLICE)
    ct.note(1.0, 1.0 + SLICE)
    ct.clear()
    assert (ct.stalls, ct.slices, ct.contended, ct.engaged, ct.rate) == (0, 0, False, False, 0.0)


def test_describe_names_the_rate_and_the_stall():
    ct = Contention()
    assert "no stalls" in ct.describe()
    ct.note(1.0, 1.0 + SLICE)
    ct.note(1.0, 1.0 + SLICE)
    assert "stalls per s of calls" in ct.describe() and "+4 ms each" in ct.describe()
