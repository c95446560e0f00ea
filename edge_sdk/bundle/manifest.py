"""The manifest records: :class:`Configuration` (one runnable width/scope/samples) and
:class:`Manifest` (the whole ``manifest.yaml``), with the cross-field rules between them.

stdlib only.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_sdk.bundle.records import (
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    SCOPES,
    WEIGHT_ROUTES,
    FileEntry,
    InputSpec,
    OutputSpec,
    _Record,
    _record,
)
from edge_sdk.errors import BundleError
from edge_sdk.validation import (
    NodeBudget,
    bool_value,
    choice,
    fail,
    float_value,
    int_value,
    join,
    key_path,
    list_value,
    mapping,
    optional_float,
    plain,
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


def _cascade(value: object, path: str) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for target, entry in mapping(value, path).items():
        tp = key_path(path, target)
        str_value(target, tp)
        e = mapping(entry, tp)
        want = {"threshold", "coverage", "max_loss"}
        if set(e) != want:
            fail(tp, f"expected keys {', '.join(sorted(want))}, got {', '.join(map(str, e))}")
        out[str(target)] = {
            "threshold": optional_float(e["threshold"], join(tp, "threshold"), ge=0.0, le=1.0),
            "coverage": float_value(e["coverage"], join(tp, "coverage"), ge=0.0, le=1.0),
            "max_loss": float_value(e["max_loss"], join(tp, "max_loss"), ge=0.0, le=1.0)}
    return out


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
    # wider configuration id -> {threshold, coverage, max_loss}: see the module docstring
    cascade: dict[str, dict[str, float | None]] = field(default_factory=dict)
    val_nll: float
    test: dict[str, dict[str, float]]
    latency_ms: float | None = None
    memory_mb: float | None = None

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
        out["temperature"] = float_value(v["temperature"], join(path, "temperature"), gt=0.0)
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
        out["test"] = _test_metrics(v["test"], join(path, "test"))
        out["latency_ms"] = optional_float(v["latency_ms"], join(path, "latency_ms"), ge=0.0)
        out["memory_mb"] = optional_float(v["memory_mb"], join(path, "memory_mb"), ge=0.0)
        return out


def _check_version(value: object, path: str) -> int:
    version = int_value(value, path)
    if version not in READABLE_VERSIONS:
        fail(
            path,
            f"unsupported schema version {version}; this edge_sdk reads schema versions "
            f"{', '.join(map(str, READABLE_VERSIONS))} (re-export the bundle, or use a matching "
            "edge_sdk)",
        )
    return version


@dataclass(frozen=True, kw_only=True)
class Manifest(_Record):
    """The whole ``manifest.yaml``.

    ``batch_dim`` (schema version 2): the dimension of every slice's input that is the batch
    (0), or None when the slices are batch-1 only (every version-1 bundle). When set, an
    interpreter resized to ``N`` along it (``resize_tensor_input``) answers ``[N * rows, C]``,
    rows ``n * rows`` to ``(n + 1) * rows - 1`` for sample ``n`` (``rows`` = output.shape[0]).
    """

    schema_version: int = SCHEMA_VERSION
    input: InputSpec
    labels: tuple[str, ...]
    source: dict[str, Any] = field(default_factory=dict)
    batch_dim: int | None = None
    configurations: tuple[Configuration, ...]

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def batch_resizable(self) -> bool:
        """Whether one invoke may run a batch: resize the input along :attr:`batch_dim`."""
        return self.batch_dim is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain data in schema key order; no ``batch_dim`` in a version-1 manifest."""
        out = super().to_dict()
        if self.schema_version < 2:
            del out["batch_dim"]
        return out

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.configurations)

    def configuration(self, id: str) -> Configuration:  # noqa: A002 - the manifest's key name
        """The configuration called ``id``; BundleError listing the available ids otherwise."""
        for config in self.configurations:
            if config.id == id:
                return config
        raise BundleError(
            f"no configuration {show(id)} in this bundle; available: {', '.join(self.ids)}"
        )

    def file_entries(self) -> tuple[FileEntry, ...]:
        """Every file of the bundle once, in manifest order."""
        seen: dict[str, FileEntry] = {}
        for config in self.configurations:
            for entry in config.files:
                seen.setdefault(entry.name, entry)
        return tuple(seen.values())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "") -> Manifest:
        data = mapping(data, path or "manifest")
        # The version decides what every other key means: check it first.
        if "schema_version" not in data:
            fail(join(path, "schema_version"), "missing required key")
        _check_version(data["schema_version"], join(path, "schema_version"))
        return super().from_dict(data, path)

    @classmethod
    def _parse(cls, v: dict[str, Any], path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["schema_version"] = _check_version(v["schema_version"], join(path, "schema_version"))
        out["input"] = _record(InputSpec, v["input"], join(path, "input"))
        if out["input"].classes is not None:
            fail(join(path, "input.classes"), "unknown key: a manifest's input carries no class "
                  "names (its top-level labels do)")

        p = join(path, "labels")
        items = list_value(v["labels"], p, nonempty=True)
        labels = tuple(str_value(x, f"{p}[{i}]") for i, x in enumerate(items))
        first: dict[str, int] = {}
        for i, label in enumerate(labels):
            if label in first:
                fail(f"{p}[{i}]", f"duplicate label {show(label)} (also {p}[{first[label]}])")
            first[label] = i
        out["labels"] = labels

        p = join(path, "source")
        out["source"] = plain(mapping(v["source"], p), p, NodeBudget())

        p = join(path, "batch_dim")
        batch_dim = v["batch_dim"]
        if batch_dim is not None:
            if out["schema_version"] < 2:
                fail(p, f"needs schema version 2 (a version-{out['schema_version']} bundle's "
                        "slices are batch 1); set schema_version: 2 or remove batch_dim")
            batch_dim = int_value(batch_dim, p)
            if batch_dim != 0:
                fail(p, f"expected 0 (the N of the input's [N, H, W, C]) or null, got {batch_dim}")
        out["batch_dim"] = batch_dim

        p = join(path, "configurations")
        configs = tuple(
            _record(Configuration, item, f"{p}[{i}]")
            for i, item in enumerate(list_value(v["configurations"], p, nonempty=True))
        )
        ids: dict[str, int] = {}
        files: dict[str, tuple[FileEntry, str]] = {}
        folded: dict[str, str] = {}
        for i, config in enumerate(configs):
            cp = f"{p}[{i}]"
            if config.id in ids:
                fail(
                    join(cp, "id"),
                    f"duplicate configuration id {show(config.id)} (also {p}[{ids[config.id]}])",
                )
            ids[config.id] = i
            classes = config.output.shape[1]
            if classes != len(labels):
                fail(
                    f"{cp}.output.shape[1]",
                    f"expected {len(labels)} classes (one per label), got {classes}",
                )
            for j, entry in enumerate(config.files):
                fp = f"{cp}.files[{j}]"
                if entry.name in files:
                    other, where = files[entry.name]
                    if other != entry:
                        fail(
                            fp,
                            f"file {entry.name!r} is also listed by {where} "
                            "with a different sha256 or size",
                        )
                    continue
                lower = entry.name.casefold()
                if lower in folded and folded[lower] != entry.name:
                    fail(
                        f"{fp}.name",
                        f"file names must differ by more than letter case ({entry.name!r} "
                        f"vs {folded[lower]!r}): they collide on case-insensitive file systems",
                    )
                files[entry.name] = (entry, fp)
                folded[lower] = entry.name
        by_id = {c.id: c for c in configs}
        for i, config in enumerate(configs):
            for target in config.cascade:
                other = by_id.get(target)
                if other is None or other.scope != config.scope or other.width <= config.width:
                    fail(f"{p}[{i}].cascade.{target}", "expected the id of a wider configuration "
                          f"of the same scope ({config.scope!r}, width > {config.width:g})")
        out["configurations"] = configs
        return out


