"""What :meth:`edge_sdk.runtime.model.EdgeModel.warm_up` runs so that the first call of a
process costs what the hundredth does: every configuration a call could run now (the plan's
stages and their precision variants) built, and then called end to end a few times on a
synthetic sample, so that everything the call path does once (the interpreter's first invokes,
the answer graph's buffers, the OOD and conformal maths, a lazily imported module) has been
done, and the policy holds estimates measured on this device (the median of the prior and these
calls) instead of a first real call's outlier.
"""
from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from edge_sdk.errors import ConfigError
from edge_sdk.policy.budget import Budget
from edge_sdk.validation import show

if TYPE_CHECKING:
    from edge_sdk.bundle.configuration import Configuration
    from edge_sdk.bundle.input_spec import InputSpec

__all__ = ["MAX_WARM_BATCH", "WARM_CALLS", "synthetic_sample", "warm", "warm_set"]

# end-to-end calls per configuration: the policy's estimate needs two (the first is held as a
# possible outlier, the second confirms it), a precision variant's speed the median of three
WARM_CALLS = 3
# warm_up(batch_size=...): a batch is resized into every interpreter; far above any app's
MAX_WARM_BATCH = 65536


class Model(Protocol):
    """What warming needs of :class:`edge_sdk.runtime.model.EdgeModel` (a protocol: the
    model imports this module)."""

    @property
    def input_spec(self) -> InputSpec: ...

    def _resident(self, c: Configuration, n: int = 1) -> tuple[list[Any], float]: ...

    def predict(self, x: Any, budget: Budget | None = None, *,
                config_id: str | None = None) -> Any: ...

    def predict_batch(self, xs: Any, budget: Budget | None = None, *,
                      config_id: str | None = None) -> Any: ...


def synthetic_sample(spec: InputSpec, n: int = 1) -> np.ndarray:
    """``n`` samples ``[n, H, W, C]`` at the training split's per-channel mean, in the raw
    dtype and range the bundle declares: valid input, so the whole call path runs."""
    lo, hi = spec.value_range
    x = np.broadcast_to(np.clip(np.asarray(spec.mean, np.float64), lo, hi),
                        (n, *spec.shape[1:]))
    if spec.dtype == "uint8":
        return np.rint(x).astype(np.uint8)
    return x.astype(np.dtype(spec.dtype))


def warm_set(stages: Sequence[Configuration],
             variants: Sequence[Sequence[Configuration]]) -> list[Configuration]:
    """The configurations a call could run now: each stage and its precision variants (the
    policy may probe or switch to a variant on any call), each once, in order."""
    out: dict[str, Configuration] = {}
    for c, group in zip(stages, variants):
        out.setdefault(c.id, c)
        for v in group:
            out.setdefault(v.id, v)
    return list(out.values())


def warm(model: Model, configs: Sequence[Configuration], batch_size: object = 1
         ) -> dict[str, float]:
    """Build ``configs`` in this thread and call each :data:`WARM_CALLS` times end to end,
    pinned, on :func:`synthetic_sample` (and ``predict_batch`` at ``batch_size`` > 1);
    the first-use ms per configuration."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
            or not 1 <= int(batch_size) <= MAX_WARM_BATCH:
        raise ConfigError(f"batch_size must be an integer in [1, {MAX_WARM_BATCH}], got "
                          f"{show(batch_size)}")
    n = int(batch_size)
    built = {c.id: model._resident(c, 1)[1] for c in configs}
    one = synthetic_sample(model.input_spec)[0]
    many = synthetic_sample(model.input_spec, n) if n > 1 else None
    for c in configs:
        for _ in range(WARM_CALLS):
            model.predict(one, Budget(), config_id=c.id)
            if many is not None:
                model.predict_batch(many, Budget(), config_id=c.id)
    return built
