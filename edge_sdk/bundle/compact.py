"""The compact form of a layout-store manifest (docs/store.md §5):
a width's graph written as another's with its own tensor shapes and op options, the slices
table, configurations that list their files by slice name and leave out what the reader
derives from it, and a test block whose calibrated metrics list only what differs from raw.
The reader expands it (:func:`_graphs`, :func:`_resolve_names`); the writer makes it
(:func:`_compact_graphs`, :func:`_compact_test`, the defaults below).

stdlib only.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_sdk.bundle.records import (
    Slice,
    _file_name,
    _record,
    _width_key,
)
from edge_sdk.validation import (
    NodeBudget,
    fail,
    int_value,
    join,
    key_path,
    list_value,
    mapping,
    plain,
    show,
)


def _graphs(value: object, path: str) -> dict[str, dict[str, Any]]:
    """Width key -> a graph description (edge_sdk.tflite.graph.Graph.to_dict; checked in full when a
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
                                    "edge_sdk.tflite.graph.Graph.to_dict)")
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
#: value written here (the manifest's bytes count against the bundle)
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
