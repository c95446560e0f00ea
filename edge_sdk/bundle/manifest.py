"""The manifest records: :class:`Configuration` (one runnable width/scope/samples) and
:class:`Manifest` (the whole ``manifest.yaml``), with the cross-field rules between them.

stdlib only.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_sdk.bundle.records import (
    BUNDLE_LAYOUTS,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    SCOPES,
    WEIGHT_ROUTES,
    FileEntry,
    InputSpec,
    OutputSpec,
    FILE_SUFFIX,
    Recipe,
    Slice,
    StoreEntry,
    _file_name,
    _Record,
    _record,
    _width_key,
)
from edge_sdk.bundle.stats import InputStats
from edge_sdk.errors import BundleError
from edge_sdk.validation import (
    NodeBudget,
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
    # wider configuration id -> {threshold, coverage, max_loss}: see the module docstring
    cascade: dict[str, dict[str, float | None]] = field(default_factory=dict)
    val_nll: float
    test: dict[str, dict[str, float]]
    latency_ms: float | None = None
    memory_mb: float | None = None
    # schema version 3, layout store: how each file is materialised from the weight store, one
    # recipe per file in file order (docs/store.md §5); None in a files-layout bundle
    materialize: tuple[Recipe, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data in schema key order; ``materialize`` only when set (store layout)."""
        out = super().to_dict()
        if self.materialize is None:
            del out["materialize"]
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
        # logits / temperature in float32 (5e-324 made NaN probabilities: issue 36)
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
        out["test"] = _test_metrics(v["test"], join(path, "test"))
        out["latency_ms"] = optional_float(v["latency_ms"], join(path, "latency_ms"), ge=0.0)
        out["memory_mb"] = optional_float(v["memory_mb"], join(path, "memory_mb"), ge=0.0)
        out["materialize"] = _recipes(v["materialize"], join(path, "materialize"), scope,
                                      samples, len(files))
        return out


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


def _graphs(value: object, path: str) -> dict[str, dict[str, Any]]:
    """Width key -> a graph description (edge_sdk.graph.Graph.to_dict; checked in full when a
    slice is materialised from it): plain data, one node budget for all of them. A width's
    entry may instead be ``{base: <width key>, shapes: [...], options: {out: {...}}}``: the
    graph of ``base`` (an entry written in full) with every tensor's shape replaced, in tensor
    order, and the options of the op whose first output is ``out`` replaced for each ``out``
    in ``options`` (optional; a RESHAPE's target shape) (:func:`_compact_graphs` writes it;
    docs/store.md §5)."""
    budget = NodeBudget()
    given = mapping(value, path)
    out: dict[str, dict[str, Any]] = {}
    for key, graph in given.items():
        p = key_path(path, key)
        _width_key(key, p)
        g = plain(mapping(graph, p), p, budget)
        if "base" in g:
            continue
        for part in ("tensors", "ops", "inputs", "outputs"):
            if not isinstance(g.get(part), list):
                fail(join(p, part), "missing or not a list (a graph description: "
                                    "edge_sdk.graph.Graph.to_dict)")
        out[str(key)] = g
    for key, graph in given.items():
        if "base" not in graph:
            continue
        p = key_path(path, key)
        if not {"base", "shapes"} <= set(graph) <= {"base", "shapes", "options"}:
            fail(p, f"expected keys base, shapes[, options] (a graph written as another "
                    f"width's with its own tensor shapes and op options), got "
                    f"{', '.join(map(str, graph))}")
        base = out.get(graph["base"]) if isinstance(graph["base"], str) else None
        if base is None:
            fail(join(p, "base"), f"expected the key of a graph written in full "
                                  f"({', '.join(out) or 'none'}), got {show(graph['base'])}")
        tensors = base["tensors"]
        shapes = list_value(graph["shapes"], join(p, "shapes"), length=len(tensors))
        rebuilt = []
        for i, (t, shape) in enumerate(zip(tensors, shapes)):
            sp = f"{join(p, 'shapes')}[{i}]"
            if not isinstance(t, dict):
                fail(f"{key_path(path, graph['base'])}.tensors[{i}]", "expected a mapping")
            rebuilt.append({**t, "shape": [int_value(x, f"{sp}[{j}]", minimum=-1)
                                          for j, x in enumerate(list_value(shape, sp))]})
            budget.spend(sp)
        ops = list(base["ops"])
        at = {o["outputs"][0]: i for i, o in enumerate(ops) if isinstance(o, dict)
              and isinstance(o.get("outputs"), list) and o["outputs"]
              and isinstance(o["outputs"][0], str)}
        op = join(p, "options")
        for out_name, options in mapping(graph.get("options", {}), op).items():
            ip = key_path(op, out_name)
            if out_name not in at:
                fail(ip, f"no op of graphs[{show(graph['base'])}] has the first output "
                         f"{show(out_name)}")
            i = at[out_name]
            ops[i] = {**ops[i], "options": mapping(options, ip)}
        out[str(key)] = {**base, "tensors": rebuilt, "ops": ops}
    return {str(key): out[str(key)] for key in given}


