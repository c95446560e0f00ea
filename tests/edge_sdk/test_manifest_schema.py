"""docs/manifest.schema.json is generated from the bundle dataclasses (edge_sdk.trust.schema),
the committed copy is current, a manifest the exporter wrote validates against it, and what it
constrains is what edge_sdk.bundle refuses. No torch (the bundle fixture reuses a bundle when
one is provided)."""
from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from edge_sdk import bundle as b
from edge_sdk.trust import schema as ms
from edge_sdk.errors import BundleError
from test_bundle import manifest_dict

# the committed copy, found from the checkout: in the tflite-runtime CI venv edge_sdk itself is
# imported from the installed wheel
COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "manifest.schema.json"


def test_the_committed_schema_is_the_generated_one():
    assert COMMITTED.is_file(), "write it: python -m edge_sdk.trust.schema"
    assert COMMITTED.read_text() == ms.schema_text(), \
        "docs/manifest.schema.json is stale: python -m edge_sdk.trust.schema"


def test_the_check_command_agrees(tmp_path):
    check = [sys.executable, "-m", "edge_sdk.trust.schema", "--check", "--out"]
    r = subprocess.run([*check, str(COMMITTED)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "up to date" in r.stdout
    stale = tmp_path / "stale.json"
    stale.write_text(COMMITTED.read_text().replace("NHWC", "NCHW"))
    r = subprocess.run([*check, str(stale)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "stale" in r.stderr
    assert "NCHW" in stale.read_text()  # --check writes nothing


def test_in_a_checkout_it_writes_the_committed_file_by_default():
    if not (COMMITTED.parents[1] / "edge_sdk" / "trust" / "schema.py").samefile(ms.__file__):
        pytest.skip("edge_sdk is the installed wheel here")
    assert ms.SCHEMA_PATH == COMMITTED


def test_an_exported_manifest_validates(bundle):
    data = yaml.safe_load((bundle / b.MANIFEST_NAME).read_text())
    assert ms.validate(data) == []
    # and it holds every key the schema lists for a configuration, so nothing is stale there
    props = ms.manifest_json_schema()["$defs"]["Configuration"]["properties"]
    # (the session bundle is a files-layout bundle: recipes are a store bundle's)
    assert data["layout"] == "files"
    assert set(data["configurations"][0]) == set(props) - {"materialize"}


def test_a_hand_made_manifest_validates_and_defaults_may_be_left_out():
    data = manifest_dict()
    assert ms.validate(data) == []
    del data["input"]["layout"], data["source"]
    for c in data["configurations"]:
        del c["cascade"], c["latency_ms"], c["unique_values"]
    b.Manifest.from_dict(data)  # edge_sdk agrees: these have defaults
    assert ms.validate(data) == []


def _set(path: str, value: Any):
    def mutate(d: dict) -> None:
        *parents, last = path.split("/")
        for p in parents:
            d = d[int(p)] if isinstance(d, list) else d[p]
        if value is _DELETE:
            del d[last]
        elif isinstance(d, list):
            d[int(last)] = value
        else:
            d[last] = value
    return mutate


_DELETE = object()
C0 = "configurations/0"
BROKEN = {
    "an unknown schema version": _set("schema_version", b.SCHEMA_VERSION + 1),
    "no schema version": _set("schema_version", _DELETE),
    "unknown top-level key": _set("extra", 1),
    "no labels": _set("labels", []),
    "duplicate labels": _set("labels", ["cat", "cat", "dog"]),
    "empty label": _set("labels/0", ""),
    "no configurations": _set("configurations", []),
    "batch 2": _set("input/shape/0", 2),
    "3-d shape": _set("input/shape", [1, 8, 8]),
    "NCHW": _set("input/layout", "NCHW"),
    "float64 input": _set("input/dtype", "float64"),
    "std 0": _set("input/std/0", 0.0),
    "range of three": _set("input/value_range", [0.0, 8.0, 16.0]),
    "unknown scope": _set(f"{C0}/scope", "middle"),
    "unknown weights": _set(f"{C0}/weights", "int4"),
    "width 0": _set(f"{C0}/width", 0.0),
    "width 1.5": _set(f"{C0}/width", 1.5),
    "samples 0": _set(f"{C0}/samples", 0),
    "temperature 0": _set(f"{C0}/temperature", 0.0),
    "negative macs": _set(f"{C0}/macs", -1),
    "macs true": _set(f"{C0}/macs", True),
    "macs 1.5": _set(f"{C0}/macs", 1.5),
    "folded 'no'": _set(f"{C0}/temperature_folded", "no"),
    "missing val_nll": _set(f"{C0}/val_nll", _DELETE),
    "val_accuracy 1.5": _set(f"{C0}/val_accuracy", 1.5),
    "val_accuracy as text": _set(f"{C0}/val_accuracy", "high"),
    "unknown configuration key": _set(f"{C0}/colour", "red"),
    "threshold key 'high'": _set(f"{C0}/thresholds", {"high": 0.5}),
    "threshold key '0'": _set(f"{C0}/thresholds", {"0": 0.5}),
    "threshold 1.5": _set(f"{C0}/thresholds", {"0.95": 1.5}),
    "cascade entry without coverage": _set(
        "configurations/1/cascade", {"w0.50-all3": {"threshold": 0.9, "max_loss": 0.0}}),
    "negative latency": _set(f"{C0}/latency_ms", -1.0),
    "memory as text": _set(f"{C0}/memory_mb", "big"),
    "upper-case sha256": _set(f"{C0}/files/0/sha256", "AB" * 32),
    "path in a file name": _set(f"{C0}/files/0/name", "../x.tflite"),
    "hidden file name": _set(f"{C0}/files/0/name", ".x.tflite"),
    "not a .tflite": _set(f"{C0}/files/0/name", "x.onnx"),
    "empty file": _set(f"{C0}/files/0/bytes", 0),
    "unknown output kind": _set(f"{C0}/output/kind", "probs"),
    "output shape of three": _set(f"{C0}/output/shape", [1, 3, 1]),
    "test metric as text": _set(f"{C0}/test/raw/accuracy", "high"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_what_the_schema_refuses_edge_sdk_refuses_too(name):
    data = copy.deepcopy(manifest_dict())
    BROKEN[name](data)
    assert ms.validate(data), f"the schema accepts {name}"
    with pytest.raises(BundleError):
        b.Manifest.from_dict(data)


def test_problems_name_the_key_path():
    data = manifest_dict()
    data["configurations"][2]["scope"] = "middle"
    (problem,) = ms.validate(data)
    assert problem.startswith("manifest.configurations[2].scope: expected one of")


def test_the_schema_follows_the_dataclasses(monkeypatch):
    """Fields, types, required and defaults come from the annotations, not from a copy."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Probe:
        """A probe record.

        Only the first paragraph becomes the description."""

        count: int
        ratio: float | None = None
        names: tuple[str, ...] = ()
        pair: tuple[float, float]
        table: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
        free: dict[str, Any]
        hidden: str = dataclasses.field(default="x", metadata={"manifest": False})

    s = ms._record_schema(Probe)
    assert s["description"] == "A probe record."
    assert s["required"] == ["count", "pair", "free"]
    assert s["properties"] == {
        "count": {"type": "integer"},
        "ratio": {"type": ["number", "null"], "default": None},
        "names": {"type": "array", "items": {"type": "string"}, "default": []},
        "pair": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
        "table": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": {"type": "number"}}, "default": {}},
        "free": {"type": "object"},
    }
    # every manifest field is in the schema, and nothing else
    schema = ms.manifest_json_schema()
    for cls in ms.RECORDS:
        want = {f.name for f in dataclasses.fields(cls) if f.metadata.get("manifest", True)}
        got = schema if cls is b.Manifest else schema["$defs"][cls.__name__]
        assert set(got["properties"]) == want, cls.__name__


def test_constraints_may_only_name_real_fields(monkeypatch):
    monkeypatch.setitem(ms.CONSTRAINTS, "Configuration.colour", {"minLength": 1})
    with pytest.raises(KeyError, match="Configuration.colour"):
        ms.manifest_json_schema()


def test_the_validator_refuses_keywords_it_does_not_implement():
    with pytest.raises(ValueError, match="oneOf"):
        ms.validate(1, {"oneOf": [{"type": "integer"}]})


def test_the_file_is_plain_json_with_the_draft_named():
    data = json.loads(COMMITTED.read_text())
    assert data["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert data["properties"]["schema_version"]["const"] == b.SCHEMA_VERSION
