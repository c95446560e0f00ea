"""A layout-store manifest's slices table (issue 21, docs/store.md §5): every virtual file once
(sha256, bytes, recipe), configurations listing their files by name and leaving default-valued
keys out; the first version-3 form (file entries + recipes in every configuration) reads as
the same Manifest; refusals name the dotted key path. Torch-free."""
from __future__ import annotations

import copy

import pytest
import yaml

from edge_sdk.bundle import SCHEMA_VERSION, Manifest, file_entry, manifest_to_yaml
from edge_sdk.errors import BundleError

GRAPH = {"tensors": [], "ops": [], "inputs": [], "outputs": []}


def _cfg(cid, scope, samples, recipes, names=None):
    names = names or [f"{cid}-{i}.tflite" for i in range(len(recipes))]
    return {"id": cid, "width": float(recipes[0]["width"]), "scope": scope, "samples": samples,
            "files": [file_entry(n, n.encode() * 3).to_dict() for n in names],
            "invokes": len(recipes) if scope == "all" else 1,
            "output": {"kind": "logits", "shape": [samples if scope == "head" else 1, 3]},
            "temperature": 1.0, "temperature_folded": False, "weights": "dequantize",
            "macs": 1, "params": 1, "thresholds": {"0.9": 0.5}, "val_nll": 0.1,
            "test": {"raw": {"accuracy": 0.9}}, "materialize": recipes}


def expanded() -> dict:
    """The first version-3 store form: entries and recipes in every configuration; all1 and
    all2 share their first sample file."""
    s = [{"width": "1.00", "sample": i, "heads": 0} for i in range(2)]
    return {"schema_version": SCHEMA_VERSION, "layout": "store",
            "store": file_entry("store.bin", b"store").to_dict(),
            "input": {"shape": [1, 4, 4, 2], "layout": "NHWC", "dtype": "float32",
                      "value_range": [0.0, 1.0], "mean": [0.0, 0.0], "std": [1.0, 1.0]},
            "labels": ["a", "b", "c"], "batch_dim": 0,
            "graphs": {"0.50": GRAPH, "1.00": GRAPH},
            "configurations": [
                _cfg("p", "point", 1, [{"width": "0.50", "sample": None, "heads": 0}]),
                _cfg("h", "head", 2, [{"width": "1.00", "sample": None, "heads": 2}]),
                _cfg("a1", "all", 1, s[:1], ["s0.tflite"]),
                _cfg("a2", "all", 2, s, ["s0.tflite", "s1.tflite"])]}


def compact() -> dict:
    return Manifest.from_dict(expanded()).to_dict()


def test_the_slices_table_round_trips_and_reads_as_the_first_form():
    m = Manifest.from_dict(expanded())
    d = m.to_dict()
    assert list(d["slices"]) == ["p-0.tflite", "h-0.tflite", "s0.tflite", "s1.tflite"]
    assert d["slices"]["s1.tflite"] == {"sha256": m.configurations[3].files[1].sha256,
                                        "bytes": 27, "width": "1.00", "sample": 1}
    assert d["slices"]["h-0.tflite"]["heads"] == 2 and "sample" not in d["slices"]["h-0.tflite"]
    c = d["configurations"][3]
    assert c["files"] == ["s0.tflite", "s1.tflite"]
    for key in ("materialize", "unique_values", "weight_entropy_bits", "cascade", "latency_ms",
                "memory_mb"):
        assert key not in c
    back = Manifest.from_dict(d)
    assert back == m
    # the runtime's view is unchanged: entries and recipes resolved at parse time
    assert back.configurations[3].files == m.configurations[3].files
    assert back.configurations[3].materialize == m.configurations[3].materialize
    assert back.recipe(back.configurations[2], 0).sample == 0
    assert [e.name for e in back.file_entries()] == list(d["slices"])
    text = manifest_to_yaml(m)
    assert Manifest.from_dict(yaml.safe_load(text)) == m
    assert "materialize" not in text and text.count("sha256") == 5  # 4 slices + the store
    # expand=True writes the first form again
    assert Manifest.from_dict(m.to_dict(expand=True)) == m
    assert "slices" not in m.to_dict(expand=True)
    assert len(yaml.safe_dump(d)) < len(yaml.safe_dump(m.to_dict(expand=True)))


