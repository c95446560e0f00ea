"""edge_sdk.device.monitor and edge_sdk.device.state: the device monitor on injected readers.

Pure unit tests (no bundle, no psutil reading asserted): every reader is a callable the test
controls. The one timing test is loose (at least 2 polls within 1 s at a 0.05 s interval).
Must not import torch, the trainer or the exporters.
"""
from __future__ import annotations

import gc
import logging
import math
import os
import threading
import time
import weakref

import pytest

from edge_sdk.device.monitor import DeviceMonitor
from edge_sdk.device.readers import Readers
from edge_sdk.device.state import FIELDS, DeviceState, Signal

THREAD = "edge_sdk-device-monitor"


class Value:
    """A reader returning ``v`` (settable), counting its calls and the threads it ran on."""

    def __init__(self, v: object):
        self.v, self.calls, self.threads = v, 0, []

    def __call__(self) -> object:
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        return self.v


def readers(battery=(55.0, False), temperature=45.0, clock=0.9, memory=2048.0,
            simulated=frozenset()) -> tuple[Readers, dict[str, Value]]:
    vals = {"battery": Value(battery), "temperature": Value(temperature),
            "clock": Value(clock), "memory": Value(memory)}
    return Readers(simulated=frozenset(simulated), **vals), vals


def wait_for(cond, timeout: float = 2.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


# --------------------------------------------------------------------------- poll


def test_poll_publishes_every_reading_and_the_clock():
    r, _ = readers()
    mon = DeviceMonitor(r, clock=lambda: 123.5)
    s = mon.poll()
    assert s is mon.state
    assert (s.at, s.battery_percent, s.plugged, s.temperature_c, s.clock_ratio,
            s.available_mb) == (123.5, 55.0, False, 45.0, 0.9, 2048.0)
    assert mon.notes == []


def test_poll_carries_simulated():
    sim = frozenset({"battery_percent", "plugged"})
    r, _ = readers(simulated=sim)
    mon = DeviceMonitor(r)
    assert mon.state.simulated == sim  # before the first poll too
    assert mon.poll().simulated == sim


def test_signal_counts_only_changed_readings():
    r, vals = readers()
    shared = Signal()
    mon = DeviceMonitor(r, signal=shared)
    assert mon.signal is shared
    mon.poll()
    n = shared.n
    assert n == 1  # the first reading differs from "nothing read"
    for _ in range(5):
        mon.poll()  # the same readings: the rules have nothing new to judge
    assert shared.n == n
    for name, v in (("battery", (54.0, False)), ("battery", (54.0, True)),
                    ("temperature", 70.0), ("clock", 0.5), ("memory", 100.0)):
        vals[name].v = v
        mon.poll()
        assert shared.n == n + 1, name
        n = shared.n
        mon.poll()
        assert shared.n == n, name  # read again, unchanged


def test_poll_with_every_reader_off_reads_nothing():
    mon = DeviceMonitor(Readers(battery=None, temperature=None, clock=None, memory=None))
    s = mon.poll()
    assert all(getattr(s, f) is None for f in FIELDS)
    assert mon.notes == []  # a reading switched off is not a missing one
    assert mon.signal.n == 0


@pytest.mark.parametrize("name, field", [("battery", "battery_percent"),
                                         ("temperature", "temperature_c"),
                                         ("clock", "clock_ratio"), ("memory", "available_mb")])
def test_missing_reading_is_none_and_noted_once(name, field, caplog):
    r, vals = readers()
    vals[name].v = None
    mon = DeviceMonitor(r)
    with caplog.at_level(logging.INFO, logger="edge_sdk"):
        for _ in range(20):
            s = mon.poll()
    assert getattr(s, field) is None
    if name == "battery":
        assert s.plugged is None
    assert len(mon.notes) == 1, mon.notes
    assert "stay inert" in mon.notes[0]
    assert sum(mon.notes[0] in rec.getMessage() for rec in caplog.records) == 1
    others = [f for f in FIELDS if f not in (field, "plugged")]
    assert all(getattr(s, f) is not None for f in others)


# --------------------------------------------------------------------------- bad readers


def _raise():
    raise RuntimeError("hwmon went away")


@pytest.mark.parametrize("name, value", [
    ("temperature", "abc"), ("temperature", math.nan), ("temperature", math.inf),
    ("temperature", object()), ("clock", "abc"), ("clock", math.nan), ("memory", [1, 2]),
    ("memory", -math.inf),
    ("battery", (10.0, True, 3)), ("battery", "abc"), ("battery", 42.0),
    ("battery", (math.nan, False)),
    ("battery", ("abc", False)), ("battery", object()),
])
def test_garbage_reading_is_ignored_and_noted(name, value):
    r, vals = readers()
    vals[name].v = value
    mon = DeviceMonitor(r)
    for _ in range(10):
        s = mon.poll()  # never raises
    field = {"battery": "battery_percent", "temperature": "temperature_c",
             "clock": "clock_ratio", "memory": "available_mb"}[name]
    assert getattr(s, field) is None
    assert len(mon.notes) == 1, mon.notes
    assert "ignored" in mon.notes[0]
    # the other readings are unaffected
    assert s.available_mb == (None if name == "memory" else 2048.0)
    assert s.temperature_c == (None if name == "temperature" else 45.0)


@pytest.mark.parametrize("name", ["battery", "temperature", "clock", "memory"])
def test_raising_reader_never_raises_and_is_noted_once(name):
    r, vals = readers()
    r = Readers(**{**{k: v for k, v in vals.items()}, name: _raise})
    mon = DeviceMonitor(r)
    for _ in range(10):
        s = mon.poll()
    assert len(mon.notes) == 1, mon.notes
    assert "RuntimeError" in mon.notes[0] and "hwmon went away" in mon.notes[0]
    field = {"battery": "battery_percent", "temperature": "temperature_c",
             "clock": "clock_ratio", "memory": "available_mb"}[name]
    assert getattr(s, field) is None


def test_reader_recovering_after_a_failure_is_read_again():
    r, vals = readers()
    vals["temperature"].v = "abc"
    mon = DeviceMonitor(r)
    assert mon.poll().temperature_c is None
    vals["temperature"].v = 61.0
    assert mon.poll().temperature_c == 61.0


# --------------------------------------------------------------------------- describe


def test_describe_labels_simulated_readings():
    s = DeviceState(battery_percent=20.0, plugged=False, temperature_c=81.4, clock_ratio=0.75,
                    available_mb=300.2, simulated=frozenset({"battery_percent", "plugged"}))
    assert s.describe("battery_percent") == "battery 20 % (simulated)"
    assert s.describe("plugged") == "on battery (simulated)"
    assert s.describe("temperature_c") == "CPU 81 °C"
    assert s.describe("clock_ratio") == "clock 75% of max"
    assert s.describe("available_mb") == "300 MB available"
    assert "(simulated)" not in s.describe("temperature_c")


def test_describe_plugged_and_missing():
    s = DeviceState(plugged=True, simulated=frozenset({"plugged", "temperature_c"}))
    assert s.describe("plugged") == "plugged in (simulated)"
    assert s.describe("temperature_c") == "temperature c not reported"
    assert "not reported" in DeviceState().describe("battery_percent")


def test_describe_on_a_polled_state():
    r, _ = readers(battery=(20.4, False), simulated={"battery_percent"})
    s = DeviceMonitor(r).poll()
    assert s.describe("battery_percent") == "battery 20 % (simulated)"
    assert s.describe("plugged") == "on battery"


# --------------------------------------------------------------------------- the timer


def test_timer_polls_at_about_the_interval_and_stops():
    r, vals = readers()
    mon = DeviceMonitor(r, interval_s=0.05)
    mon.start()
    try:
        assert vals["memory"].calls == 1  # start() reads once, synchronously
        assert wait_for(lambda: vals["memory"].calls >= 3, timeout=1.0), vals["memory"].calls
        assert THREAD in vals["memory"].threads
        thread = mon._thread
        assert thread is not None and thread.daemon and thread.name == THREAD
        mon.start()  # idempotent: still one thread
        assert mon._thread is thread
        vals["temperature"].v = 90.0
        assert wait_for(lambda: mon.state.temperature_c == 90.0, timeout=1.0)
    finally:
        mon.stop()
    assert not thread.is_alive()
    n = vals["memory"].calls
    time.sleep(0.2)
    assert vals["memory"].calls == n  # no poll after stop()


def test_timer_can_restart_after_stop():
    r, vals = readers()
    mon = DeviceMonitor(r, interval_s=0.02)
    mon.start()
    mon.stop()
    n = vals["memory"].calls
    mon.start()
    try:
        assert wait_for(lambda: vals["memory"].calls >= n + 3, timeout=1.0)
    finally:
        mon.stop()


def test_timer_ends_when_the_monitor_is_collected():
    r, vals = readers()
    mon = DeviceMonitor(r, interval_s=0.02)
    mon.start()
    thread = mon._thread
    assert thread is not None
    assert wait_for(lambda: vals["memory"].calls >= 2, timeout=1.0)
    ref = weakref.ref(mon)
    del mon
    gc.collect()
    assert wait_for(lambda: ref() is None, timeout=2.0)  # the thread holds no strong ref
    thread.join(timeout=2.0)
    assert not thread.is_alive()
    n = vals["memory"].calls
    time.sleep(0.1)
    assert vals["memory"].calls == n


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only (CPU affinity)")
def test_timer_thread_avoids_the_callers_pinned_cores():
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("needs at least two usable cores")
    pin = {min(mine)}
    seen: list[set[int]] = []

    def temperature() -> float:
        if threading.current_thread().name == THREAD:
            seen.append(os.sched_getaffinity(0))
        return 50.0

    r = Readers(battery=None, temperature=temperature, clock=None, memory=None)
    mon = DeviceMonitor(r, interval_s=0.02)
    os.sched_setaffinity(0, pin)  # this (the loading) thread only
    try:
        mon.start()
        assert wait_for(lambda: len(seen) >= 2, timeout=2.0)
    finally:
        os.sched_setaffinity(0, mine)
        mon.stop()
    assert all(s and not (s & pin) for s in seen), (pin, seen)
    assert os.sched_getaffinity(0) == mine  # the caller's own affinity untouched


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only (CPU affinity)")
def test_timer_thread_keeps_the_callers_cores_when_not_pinned():
    mine = os.sched_getaffinity(0)
    if len(mine) != (os.cpu_count() or 0):
        pytest.skip("the process is already restricted to fewer cores than the device has")
    seen: list[set[int]] = []

    def temperature() -> float:
        if threading.current_thread().name == THREAD:
            seen.append(os.sched_getaffinity(0))
        return 50.0

    mon = DeviceMonitor(Readers(battery=None, temperature=temperature, clock=None, memory=None),
                        interval_s=0.02)
    mon.start()
    try:
        assert wait_for(lambda: len(seen) >= 1, timeout=2.0)
    finally:
        mon.stop()
    assert seen[0] == mine
