"""``load(rules=...)``: the device rules of a model, wired to the policy: a device monitor for the
rules that read the device (its timer started here), the contention estimate the calls feed for
:class:`~edge_sdk.policy.rules.UnderContention`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from edge_sdk.device.contention import Contention
from edge_sdk.device.monitor import DeviceMonitor
from edge_sdk.device.readers import Readers
from edge_sdk.device.state import Signal
from edge_sdk.errors import ConfigError
from edge_sdk.policy.rules import RuleSet, UnderContention, check_rules
from edge_sdk.validation import real_value, show

if TYPE_CHECKING:
    from edge_sdk.policy.policy import Policy
    from edge_sdk.policy.rules import Rule


def use_rules(policy: Policy, rules: Iterable[Rule] | Rule | None, readers: Readers | None,
              interval_s: object) -> DeviceMonitor | None:
    """Apply ``rules`` to ``policy``; returns the running monitor (None: no rule reads the
    device). The memory reading is the policy's own probe (``load(memory_reader=...)``'s)."""
    got = check_rules(rules)
    if readers is not None and not isinstance(readers, Readers):
        raise ConfigError(f"readers must be an edge_sdk.device.readers.Readers, got "
                          f"{show(readers)}")
    iv = real_value(interval_s)
    if iv is None or not 0.001 <= iv <= 3600:
        raise ConfigError(f"monitor_interval_s must be a number of seconds in [0.001, 3600], "
                          f"got {show(interval_s)}")
    if not got:
        return None
    monitor = None
    signal = Signal()  # one change counter for the monitor and the contention estimate
    if any(r.needs for r in got):
        if readers is None:  # the policy's own probe, read on the timer: one read, not two
            # (each holds the GIL against the app's calls), and calls find it fresh
            readers = Readers(memory=policy.memory.read)
        monitor = DeviceMonitor(readers, iv, signal=signal)
    contention = None
    tail = next((r for r in got if isinstance(r, UnderContention)), None)
    if tail is not None:
        contention = Contention(slower_than=tail.slower_than, target_ms=tail.latency_ms,
                                signal=signal)
    ruleset = RuleSet(got, policy, monitor, contention, policy.configs)
    if monitor is not None:
        monitor.start()  # the first reading in before the rules first judge
    policy.use_rules(ruleset, contention)
    return monitor