def _graph(width: int) -> dict:
    """A two-op graph whose shapes and flatten target depend on the width (as a nested
    network's do)."""
    return {"version": 1, "inputs": ["input"], "outputs": ["logits"],
            "tensors": [{"name": "input", "shape": [1, 4, 4, 2]},
                        {"name": "flatten", "shape": [1, 8 * width]},
                        {"name": "fc/weight", "shape": [3, 8 * width], "weight": "fc/weight"},
                        {"name": "logits", "shape": [1, 3]}],
            "ops": [{"op": "RESHAPE", "inputs": ["input"], "outputs": ["flatten"],
                     "options": {"shape": [-1, 8 * width]}},
                    {"op": "FULLY_CONNECTED", "inputs": ["flatten", "fc/weight"],
                     "outputs": ["logits"]}]}


def rich() -> dict:
    """expanded() with real per-width graphs, calibrated test metrics, cascades (one at the
    exporter's default max_loss, one not) and a hybrid configuration."""
    d = expanded()
    d["graphs"] = {"0.50": _graph(1), "1.00": _graph(2)}
    for c in d["configurations"]:
        c["test"] = {"raw": {"accuracy": 0.9, "nll": 0.4, "mutual_info": 0.0},
                     "calibrated": {"accuracy": 0.9, "nll": 0.3, "mutual_info": 0.0}}
    d["configurations"].append(_cfg("p2", "point", 1, [{"width": "1.00", "sample": None,
                                                        "heads": 0}]))
    d["configurations"][0]["cascade"] = {"p2": {"threshold": 0.8, "coverage": 0.5,
                                                "max_loss": 0.002}}
    d["configurations"][0]["weights"] = "hybrid"
    d["configurations"][2]["cascade"] = {}
    d["configurations"][1]["cascade"] = {}
    d["configurations"][3]["cascade"] = {}
    d["configurations"][4]["cascade"] = {}
    return d


def test_derivable_keys_are_left_out_and_read_back_exactly():
    """A named configuration leaves out what the slices table and the labels say (width,
    scope, samples, invokes, output), temperature_folded false, weights dequantize, the
    calibrated metrics equal to the raw ones and a cascade's default max_loss; a width's graph
    is written as another's with its own shapes; all of it reads back as the same Manifest,
    as does the previous writer's form (every key written) and the first form."""
    m = Manifest.from_dict(rich())
    d = m.to_dict()
    c0, c3 = d["configurations"][0], d["configurations"][3]
    for key in ("width", "scope", "samples", "invokes", "output", "temperature_folded"):
        assert key not in c0 and key not in c3
    assert c0["weights"] == "hybrid" and "weights" not in c3  # only the default is left out
    assert c3["test"] == {"raw": {"accuracy": 0.9, "nll": 0.4, "mutual_info": 0.0},
                          "calibrated": {"nll": 0.3}}
    assert c0["cascade"] == {"p2": {"threshold": 0.8, "coverage": 0.5}}
    assert d["graphs"]["1.00"] == {"base": "0.50",
                                   "shapes": [[1, 4, 4, 2], [1, 16], [3, 16], [1, 3]],
                                   "options": {"flatten": {"shape": [-1, 16]}}}
    back = Manifest.from_dict(d)
    assert back == m and back.graphs == m.graphs == {"0.50": _graph(1), "1.00": _graph(2)}
    assert back.configurations[3].invokes == 2 and back.configurations[1].output.shape == (2, 3)
    assert back.configurations[0].cascade["p2"]["max_loss"] == 0.002
    assert Manifest.from_dict(yaml.safe_load(manifest_to_yaml(m))) == m
    # the previous writer: every key in every named configuration, graphs in full
    old = copy.deepcopy(d)
    old["graphs"] = {"0.50": _graph(1), "1.00": _graph(2)}
    for c, full in zip(old["configurations"], m.to_dict(expand=True)["configurations"]):
        c.update({k: v for k, v in full.items() if k not in ("files", "materialize")})
    assert Manifest.from_dict(old) == m
    assert len(yaml.safe_dump(d)) < len(yaml.safe_dump(old))
    assert Manifest.from_dict(m.to_dict(expand=True)) == m


def test_a_version_3_manifest_keeps_the_form_version_3_wrote():
    """Version 4 is what lets a store manifest leave keys out: a version-3 manifest (read from
    an older bundle) writes every derived key and its graphs in full, so an edge_sdk that
    reads only 1..3 can still read it; the compact form is refused by such a reader's version
    check, never by a missing key."""
    d = rich()
    d["schema_version"] = 3
    m = Manifest.from_dict(d)
    out = m.to_dict()
    assert out["schema_version"] == 3
    for c in out["configurations"]:
        assert isinstance(c["files"][0], str) and "materialize" not in c  # the slices table
        for key in ("width", "scope", "samples", "invokes", "output", "temperature_folded",
                    "weights"):
            assert key in c
    assert all("tensors" in g for g in out["graphs"].values())
    assert out["configurations"][0]["cascade"]["p2"]["max_loss"] == 0.002
    assert Manifest.from_dict(out) == m
    assert len(yaml.safe_dump(Manifest.from_dict(rich()).to_dict())) < len(yaml.safe_dump(out))


