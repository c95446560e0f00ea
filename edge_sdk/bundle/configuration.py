"""One configuration of a bundle: :class:`Configuration`, a runnable
(width, scope, samples) with what was measured about it, and the checks of its fields (the
confidence thresholds, the cascade plans, the test metrics, the store recipes of its files).

stdlib only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_sdk.bundle.records import (
    PRECISION,
    SCOPES,
    WEIGHT_ROUTES,
    FileEntry,
    OutputSpec,
    Recipe,
    _Record,
    _record,
)
from edge_sdk.errors import BundleError
from edge_sdk.validation import (
    bool_value,
    choice,
    f32_value,
    fail,
    float_value,
    int_value,
    join,
    key_path,
    list_value,
    mapping,
    optional_float,
    show,
    str_value,
)


def _thresholds(value: object, path: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, conf in mapping(value, path).items():
        p = key_path(path, key)
        target = None
        if isinstance(key, str):
            try:
                target = float(key)
            except ValueError:
                pass
        if target is None or not 0.0 < target <= 1.0:
            fail(
                p,
                "keys must be target accuracies in (0, 1] written as strings like '0.95', "
                f"got {type(key).__name__} {show(key)}",
            )
        out[str(key)] = optional_float(conf, p, ge=0.0, le=1.0)
    return out


def _cascade(value: object, path: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for wider, entry in mapping(value, path).items():
        tp = key_path(path, wider)
        str_value(wider, tp)
        e = mapping(entry, tp)
        want = {"threshold", "coverage", "max_loss"}
        if not want <= set(e) <= want | {"targets"}:
            fail(tp, f"expected keys {', '.join(sorted(want))} and optionally targets, got "
                     f"{', '.join(map(str, e))}")
        plan: dict[str, Any] = {
            "threshold": optional_float(e["threshold"], join(tp, "threshold"), ge=0.0, le=1.0),
            "coverage": float_value(e["coverage"], join(tp, "coverage"), ge=0.0, le=1.0),
            "max_loss": float_value(e["max_loss"], join(tp, "max_loss"), ge=0.0, le=1.0)}
        if "targets" in e:  # schema version 8: one plan per target accuracy of the cascade
            targets: dict[str, dict[str, float | None]] = {}
            for t, te in mapping(e["targets"], join(tp, "targets")).items():
                ttp = key_path(join(tp, "targets"), t)
                _thresholds({t: None}, join(tp, "targets"))  # the key: a target accuracy
                te = mapping(te, ttp)
                if set(te) != {"threshold", "coverage"}:
                    fail(ttp, f"expected keys coverage, threshold, got "
                              f"{', '.join(map(str, te))}")
                targets[str(t)] = {
                    "threshold": optional_float(te["threshold"], join(ttp, "threshold"),
                                                ge=0.0, le=1.0),
                    "coverage": float_value(te["coverage"], join(ttp, "coverage"),
                                            ge=0.0, le=1.0)}
            plan["targets"] = targets
        out[str(wider)] = plan
    return out


def cascade_plan(c: Configuration, wider: str, target: str
                 ) -> tuple[float | None, float] | None:
    """(threshold, coverage) of ``c``'s plan towards ``wider`` for the target accuracy
    ``target`` (a key such as '0.95'): the target's own plan (schema version 8), else the
    plan's one threshold (older bundles planned one per wider configuration, whatever the
    target); None without a plan towards ``wider``."""
    e = c.cascade.get(wider)
    if e is None:
        return None
    t = e.get("targets", {}).get(target)
    if t is not None:
        return t["threshold"], t["coverage"]
    return e["threshold"], e["coverage"]


def _test_metrics(value: object, path: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for group, metrics in mapping(value, path).items():
        gp = key_path(path, group)
        str_value(group, gp)
        inner: dict[str, float] = {}
        for name, number in mapping(metrics, gp).items():
            mp = key_path(gp, name)
            str_value(name, mp)
            inner[str(name)] = float_value(number, mp)
        out[str(group)] = inner
    return out


@dataclass(frozen=True, kw_only=True)
class Configuration(_Record):
    """One runnable (width, scope, samples) configuration and what was measured about it."""

    id: str
    width: float
    scope: str
    samples: int
    # parsed: FileEntry records (a layout-store manifest writes their names, in to_dict only)
    files: tuple[FileEntry, ...]
    invokes: int
    output: OutputSpec
    temperature: float
    temperature_folded: bool
    weights: str
    macs: int
    params: int
    unique_values: int | None = None
    # entropy in bits over the exact weight values of the slice (before folding); None when not
    # quantized
    weight_entropy_bits: float | None = None
    thresholds: dict[str, float | None]
    # wider configuration id -> {threshold, coverage, max_loss, and (schema version 8)
    # targets: {target accuracy: {threshold, coverage}}}: cascade_plan() reads it
    cascade: dict[str, dict[str, Any]] = field(default_factory=dict)
    val_nll: float
    # (schema version 10) the accuracy of the validation predictions (the argmax: the same at
    # any temperature), which the device rules compare; None: not recorded (an older bundle)
    val_accuracy: float | None = None
    test: dict[str, dict[str, float]]
    latency_ms: float | None = None
    memory_mb: float | None = None
    # schema version 3, layout store: how each file is materialised from the weight store, one
    # recipe per file in file order (docs/store.md §5); None in a files-layout bundle
    materialize: tuple[Recipe, ...] | None = None

    @property
    def precision(self) -> str:
        """What the slice computes in: ``float`` (float32 kernels), ``dynamic`` (int8 weights,
        activations quantized per invoke) or ``int8`` (int8 kernels end to end)."""
        return PRECISION[self.weights]

    @property
    def variant_of(self) -> tuple[float, str, int]:
        """(width, scope, samples): the network this configuration computes, whatever its
        precision; configurations that share it differ in their kernels only."""
        return (self.width, self.scope, self.samples)

    def to_dict(self) -> dict[str, Any]:
        """Plain data in schema key order; ``materialize`` only when set (store layout),
        ``val_accuracy`` only when recorded (schema version 10: absent = not recorded)."""
        out = super().to_dict()
        if self.materialize is None:
            del out["materialize"]
        if self.val_accuracy is None:
            del out["val_accuracy"]
        return out

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["id"] = str_value(v["id"], join(path, "id"))
        out["width"] = float_value(v["width"], join(path, "width"), gt=0.0, le=1.0)
        scope = out["scope"] = choice(v["scope"], join(path, "scope"), SCOPES)
        samples = out["samples"] = int_value(v["samples"], join(path, "samples"), minimum=1)
        if scope == "point" and samples != 1:
            fail(join(path, "samples"), f"expected 1 for scope 'point', got {samples}")

        p = join(path, "files")
        files = tuple(
            _record(FileEntry, item, f"{p}[{i}]") for i, item in enumerate(list_value(v["files"], p))
        )
        want = samples if scope == "all" else 1
        if len(files) != want:
            why = f"one per sample (samples={samples})" if scope == "all" else "exactly one"
            fail(p, f"expected {want} file(s) for scope {scope!r} ({why}), got {len(files)}")
        seen: dict[str, int] = {}
        for i, entry in enumerate(files):
            if entry.name in seen:
                fail(f"{p}[{i}].name", f"duplicate file {entry.name!r} (also {p}[{seen[entry.name]}])")
            seen[entry.name] = i
        out["files"] = files

        invokes = out["invokes"] = int_value(v["invokes"], join(path, "invokes"), minimum=1)
        if invokes != want:
            fail(
                join(path, "invokes"),
                f"expected {want} for scope {scope!r} with samples={samples}, got {invokes}",
            )
        output = out["output"] = _record(OutputSpec, v["output"], join(path, "output"))
        rows = samples if scope == "head" else 1
        if output.shape[0] != rows:
            shape = "[S, C] with S = samples" if scope == "head" else "[1, C]"
            fail(
                join(join(path, "output"), "shape"),
                f"expected {shape} for scope {scope!r} (samples={samples}), "
                f"got {list(output.shape)}",
            )
        # logits / temperature in float32 (5e-324 made NaN probabilities)
        out["temperature"] = f32_value(v["temperature"], join(path, "temperature"),
                                       positive=True)
        out["temperature_folded"] = bool_value(v["temperature_folded"], join(path, "temperature_folded"))
        out["weights"] = choice(v["weights"], join(path, "weights"), WEIGHT_ROUTES)
        out["macs"] = int_value(v["macs"], join(path, "macs"), minimum=0)
        out["params"] = int_value(v["params"], join(path, "params"), minimum=0)
        uv = v["unique_values"]
        out["unique_values"] = (
            None if uv is None else int_value(uv, join(path, "unique_values"), minimum=0)
        )
        out["weight_entropy_bits"] = optional_float(
            v["weight_entropy_bits"], join(path, "weight_entropy_bits"), ge=0.0)
        out["thresholds"] = _thresholds(v["thresholds"], join(path, "thresholds"))
        out["cascade"] = _cascade(v["cascade"], join(path, "cascade"))
        out["val_nll"] = float_value(v["val_nll"], join(path, "val_nll"), ge=0.0)
        out["val_accuracy"] = optional_float(v["val_accuracy"], join(path, "val_accuracy"),
                                             ge=0.0, le=1.0)
        out["test"] = _test_metrics(v["test"], join(path, "test"))
        out["latency_ms"] = optional_float(v["latency_ms"], join(path, "latency_ms"), ge=0.0)
        out["memory_mb"] = optional_float(v["memory_mb"], join(path, "memory_mb"), ge=0.0)
        out["materialize"] = _recipes(v["materialize"], join(path, "materialize"), scope,
                                      samples, len(files))
        return out


def version_rules(c: Configuration, version: int, path: str) -> None:
    """Refuse what configuration ``c`` (at ``path``) holds that its manifest's schema
    ``version`` cannot: integer kernels (from 7), cascade plans per target accuracy (from 8),
    the validation accuracy (from 10)."""
    if c.weights == "int8" and version < 7:
        fail(join(path, "weights"), f"'int8' needs schema version 7 (a version-{version} "
                                    "bundle has float and dynamic-range slices only)")
    if version < 8:
        for w_id, e in c.cascade.items():
            if "targets" in e:
                fail(f"{path}.cascade.{w_id}.targets", f"needs schema version 8 "
                     f"(a version-{version} bundle plans one threshold per cascade)")
    if c.val_accuracy is not None and version < 10:
        fail(join(path, "val_accuracy"), f"needs schema version 10 (a version-{version} bundle "
                                         "records no validation accuracy); set schema_version: "
                                         "10 or remove it")


def _recipes(value: object, path: str, scope: str, samples: int, count: int
             ) -> tuple[Recipe, ...] | None:
    """One recipe per file, each fitting the scope: point = the point network (sample null,
    heads 0), head = S stacked heads (heads = samples), all = one distinct sample per file."""
    if value is None:
        return None
    items = list_value(value, path)
    if len(items) != count:
        fail(path, f"expected one recipe per file ({count}), got {len(items)}")
    recipes = tuple(_record(Recipe, item, f"{path}[{i}]") for i, item in enumerate(items))
    for i, r in enumerate(recipes):
        p = f"{path}[{i}]"
        if scope == "head" and r.heads != samples:
            fail(join(p, "heads"), f"expected {samples} (scope 'head', samples={samples}), got "
                                   f"{r.heads}")
        if scope != "head" and r.heads:
            fail(join(p, "heads"), f"expected 0 for scope {scope!r}, got {r.heads}")
        if scope == "point" and r.sample is not None:
            fail(join(p, "sample"), f"expected null (the point network) for scope 'point', got "
                                    f"{r.sample}")
        if scope == "all" and r.sample is None:
            fail(join(p, "sample"), "expected a sample index for scope 'all', got null")
    if scope == "all":
        seen: dict[int, int] = {}
        for i, r in enumerate(recipes):
            if r.sample is None:  # (refused above)
                continue
            if r.sample in seen:
                fail(f"{path}[{i}].sample", f"duplicate sample {r.sample} (also "
                                            f"{path}[{seen[r.sample]}]): S distinct samples")
            seen[r.sample] = i
    return recipes


def named_configuration(item: object, path: str, names: list[str] | None,
                         slices_path: str = "slices") -> Configuration:
    """Parse one configuration; a recipe error of a file listed by name is reported at the
    slices table entry it came from (the recipe is not in the configuration)."""
    if names is None:
        return _record(Configuration, item, path)
    try:
        return _record(Configuration, item, path)
    except BundleError as exc:
        msg = str(exc)
        for j, name in enumerate(names):
            where = f"{path}.materialize[{j}]"
            if msg.startswith(where + ".") or msg.startswith(where + ":"):
                rest = msg[len(where):].lstrip(".")
                raise BundleError(f"{key_path(slices_path, name)}.{rest} (listed by {path}."
                                  f"files[{j}])") from None
        raise
