"""The manifest record: :class:`Manifest` (the whole ``manifest.yaml``), with the cross-field
rules between it and its configurations (:mod:`.configuration`) and the compact store form it
expands and writes (:mod:`.compact`).

stdlib only.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_sdk.bundle.compact import (_CASCADE_MAX_LOSS, _COMPACT_DEFAULTS, _NAMED_DEFAULTS,
                                     _compact_graphs, _compact_test, _derived, _graphs,
                                     _resolve_names, _slices)
from edge_sdk.bundle.activation_quant import parse_activation_quant
from edge_sdk.bundle.configuration import Configuration, named_configuration, version_rules
from edge_sdk.bundle.input_spec import InputSpec
from edge_sdk.bundle.records import (
    BUNDLE_LAYOUTS,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    FileEntry,
    Recipe,
    Slice,
    StoreEntry,
    _Record,
    _record,
)
from edge_sdk.bundle.stats import InputStats
from edge_sdk.errors import BundleError
from edge_sdk.validation import (
    NodeBudget,
    choice,
    fail,
    int_value,
    join,
    key_path,
    list_value,
    mapping,
    plain,
    show,
    str_value,
)


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

    ``layout`` (schema version 3; older versions are ``files``): ``files`` = every listed file
    is in the bundle directory; ``store`` = the directory holds one weight store (``store``)
    and every configuration's files are virtual, materialised from it with the width's graph
    description (``graphs``) by each file's recipe (``Configuration.materialize``), and
    checked against the listed sha256 before use (docs/store.md).
    """

    schema_version: int = SCHEMA_VERSION
    input: InputSpec
    labels: tuple[str, ...]
    source: dict[str, Any] = field(default_factory=dict)
    batch_dim: int | None = None
    layout: str = "files"
    store: StoreEntry | None = None
    # layout store: file name -> Slice (sha256, bytes, recipe), every virtual file once; the
    # configurations' files and recipes are resolved from it (built from them when absent)
    slices: dict[str, Slice] = field(default_factory=dict)
    configurations: tuple[Configuration, ...]
    # width key -> the width's point graph description, weights by reference (store layout)
    graphs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (schema version 5) ``uncertainty.bin``: out-of-distribution statistics and
    # conformal quantiles (edge_sdk.answers.uncertainty), {name, sha256, bytes}, verified like the
    # weights in both layouts; None: the bundle has none (answers carry ood_score None)
    uncertainty: StoreEntry | None = None
    # (schema version 6) the training split's per-channel raw statistics
    # (edge_sdk.bundle.stats); None: no ``input_suspect`` (answers carry None)
    input_stats: InputStats | None = None
    # (schema version 7, layout store) width key -> activation tensor -> [scale, zero point]:
    # what the device's materialiser makes a width's integer (weights int8) slices with
    # (edge_sdk.tflite.integer); a files bundle's integer slices carry theirs inside
    activation_quant: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)

    @property
    def is_store(self) -> bool:
        """Whether the files are materialised from a weight store (layout ``store``)."""
        return self.layout == "store"

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def batch_resizable(self) -> bool:
        """Whether one invoke may run a batch: resize the input along :attr:`batch_dim`."""
        return self.batch_dim is not None

    def to_dict(self, expand: bool = False) -> dict[str, Any]:
        """Plain data in schema key order; no ``batch_dim`` in a version-1 manifest.

        Layout store: the ``slices`` table holds every virtual file once (sha256, bytes,
        recipe) and each configuration lists its files by name, without ``materialize`` and
        without the keys at their defaults (docs/store.md §5: the manifest's bytes count
        against the bundle). ``expand``: the first version-3 form instead (file entries and
        recipes in every configuration, no slices table); both read as the same Manifest."""
        out = super().to_dict()
        if self.schema_version < 5 or self.uncertainty is None:  # optional: absent = none
            del out["uncertainty"]
        if self.schema_version < 6 or self.input_stats is None:
            del out["input_stats"]
        if self.schema_version < 7 or not self.activation_quant:
            del out["activation_quant"]
        else:
            out["activation_quant"] = {wk: {t: [float(q[0]), int(q[1])] for t, q in per.items()}
                                       for wk, per in self.activation_quant.items()}
        if self.schema_version < 2:
            del out["batch_dim"]
        if self.schema_version < 3:
            for key in ("layout", "store", "graphs", "slices"):
                del out[key]
        elif not self.is_store:
            del out["store"], out["graphs"], out["slices"]
        elif expand:
            del out["slices"]
        else:
            # version 4 also leaves out what the reader derives (graphs by reference, the
            # configuration keys below); a version-3 manifest keeps the form version 3 wrote
            compact = self.schema_version >= 4
            if compact:
                out["graphs"] = _compact_graphs(out["graphs"])
            out["slices"] = {name: sl.to_dict(compact=True) for name, sl in self.slices.items()}
            for c in out["configurations"]:
                test = _compact_test(c["test"]) if compact else c["test"]
                if test is None:  # not expressible by name: this one in the first form
                    continue
                c["test"] = test
                if compact:
                    c["cascade"] = {t: {k: v for k, v in e.items()
                                        if k != "max_loss" or v != _CASCADE_MAX_LOSS}
                                    for t, e in c["cascade"].items()}
                c["files"] = [f["name"] for f in c["files"]]
                del c["materialize"]
                for key in _COMPACT_DEFAULTS:
                    if c[key] == _COMPACT_DEFAULTS[key]:
                        del c[key]
                if not compact:
                    continue
                # what the reader derives from the slices table (exactly: only when equal)
                derived = _derived(c, c["files"], self.slices, self.num_classes)
                for key in ("invokes", "output", *_NAMED_DEFAULTS):  # these from scope/samples
                    if c[key] == derived[key]:
                        del c[key]
                derived = _derived({}, c["files"], self.slices, self.num_classes)
                for key in ("width", "scope", "samples"):
                    if c[key] == derived[key]:
                        del c[key]
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

    def stored_entries(self) -> tuple[FileEntry, ...]:
        """The files the bundle directory holds: the store (layout store) or every listed
        file (layout files)."""
        extra = () if self.uncertainty is None else (self.uncertainty,)
        store = self.store  # (set exactly when the layout is store)
        return ((store,) if self.is_store and store is not None else self.file_entries()) + extra

    def recipe(self, config: Configuration, i: int) -> Recipe:
        """The recipe of file ``i`` of ``config`` (layout store); BundleError otherwise."""
        if config.materialize is None:
            raise BundleError(f"configuration {config.id!r} has no recipes (layout "
                              f"{self.layout!r}: its files are in the bundle directory)")
        return config.materialize[i]

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
        if out["input"].preprocess is not None and out["schema_version"] < 9:
            fail(join(path, "input.preprocess"), f"needs schema version 9 (a version-"
                 f"{out['schema_version']} bundle records no photo transform: its input comes "
                 "at its shape); set schema_version: 9 or remove it")

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

        version = out["schema_version"]
        layout = out["layout"] = choice(v["layout"], join(path, "layout"), BUNDLE_LAYOUTS)
        if version < 3:
            for key, empty in (("layout", "files"), ("store", None), ("graphs", {}),
                               ("slices", {})):
                if v[key] != empty:
                    fail(join(path, key), f"needs schema version 3 (a version-{version} bundle "
                                          "is a directory of .tflite files); set "
                                          f"schema_version: 3 or remove {key}")
        store = v["store"]
        if layout == "store":
            if store is None:
                fail(join(path, "store"), "missing: layout 'store' needs the weight store's "
                                          "{name, sha256, bytes}")
            store = _record(StoreEntry, store, join(path, "store"))
            graphs = _graphs(v["graphs"], join(path, "graphs"))
            if not graphs:
                fail(join(path, "graphs"), "expected one graph description per width "
                                           "(layout 'store'), got none")
        else:
            if store is not None:
                fail(join(path, "store"), "expected null for layout 'files' (a store needs "
                                          "layout: store)")
            if v["graphs"]:
                fail(join(path, "graphs"), "expected none for layout 'files' (graphs describe "
                                           "the slices materialised from a store)")
            if v["slices"]:
                fail(join(path, "slices"), "expected none for layout 'files' (slices are "
                                           "materialised from a store)")
            graphs = {}
        out["store"], out["graphs"] = store, graphs
        unc = v["uncertainty"]
        if unc is not None:
            if version < 5:
                fail(join(path, "uncertainty"), f"needs schema version 5 (a version-{version} "
                     "bundle has no uncertainty file); set schema_version: 5 or remove it")
            unc = _record(StoreEntry, unc, join(path, "uncertainty"))
            if store is not None and unc.name == store.name:
                fail(join(path, "uncertainty.name"), f"expected a file other than the store "
                                                     f"({store.name!r})")
        out["uncertainty"] = unc
        stats = v["input_stats"]
        if stats is not None:
            p = join(path, "input_stats")
            if version < 6:
                fail(p, f"needs schema version 6 (a version-{version} bundle has no input "
                        "statistics); set schema_version: 6 or remove it")
            stats = _record(InputStats, stats, p)
            if stats.channels != out["input"].channels:
                fail(join(p, "channels"), f"expected {out['input'].channels} (the input's "
                                          f"channels), got {stats.channels}")
        out["input_stats"] = stats
        out["activation_quant"] = parse_activation_quant(v["activation_quant"],
                                                    join(path, "activation_quant"), version)
        given = _slices(v["slices"], join(path, "slices"), graphs) if layout == "store" else {}

        p = join(path, "configurations")
        items, named = _resolve_names(list_value(v["configurations"], p, nonempty=True), p,
                                      layout, given, len(labels))
        configs = tuple(named_configuration(item, f"{p}[{i}]", named.get(i),
                                             join(path, "slices"))
                        for i, item in enumerate(items))
        ids: dict[str, int] = {}
        files: dict[str, tuple[FileEntry, str]] = {}
        folded: dict[str, str] = {}
        for i, config in enumerate(configs):
            cp = f"{p}[{i}]"
            if config.id in ids:
                fail(join(cp, "id"), f"duplicate configuration id {show(config.id)} (also "
                                     f"{p}[{ids[config.id]}])")
            ids[config.id] = i
            classes = config.output.shape[1]
            if classes != len(labels):
                fail(f"{cp}.output.shape[1]", f"expected {len(labels)} classes (one per "
                                              f"label), got {classes}")
            for j, entry in enumerate(config.files):
                fp = f"{cp}.files[{j}]"
                if entry.name in files:
                    other, where = files[entry.name]
                    if other != entry:
                        fail(fp, f"file {entry.name!r} is also listed by {where} with a "
                                 "different sha256 or size")
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
        for i, config in enumerate(configs):
            version_rules(config, version, f"{p}[{i}]")  # int8, targets, val_accuracy
            cp = f"{p}[{i}].materialize"
            if layout == "store" and config.materialize is None:
                fail(cp, "missing: layout 'store' needs one recipe per file")
            if layout != "store" and config.materialize is not None:
                fail(cp, "expected no recipes for layout 'files' (the files are in the bundle)")
            for j, r in enumerate(config.materialize or ()):
                if r.width not in graphs:
                    fail(f"{cp}[{j}].width", f"no graph for width {r.width!r} (graphs has "
                                             f"{', '.join(graphs) or 'none'})")
                if config.weights == "int8" and r.width not in out["activation_quant"]:
                    fail(f"{cp}[{j}].width", f"an integer slice of width {r.width!r} needs "
                         f"activation_quant[{r.width!r}] (the int8 activations' scales)")
        slices: dict[str, Slice] = {}
        if layout == "store":  # one virtual file name, one recipe
            recipe_of: dict[str, tuple[Recipe, str]] = {}
            for i, config in enumerate(configs):
                for j, (entry, r) in enumerate(zip(config.files, config.materialize or ())):
                    where = f"{p}[{i}].materialize[{j}]"
                    if entry.name in recipe_of and recipe_of[entry.name][0] != r:
                        fail(where, f"file {entry.name!r} has another recipe at "
                                    f"{recipe_of[entry.name][1]}")
                    recipe_of.setdefault(entry.name, (r, where))
                    sl = Slice(sha256=entry.sha256, bytes=entry.bytes, **r.to_dict())
                    if entry.name in given and given[entry.name] != sl:
                        fail(f"{p}[{i}].files[{j}]", f"file {entry.name!r} differs from "
                             f"slices[{show(entry.name)}] (sha256, bytes or recipe)")
                    slices.setdefault(entry.name, sl)
            unused = [name for name in given if name not in slices]
            if unused:
                fail(key_path(join(path, "slices"), unused[0]),
                     "not listed by any configuration")
        out["slices"] = slices
        by_id = {c.id: c for c in configs}
        for i, config in enumerate(configs):
            for target in config.cascade:
                wider = by_id.get(target)
                if wider is None or wider.scope != config.scope or wider.width <= config.width:
                    fail(f"{p}[{i}].cascade.{target}", "expected the id of a wider configuration "
                          f"of the same scope ({config.scope!r}, width > {config.width:g})")
        out["configurations"] = configs
        return out