def test_what_the_compact_form_cannot_say_is_written_out():
    """A calibrated group without a raw metric, a cascade's other max_loss, explicit values
    that differ from the derived ones and graphs that differ in more than shapes and options
    are written as they are (here: the configuration in the first form) and read back."""
    d = rich()
    del d["configurations"][3]["test"]["calibrated"]["mutual_info"]
    d["configurations"][0]["cascade"]["p2"]["max_loss"] = 0.01
    d["configurations"][0]["temperature_folded"] = True
    d["graphs"]["1.00"]["ops"][1]["inputs"] = ["input", "fc/weight"]
    m = Manifest.from_dict(d)
    out = m.to_dict()
    assert isinstance(out["configurations"][3]["files"][0], dict)  # the first form
    assert out["configurations"][3]["test"] == d["configurations"][3]["test"]
    assert out["configurations"][0]["cascade"]["p2"]["max_loss"] == 0.01
    assert out["configurations"][0]["temperature_folded"] is True
    assert "tensors" in out["graphs"]["1.00"]
    assert Manifest.from_dict(out) == m
    assert Manifest.from_dict(yaml.safe_load(manifest_to_yaml(m))) == m


def test_the_compact_form_validates_against_the_json_schema():
    import edge_sdk.trust.schema as ms

    assert ms.validate(Manifest.from_dict(rich()).to_dict()) == []
    assert ms.validate(compact()) == []


@pytest.mark.parametrize("graph, where", [
    ({"base": "0.75", "shapes": []}, r"^graphs\['1\.00'\]\.base: expected the key of a graph "
                                     r"written in full \(0\.50\)"),
    ({"base": "0.50", "shapes": [[1]]}, r"^graphs\['1\.00'\]\.shapes: expected a list of 4"),
    ({"base": "0.50", "shapes": [[1, 4, 4, 2], [1, 16], [3, 16], [1, "x"]]},
     r"^graphs\['1\.00'\]\.shapes\[3\]\[1\]: expected an integer"),
    ({"base": "0.50", "shapes": [[1, 4, 4, 2], [1, 16], [3, 16], [1, 3]],
      "options": {"nope": {}}}, r"^graphs\['1\.00'\]\.options\.nope: no op"),
    ({"base": "0.50", "shapes": [], "colour": 1}, r"^graphs\['1\.00'\]: expected keys base"),
])
def test_a_graph_by_reference_is_checked(graph, where):
    d = Manifest.from_dict(rich()).to_dict()
    d["graphs"]["1.00"] = graph
    with pytest.raises(BundleError, match=where):
        Manifest.from_dict(d)


def test_a_files_manifest_writes_no_slices_table():
    d = expanded()
    d.update(layout="files", store=None, graphs={})
    for c in d["configurations"]:
        del c["materialize"]
    m = Manifest.from_dict(d)
    assert m.slices == {} and "slices" not in m.to_dict()
    assert isinstance(m.to_dict()["configurations"][0]["files"][0], dict)


def _mutated(fn) -> dict:
    d = compact()
    fn(d)
    return d


def _set_files(i, files):
    def f(d):
        d["configurations"][i]["files"] = files
    return f