def _compact_graphs(graphs: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``graphs`` with each width whose graph is an earlier full one's but for its tensor
    shapes and op options written as ``{base, shapes[, options]}`` (the widths of a nested
    network differ only there: channel counts, a flatten's target shape)."""
    def same_but(a: Any, b: Any, key: str) -> bool:
        return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                and all(isinstance(x, dict) and isinstance(y, dict)
                        and {k: v for k, v in x.items() if k != key}
                        == {k: v for k, v in y.items() if k != key} for x, y in zip(a, b)))

    out: dict[str, dict[str, Any]] = {}
    full: dict[str, dict[str, Any]] = {}
    for key, g in graphs.items():
        for bkey, b in full.items():
            if ({k: v for k, v in g.items() if k not in ("tensors", "ops")}
                    == {k: v for k, v in b.items() if k not in ("tensors", "ops")}
                    and same_but(g["tensors"], b["tensors"], "shape")
                    and all("shape" in t for t in g["tensors"])
                    and same_but(g["ops"], b["ops"], "options")):
                ref: dict[str, Any] = {"base": bkey,
                                       "shapes": [t["shape"] for t in g["tensors"]]}
                options = {o["outputs"][0]: o.get("options", {})
                           for o, u in zip(g["ops"], b["ops"])
                           if o.get("options", {}) != u.get("options", {})}
                if len({o["outputs"][0] for o in g["ops"]}) != len(g["ops"]):
                    continue
                if options:
                    ref["options"] = options
                out[key] = ref
                break
        else:
            out[key] = full[key] = g
    return out


#: Configuration keys a layout-store manifest leaves out at their defaults (the reader fills
#: them in: they are the dataclass defaults)
_COMPACT_DEFAULTS: dict[str, Any] = {"unique_values": None, "weight_entropy_bits": None,
                                     "cascade": {}, "latency_ms": None, "memory_mb": None}

#: Keys a configuration listing its files by name (layout store) may leave out: the reader
#: derives them from the slices table and the labels (:func:`_derived`), or they are at the
#: value written here (issue 21: the manifest's bytes count against the bundle)
_NAMED_DEFAULTS: dict[str, Any] = {"temperature_folded": False, "weights": "dequantize"}
#: A named configuration's cascade entry without ``max_loss`` was planned with this one (the
#: exporter's default ``--cascade-max-loss``)
_CASCADE_MAX_LOSS = 0.002


def _derived(c: Mapping[str, Any], names: list[str], slices: Mapping[str, Slice],
             classes: int) -> dict[str, Any]:
    """What configuration ``c`` listing the slices ``names`` is unless it says otherwise:
    width, scope and samples from its first slice's recipe (heads: head scope with S = heads;
    a sample: all scope with S = the number of files; else point), then, from ``c``'s scope
    and samples (given or derived), invokes (S for all, else 1) and output ({kind: logits,
    shape: [S for head else 1, classes]}), plus :data:`_NAMED_DEFAULTS`. The writer leaves a
    key out only when it equals this, so the reader's filling it in is exact (docs/store.md
    §5)."""
    first = slices[names[0]]
    scope = "head" if first.heads else "point" if first.sample is None else "all"
    samples = first.heads if scope == "head" else len(names) if scope == "all" else 1
    scope, samples = c.get("scope", scope), c.get("samples", samples)
    return {"width": float(first.width), "scope": scope, "samples": samples,
            "invokes": samples if scope == "all" else 1,
            "output": {"kind": "logits", "shape": [samples if scope == "head" else 1, classes]},
            **_NAMED_DEFAULTS}


def _slices(value: object, path: str, graphs: Mapping[str, Any]) -> dict[str, Slice]:
    """The slices table: plain ``*.tflite`` names -> Slice, each recipe's width in graphs."""
    out: dict[str, Slice] = {}
    for key, item in mapping(value, path).items():
        p = key_path(path, key)
        name = _file_name(key, p)
        sl = _record(Slice, item, p)
        if sl.width not in graphs:
            fail(join(p, "width"), f"no graph for width {sl.width!r} (graphs has "
                                   f"{', '.join(graphs) or 'none'})")
        out[name] = sl
    return out


def _full_calibrated(raw: Mapping[str, Any], cal: Mapping[str, Any]) -> dict[str, Any]:
    """A named configuration's ``test.calibrated`` lists only the metrics that differ from
    ``test.raw`` (the accuracy never does: a temperature keeps every argmax): raw's value for
    each metric it leaves out, in raw's order, then its own others."""
    return {**{k: cal.get(k, v) for k, v in raw.items()},
            **{k: v for k, v in cal.items() if k not in raw}}


def _compact_test(test: dict[str, Any]) -> dict[str, Any] | None:
    """``test`` with ``calibrated`` cut to the metrics that differ from ``raw``, or None when
    that would not read back as ``test`` (calibrated lacks a metric raw has)."""
    raw, cal = test.get("raw"), test.get("calibrated")
    if not isinstance(raw, dict) or not isinstance(cal, dict):
        return test
    if not set(raw) <= set(cal):
        return None
    return {**test, "calibrated": {k: v for k, v in cal.items() if k not in raw or raw[k] != v}}


def _resolve_names(items: list[Any], path: str, layout: str, slices: Mapping[str, Slice],
                   classes: int) -> tuple[list[Any], dict[int, list[str]]]:
    """Configuration dicts whose files are slice names -> with file entries and recipes (the
    form Configuration parses) and the keys they left out filled in (:func:`_derived`), and
    per such configuration its names; anything else unchanged (Configuration reports it)."""
    out, named = [], {}
    for i, c in enumerate(items):
        files = c.get("files") if isinstance(c, Mapping) else None
        if not isinstance(files, list) or not any(isinstance(f, str) for f in files):
            out.append(c)
            continue
        cp = f"{path}[{i}]"
        if layout != "store":
            j = next(j for j, f in enumerate(files) if isinstance(f, str))
            fail(f"{cp}.files[{j}]", f"expected a file entry {{name, sha256, bytes}}, got the "
                                     f"name {show(files[j])} (a name refers to the slices "
                                     "table of a layout 'store' manifest)")
        if c.get("materialize") is not None:
            fail(f"{cp}.materialize", "expected none: files listed by name take their recipes "
                                      "from the slices table")
        entries, recipes = [], []
        for j, f in enumerate(files):
            if not isinstance(f, str):
                fail(f"{cp}.files[{j}]", "expected a slice name like the other files of this "
                                         f"configuration, got {show(f)}")
            if f not in slices:
                fail(f"{cp}.files[{j}]", f"no slice {show(f)} in slices (a file listed by "
                                         "name must be in the slices table)")
            entries.append(slices[f].entry(f))
            recipes.append(slices[f].recipe)
        filled = {k: v for k, v in _derived(c, files, slices, classes).items() if k not in c}
        test = c.get("test")
        if isinstance(test, Mapping) and isinstance(test.get("raw"), Mapping) \
                and isinstance(test.get("calibrated"), Mapping):
            filled["test"] = {**test, "calibrated": _full_calibrated(test["raw"],
                                                                     test["calibrated"])}
        cascade = c.get("cascade")
        if isinstance(cascade, Mapping):
            filled["cascade"] = {t: {**e, "max_loss": e.get("max_loss", _CASCADE_MAX_LOSS)}
                                 if isinstance(e, Mapping) else e for t, e in cascade.items()}
        out.append({**c, **filled, "files": entries, "materialize": recipes})
        named[i] = list(files)
    return out, named


def _named_configuration(item: object, path: str, names: list[str] | None,
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
    # (schema version 5, issue 33) ``uncertainty.bin``: out-of-distribution statistics and
    # conformal quantiles (edge_sdk.uncertainty), {name, sha256, bytes}, verified like the
    # weights in both layouts; None: the bundle has none (answers carry ood_score None)
    uncertainty: StoreEntry | None = None
    # (schema version 6, issue 34) the training split's per-channel raw statistics
    # (edge_sdk.bundle.stats); None: no ``input_suspect`` (answers carry None)
    input_stats: InputStats | None = None

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
        given = _slices(v["slices"], join(path, "slices"), graphs) if layout == "store" else {}

        p = join(path, "configurations")
        items, named = _resolve_names(list_value(v["configurations"], p, nonempty=True), p,
                                      layout, given, len(labels))
        configs = tuple(_named_configuration(item, f"{p}[{i}]", named.get(i),
                                             join(path, "slices"))
                        for i, item in enumerate(items))
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
        for i, config in enumerate(configs):
            cp = f"{p}[{i}].materialize"
            if layout == "store" and config.materialize is None:
                fail(cp, "missing: layout 'store' needs one recipe per file")
            if layout != "store" and config.materialize is not None:
                fail(cp, "expected no recipes for layout 'files' (the files are in the bundle)")
            for j, r in enumerate(config.materialize or ()):
                if r.width not in graphs:
                    fail(f"{cp}[{j}].width", f"no graph for width {r.width!r} (graphs has "
                                             f"{', '.join(graphs) or 'none'})")
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


