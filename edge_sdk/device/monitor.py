"""The device monitor: reads battery, temperature, clock and memory off the call path, on a
background timer (every ``interval_s``, 0.1 s by default: psutil's battery and sensor reads cost
20-200 µs, far too much for a call of 20 µs), and publishes each reading as an immutable
:class:`~edge_sdk.device.state.DeviceState`. A call only compares ``signal.n`` with the one it
saw (an attribute read); the policy re-applies its rules when it changed.

Readings a platform does not report stay ``None`` and are noted once (``notes``, and one log
line): the rule that needs them stays inert, and a reading missing at the first poll is not
read again (measured: the poll's reads, 130 µs of file I/O that hand the GIL back and forth,
moved the p99 of a 23 µs call by +10 µs). The timer thread keeps off the cores the loading
thread was pinned to when the device has others (a busy model core is the one it must not
share), holds only a weak reference to the monitor and ends with it. ``poll()`` reads once,
synchronously (tests, and an app that prefers to drive it).
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from typing import Callable

from edge_sdk.device.readers import Readers
from edge_sdk.device.state import DeviceState, Signal

__all__ = ["DeviceMonitor"]

log = logging.getLogger("edge_sdk")

_WHAT = {"battery": "no battery", "temperature": "no CPU temperature",
         "clock": "no maximum CPU clock", "memory": "no available memory"}


class DeviceMonitor:
    def __init__(self, readers: Readers | None = None, interval_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, signal: Signal | None = None):
        self.readers = Readers() if readers is None else readers
        self.interval_s = interval_s
        self._clock = clock
        self.state = DeviceState(simulated=self.readers.simulated)
        self.signal = Signal() if signal is None else signal  # bumped when a reading changes
        self.notes: list[str] = []
        self._noted: set[str] = set()
        self._absent: set[str] = set()  # readings the first poll found missing
        self._polls = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- reading ---------------------------------------------------------------------------
    def _get(self, name: str, fn: Callable[[], object] | None) -> object:
        if fn is None or name in self._absent:
            return None
        try:
            v = fn()
        except Exception as e:  # a reader must never take a prediction down
            v = None
            self._note(name, f"reading {name} failed ({type(e).__name__}: {e})")
        if v is None:
            self._note(name, f"{_WHAT[name]} reported on this device: the rules that need it "
                             f"stay inert")
            if self._polls == 0:  # not there at the first reading: not asked again (each
                self._absent.add(name)  # read holds the GIL against the app's calls)
        return v

    def _note(self, key: str, text: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.notes.append(text)
            log.info("edge_sdk: %s", text)

    def poll(self) -> DeviceState:
        """Read every reader now and publish the state (``signal`` counts it when it differs)."""
        r = self.readers
        bat = self._get("battery", r.battery)
        percent: float | None = None
        plugged: bool | None = None
        if bat is not None:
            try:
                pair: tuple[object, ...] = tuple(bat)  # type: ignore[arg-type]
                if len(pair) != 2:
                    raise ValueError("not a pair")
                percent = self._float("battery", pair[0])
                plugged = None if pair[1] is None else bool(pair[1])
            except (TypeError, ValueError):
                self._note("battery", f"the battery reader returned {bat!r}, expected "
                                      f"(percent, plugged in): ignored")
        self._polls += 1
        state = DeviceState(
            at=self._clock(), battery_percent=percent, plugged=plugged,
            temperature_c=self._float("temperature", self._get("temperature", r.temperature)),
            clock_ratio=self._float("clock", self._get("clock", r.clock)),
            available_mb=self._float("memory", self._get("memory", r.memory)),
            simulated=r.simulated)
        with self._lock:
            old = self.state
            self.state = state
            if _readings(old) != _readings(state):
                self.signal.n += 1
        return state

    def _float(self, name: str, v: object) -> float | None:
        """A reading as a finite float, or None (and a note) when it is not a number."""
        if v is None:
            return None
        try:
            f = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            f = math.nan
        if not math.isfinite(f):
            self._note(f"{name}-value", f"the {name} reader returned {v!r}, expected a finite "
                                        f"number: ignored")
            return None
        return f

    # ---- the timer -------------------------------------------------------------------------
    def start(self) -> None:
        """Read now, then every ``interval_s`` on a daemon thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self.poll()
        avoid = _pinned()
        self._stop.clear()
        self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop,
                                                          self.interval_s, avoid),
                                        name="edge_sdk-device-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=1.0)
        self._thread = None

    def __del__(self) -> None:
        self._stop.set()



def _readings(s: DeviceState) -> tuple[object, ...]:
    # to 0.1 MB and 0.001 of the clock: a memory rule's limit must follow a drop smaller than
    # a configuration's need (digits slices differ by 0.1 MB), and no finer (noise)
    return (s.battery_percent, s.plugged, s.temperature_c,
            None if s.clock_ratio is None else round(s.clock_ratio, 3),
            None if s.available_mb is None else round(s.available_mb, 1))


def _pinned() -> set[int] | None:
    """The cores the calling thread may run on, when that is fewer than the device has."""
    get = getattr(os, "sched_getaffinity", None)
    if get is None:
        return None
    mine, every = set(get(0)), os.cpu_count() or 0
    return mine if 0 < len(mine) < every else None


def _run(ref: "weakref.ref[DeviceMonitor]", stop: threading.Event, interval: float,
         avoid: set[int] | None) -> None:
    if avoid is not None:
        others = set(range(os.cpu_count() or 0)) - avoid
        try:
            if others:
                os.sched_setaffinity(0, others)  # this thread only: off the model's cores
        except OSError:
            pass
    while not stop.wait(interval):
        mon = ref()
        if mon is None:
            return
        mon.poll()
        del mon  # no strong reference while waiting: the monitor dies with its model
