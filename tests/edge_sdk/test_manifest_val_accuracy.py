"""Schema version 10: a configuration's ``val_accuracy`` (the accuracy of its validation
predictions, which the device rules compare instead of the test accuracy). Optional: absent
(every bundle before version 10) reads as None and is not written back; a version-9 manifest
carrying it, and a value that is not an accuracy, are refused naming the key path.
Torch-free (the exporter's side: tests/exporters)."""
from __future__ import annotations

import copy
import math

import pytest
import yaml
from test_bundle import manifest_dict, write_raw
from test_manifest_slices import expanded

from edge_sdk import bundle as b
from edge_sdk.errors import BundleError
from edge_sdk.store.to_files import files_manifest
from edge_sdk.trust import schema as ms

ACCURACIES = (0.8, 0.9125, 1.0)


def with_val_accuracy(data: dict, values=ACCURACIES) -> dict:
    """``data`` with each configuration's val_accuracy right after its val_nll (the schema's
    key order), in place."""
    for c, v in zip(data["configurations"], values):
        items = list(c.items())
        at = list(c).index("val_nll") + 1
        c.clear()
        c.update(items[:at] + [("val_accuracy", v)] + items[at:])
    return data


def test_the_schema_version_is_10_and_every_older_one_still_reads():
    assert b.SCHEMA_VERSION == 10 and b.READABLE_VERSIONS == tuple(range(1, 11))


def test_a_version_10_manifest_records_it_and_writes_it_back():
    data = with_val_accuracy(manifest_dict())
    m = b.Manifest.from_dict(data)
    assert [c.val_accuracy for c in m.configurations] == list(ACCURACIES)
    assert m.to_dict() == data
    assert list(m.to_dict()["configurations"][0]).index("val_accuracy") == \
        list(data["configurations"][0]).index("val_nll") + 1
    text = b.manifest_to_yaml(m)
    assert b.Manifest.from_dict(yaml.safe_load(text)) == m
    assert ms.validate(data) == []
    props = ms.manifest_json_schema()["$defs"]["Configuration"]
    assert "val_accuracy" in props["properties"] and "val_accuracy" not in props["required"]


def test_a_version_10_manifest_may_leave_it_out():
    m = b.Manifest.from_dict(manifest_dict())
    assert m.schema_version == 10
    assert all(c.val_accuracy is None for c in m.configurations)
    assert all("val_accuracy" not in c for c in m.to_dict()["configurations"])
    data = manifest_dict()
    data["configurations"][0]["val_accuracy"] = None  # null: not recorded, as absent
    assert b.Manifest.from_dict(data) == m and ms.validate(data) == []


@pytest.mark.parametrize("version", b.READABLE_VERSIONS[:-1])
def test_an_older_manifest_loads_with_none_and_writes_back_as_it_was(version, tmp_path):
    data = manifest_dict()
    data["schema_version"] = version
    if version < 3:
        del data["layout"]
    if version < 2:
        del data["batch_dim"]
    m = b.read_manifest(write_raw(tmp_path / "old", data), verify=False)
    assert m.schema_version == version
    assert all(c.val_accuracy is None for c in m.configurations)
    assert m.to_dict() == data  # no val_accuracy key appears
    assert "val_accuracy" not in b.manifest_to_yaml(m)


def test_a_version_9_manifest_cannot_carry_it(tmp_path):
    data = with_val_accuracy(manifest_dict())
    data["schema_version"] = 9
    with pytest.raises(BundleError, match=r"^configurations\[0\]\.val_accuracy: needs schema "
                                          r"version 10 \(a version-9 bundle"):
        b.Manifest.from_dict(data)
    with pytest.raises(BundleError, match=r"configurations\[0\]\.val_accuracy: needs schema "
                                          r"version 10"):
        b.read_manifest(write_raw(tmp_path / "v9", data), verify=False)
    for c in data["configurations"]:
        del c["val_accuracy"]
    m = b.Manifest.from_dict(data)
    assert m.schema_version == 9
    # a record built in Python is held to the same rule
    c = b.Configuration.from_dict({**m.configurations[0].to_dict(), "val_accuracy": 0.5})
    assert c.val_accuracy == 0.5
    with pytest.raises(BundleError, match=r"configurations\[0\]\.val_accuracy: needs schema "
                                          r"version 10"):
        b.Manifest(schema_version=9, input=m.input, labels=m.labels, configurations=(c,))


BAD = {"1.5": (1.5, "expected a number <= 1"), "negative": (-0.1, "expected a number >= 0"),
       "a string": ("0.9", "expected a number"), "text": ("high", "expected a number"),
       "true": (True, "expected a number"), "nan": (math.nan, "expected a finite number"),
       "infinite": (math.inf, "expected a finite number"), "a list": ([0.9], "expected a number")}


@pytest.mark.parametrize("name", list(BAD))
def test_a_value_that_is_not_an_accuracy_is_refused_naming_its_path(name, tmp_path):
    value, message = BAD[name]
    data = with_val_accuracy(manifest_dict())
    data["configurations"][1]["val_accuracy"] = value
    with pytest.raises(BundleError, match=rf"^configurations\[1\]\.val_accuracy: {message}"):
        b.Manifest.from_dict(data)
    if name not in ("nan", "infinite"):  # (plain YAML / JSON numbers)
        assert ms.validate(data), f"the schema accepts {name}"
        with pytest.raises(BundleError, match=rf"configurations\[1\]\.val_accuracy: {message}"):
            b.read_manifest(write_raw(tmp_path / "bad", data), verify=False)


def test_a_store_manifest_keeps_it_in_the_compact_form_and_when_materialised():
    data = with_val_accuracy(expanded(), (0.5, 0.625, 0.75, None))
    data["configurations"][3].pop("val_accuracy")
    m = b.Manifest.from_dict(data)
    assert [c.val_accuracy for c in m.configurations] == [0.5, 0.625, 0.75, None]
    compact = m.to_dict()
    assert [c.get("val_accuracy") for c in compact["configurations"]] == [0.5, 0.625, 0.75,
                                                                          None]
    assert "val_accuracy" not in compact["configurations"][3]
    assert b.Manifest.from_dict(compact) == m
    assert b.Manifest.from_dict(yaml.safe_load(b.manifest_to_yaml(m))) == m
    assert b.Manifest.from_dict(m.to_dict(expand=True)) == m
    files = files_manifest(m)  # edge-sdk materialize's manifest
    assert files.layout == "files"
    assert [c.val_accuracy for c in files.configurations] == [0.5, 0.625, 0.75, None]
    bad = copy.deepcopy(compact)
    bad["configurations"][2]["val_accuracy"] = 2
    with pytest.raises(BundleError, match=r"^configurations\[2\]\.val_accuracy: expected a "
                                          r"number <= 1"):
        b.Manifest.from_dict(bad)


def test_the_device_rules_compare_it_and_fall_back_to_the_test_accuracy():
    from edge_sdk.policy.rules import accuracy

    m = b.Manifest.from_dict(with_val_accuracy(manifest_dict(), (0.8, None, 1.0)))
    assert [accuracy(c) for c in m.configurations] == [0.8, 0.9, 1.0]  # 0.9: test.raw
