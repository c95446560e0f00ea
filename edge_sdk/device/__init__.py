"""What the device is doing: battery, heat and clock, memory (:mod:`.readers`, read off the call
path by :mod:`.monitor` into a :class:`~.state.DeviceState`), and contention for the CPU measured
from the runtime's own calls (:mod:`.contention`). The rules that act on them are the policy's
(:mod:`edge_sdk.policy.rules`).

Imports: edge_sdk.errors, edge_sdk.validation.
"""