@pytest.mark.parametrize("mutate, where", [
    (_set_files(3, ["s0.tflite", "zz.tflite"]),
     r"^configurations\[3\]\.files\[1\]: no slice 'zz\.tflite' in slices"),
    (lambda d: d["configurations"][0].update(
        materialize=[{"width": "0.50", "sample": None, "heads": 0}]),
     r"^configurations\[0\]\.materialize: expected none"),
    (lambda d: d["slices"]["p-0.tflite"].update(width="0.75"),
     r"^slices\['p-0\.tflite'\]\.width: no graph for width '0\.75'"),
    (lambda d: d["slices"]["s0.tflite"].update(sha256="xyz"),
     r"^slices\['s0\.tflite'\]\.sha256: expected 64 hex"),
    (lambda d: d["slices"]["s0.tflite"].update(bytes=0),
     r"^slices\['s0\.tflite'\]\.bytes"),
    (lambda d: d["slices"]["s0.tflite"].update(color="red"),
     r"^slices\['s0\.tflite'\]: unknown key"),
    (lambda d: d["slices"].update({"extra.tflite": dict(d["slices"]["s0.tflite"])}),
     r"^slices\['extra\.tflite'\]: not listed by any configuration"),
    (lambda d: d["slices"].update({"x.bin": dict(d["slices"]["s0.tflite"])}),
     r"^slices\['x\.bin'\]: expected a plain file name ending in '\.tflite'"),
    (lambda d: d["slices"].update({"../x.tflite": dict(d["slices"]["s0.tflite"])}),
     r"^slices\['\.\./x\.tflite'\]: expected a plain file name"),
    # the recipe of a named file is checked against the configuration listing it (here one
    # that writes its samples: left out, they are the table's), and the error names the table
    # entry it came from
    (lambda d: (d["slices"]["h-0.tflite"].update(heads=3),
                d["configurations"][1].update(samples=2)),
     r"^slices\['h-0\.tflite'\]\.heads: expected 2 \(scope 'head', samples=2\), got 3 "
     r"\(listed by configurations\[1\]\.files\[0\]\)"),
    (lambda d: d["slices"]["s1.tflite"].update(sample=0),
     r"^slices\['s1\.tflite'\]\.sample: duplicate sample 0"),
    (lambda d: d["slices"]["s1.tflite"].pop("sample"),
     r"^slices\['s1\.tflite'\]\.sample: expected a sample index for scope 'all'"),
    (_set_files(2, [compact()["configurations"][0]["files"][0], "s0.tflite"][1:] + [
        {"name": "s9.tflite", "sha256": "0" * 64, "bytes": 1}]),
     r"^configurations\[2\]\.files\[1\]: expected a slice name like the other files"),
    (lambda d: d.update(slices={}),
     r"^configurations\[0\]\.files\[0\]: no slice 'p-0\.tflite' in slices"),
])
def test_slices_table_refusals_name_the_dotted_path(mutate, where):
    with pytest.raises(BundleError, match=where):
        Manifest.from_dict(_mutated(mutate))


def test_a_first_form_entry_must_agree_with_the_slices_table():
    d = compact()
    e = expanded()["configurations"][0]
    e["files"][0]["bytes"] += 1
    d["configurations"][0] = e  # a first-form configuration writes every key
    with pytest.raises(BundleError, match=r"^configurations\[0\]\.files\[0\]: file "
                                          r"'p-0\.tflite' differs from slices"):
        Manifest.from_dict(d)


def test_names_and_slices_need_a_store_layout_and_version_3():
    d = expanded()
    d.update(layout="files", store=None, graphs={})
    for c in d["configurations"]:
        del c["materialize"]
    named = copy.deepcopy(d)
    named["configurations"][0]["files"] = ["p-0.tflite"]
    with pytest.raises(BundleError, match=r"^configurations\[0\]\.files\[0\]: expected a file "
                                          r"entry \{name, sha256, bytes\}, got the name"):
        Manifest.from_dict(named)
    table = dict(d, slices=compact()["slices"])
    with pytest.raises(BundleError, match=r"^slices: expected none for layout 'files'"):
        Manifest.from_dict(table)
    with pytest.raises(BundleError, match=r"^slices: needs schema version 3"):
        Manifest.from_dict(dict(table, schema_version=2, layout="files"))


def test_a_version_1_store_index_is_refused_naming_both_versions():
    """Store index version 1 (every sample's fold in `fold`, before `sfold`) is refused with
    a BundleError naming both versions, not misread."""
    import store_support as ss
    from edge_sdk.store import Store
    from edge_sdk.store.materialize import STORE_INDEX_VERSION, materialize

    index, arrays = ss.store_arrays()
    assert STORE_INDEX_VERSION == 3  # 2 and 3 read
    old = Store(dict(index, version=1), arrays)
    wk = next(iter(index["widths"]))
    g = ss.graph(index["widths"][wk]["layers"]["conv1"]["out"]).to_dict()
    with pytest.raises(BundleError, match=r"index version 1 \(version 1: every sample's fold "
                                          r"in `fold`.*is not one this edge_sdk reads "
                                          r"\(2, 3; it writes 3\): re-export"):
        materialize(old, g, wk)
    assert materialize(Store(index, arrays), g, wk)[4:8] == b"TFL3"  # version 2 builds
