"""``EdgeModel.explain()``: the decision table the policy used, as data and as text."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_sdk.policy.budget import Budget
    from edge_sdk.policy.policy import Policy


@dataclass(frozen=True)
class ExplainRow:
    config_id: str
    quality_rank: int  # 1 = the rule's first preference (lowest validation NLL, then width)
    predicted_ms: float  # end-to-end, what the policy compares with the latency budget
    source: str  # measured EWMA, device profile, manifest (+ the SDK's measured overhead)
    first_use_ms: float | None  # creation + first invoke in this process (None: not yet built)
    memory_mb: float
    fits_latency: bool
    fits_memory: bool
    chosen: bool
    stage: int | None  # position in the plan (cascade: 1 = first stage), None if not run
    energy_ms: float = 0.0  # the cost the battery and heat rules minimise (Policy.energy_ms)
    ruled_out: bool = False  # an engaged device rule leaves it out now

    @property
    def fits(self) -> bool:
        return self.fits_latency and self.fits_memory


@dataclass(frozen=True)
class Explanation:
    budget_latency_ms: float | None
    budget_memory_mb: float | None
    memory_limit_mb: float  # the tightest of budget, available memory and memory_cap_mb
    policy: str
    chosen: str
    fits: bool
    reason: str
    rows: tuple[ExplainRow, ...]
    # the device rules acting now: "rule (reading): decision", and what they noted once
    rules: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for r, row in zip(d["rows"], self.rows):
            r["fits"] = row.fits
        return d

    def __str__(self) -> str:
        lat = "none" if self.budget_latency_ms is None else f"{self.budget_latency_ms:g} ms"
        mem = "none" if self.budget_memory_mb is None else f"{self.budget_memory_mb:g} MB"
        head = (f"budget: latency {lat}, memory {mem} (limit now {self.memory_limit_mb:.4g} MB); "
                f"policy {self.policy}")
        w = max(len(r.config_id) for r in self.rows) + 2
        lines = [head, f"{'configuration':<{w}}{'rank':>5}{'pred ms':>10}{'first use ms':>13}"
                       f"{'MB':>8}{'fits':>6}  source"]
        for r in self.rows:
            fits = "rule" if r.ruled_out else \
                "yes" if r.fits else ("lat" if r.fits_memory else "mem")
            mark = "  <- " + ("chosen" if r.chosen else f"stage {r.stage}") \
                if r.chosen or r.stage else ""
            first = "-" if r.first_use_ms is None else f"{r.first_use_ms:.3f}"
            lines.append(f"{r.config_id:<{w}}{r.quality_rank:>5}{r.predicted_ms:>10.4f}"
                         f"{first:>13}{r.memory_mb:>8.2f}{fits:>6}  {r.source}{mark}")
        lines += [f"device rule: {rule}" for rule in self.rules]
        lines.append(f"chosen: {self.chosen} ({'fits' if self.fits else 'does NOT fit'}): "
                     f"{self.reason}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def decision_table(pol: Policy, budget: Budget, n: int, policy_name: str) -> Explanation:
    """What the policy would do for a call of ``n`` samples under ``budget`` now, row by row
    (changes no state; the caller holds the policy's lock)."""
    if pol.rules is not None and pol.rules.stale():  # a reading since the last call
        pol._rerank()
    plan = pol.preview(budget, n)
    limit = pol.memory_limit_mb(budget)
    staged = {s.config.id: i + 1 for i, s in enumerate(plan.stages)}
    chosen = plan.stages[-1].config
    rows = []
    allowed = {c.id for c in pol.ranked}
    rs = pol.rules
    every = pol.with_variants(pol._ranked if rs is None else pol._quality)
    for rank, c in enumerate(every, 1):
        pred = pol.predicted_latency_ms(c, n)
        rows.append(ExplainRow(
            config_id=c.id, quality_rank=rank, predicted_ms=pred,
            source=pol.latency_source(c), first_use_ms=pol.first_use_ms.get(c.id),
            memory_mb=pol.memory_need_mb(c),
            fits_latency=budget.latency_ms is None or pred <= budget.latency_ms,
            fits_memory=pol.memory_need_mb(c) <= limit, chosen=c is chosen,
            stage=staged.get(c.id) if len(plan.stages) > 1 else None,
            energy_ms=pol.energy_ms(c), ruled_out=c.id not in allowed))
    engaged = () if rs is None else tuple(
        f"{n} ({rs.engaged[n]}): {rs.effects[n]}" for n in rs.engaged)
    reason = plan.reason if not engaged else \
        f"{plan.reason}, among what the device rules leave ({'; '.join(engaged)})"
    return Explanation(budget.latency_ms, budget.memory_mb, limit, policy_name,
                       chosen.id, plan.fits, reason, tuple(rows), engaged,
                       () if rs is None else tuple(rs.notes))
