"""A layout-store manifest's slices table (issue 21, docs/store.md §5): every virtual file once
(sha256, bytes, recipe), configurations listing their files by name and leaving default-valued
keys out; the first version-3 form (file entries + recipes in every configuration) reads as
the same Manifest; refusals name the dotted key path. Torch-free."""
from __future__ import annotations

import copy

import pytest
import yaml

from edge_sdk.bundle import Manifest, file_entry, manifest_to_yaml
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
    return {"schema_version": 3, "layout": "store",
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
    # the recipe of a named file is checked against the configuration listing it, and the
    # error names the table entry it came from
    (lambda d: d["slices"]["h-0.tflite"].update(heads=3),
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
    d["configurations"][0] = {**d["configurations"][0], "files": e["files"],
                              "materialize": e["materialize"]}
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
