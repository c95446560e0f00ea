"""edge_sdk.bundle.preprocess and the manifest's ``input.preprocess`` (schema version 9): the
record's checks with their key paths, the input spec's (crop = the input's H and W, uint8
only), the version gate, round trips, and the JSON schema agreeing with edge_sdk. No torch,
no Pillow."""
from __future__ import annotations

import copy

import pytest
import yaml

from edge_sdk import bundle as b
from edge_sdk.errors import BundleError, InputSpecError
from edge_sdk.trust import schema as ms
from test_bundle import files_for, manifest_dict

PRE = {"resize": 10, "crop": [8, 8], "interpolation": "bilinear", "exif": True}


def photo_manifest(version: int = b.SCHEMA_VERSION, **pre) -> dict:
    """test_bundle's manifest as a uint8 photo model (8 x 8 x 1) recording its transform."""
    data = manifest_dict()
    data["schema_version"] = version
    data["input"].update(dtype="uint8", value_range=[0.0, 255.0], mean=[78.0], std=[95.0],
                         preprocess={**PRE, **pre})
    return data


def test_the_record_and_its_defaults():
    p = b.Preprocess(resize=10, crop=[8, 8])
    assert p.crop == (8, 8) and p.interpolation == "bilinear" and p.exif is True
    assert p.to_dict() == PRE
    assert b.Preprocess.from_dict({"resize": 10, "crop": [8, 8]}) == p
    assert b.Preprocess.centre(128) == b.Preprocess(resize=146, crop=(128, 128))
    assert b.Preprocess.centre(224).resize == 256
    assert b.Preprocess.centre(32, 1.0).resize == 32


@pytest.mark.parametrize("change, where, message", [
    ({"resize": 7}, "input.preprocess.resize", "at least the crop's larger side 8, got 7"),
    ({"resize": 0}, "input.preprocess.resize", "expected an integer >= 1"),
    ({"crop": [8, 8, 3]}, "input.preprocess.crop", "expected a list of 2 items"),
    ({"crop": [0, 8]}, r"input.preprocess.crop\[0\]", "expected an integer >= 1"),
    ({"interpolation": "cubic"}, "input.preprocess.interpolation",
     "expected one of 'nearest', 'bilinear', 'bicubic'"),
    ({"exif": "yes"}, "input.preprocess.exif", "expected true or false"),
    ({"colour": "red"}, "input.preprocess", r"unknown key\(s\) 'colour'"),
], ids=["resize below crop", "resize 0", "crop of three", "crop 0", "unknown interpolation",
        "exif 'yes'", "unknown key"])
def test_a_bad_transform_names_its_key_path(change, where, message):
    with pytest.raises(BundleError, match=f"^{where}: .*{message}"):
        b.Manifest.from_dict(photo_manifest(**change))
    if "colour" not in change:  # built in Python: the same rules
        with pytest.raises(BundleError, match=f"^Preprocess.*{message}"):
            b.Preprocess(**{**PRE, **change})


def test_a_transform_that_misses_a_key_names_it():
    data = photo_manifest()
    del data["input"]["preprocess"]["crop"]
    with pytest.raises(BundleError, match=r"^input\.preprocess\.crop: missing required key"):
        b.Manifest.from_dict(data)


def test_the_crop_must_be_the_inputs_height_and_width():
    with pytest.raises(InputSpecError,
                       match=r"^input\.preprocess\.crop: expected the input's \[H, W\] \[8, 8\], "
                             r"got \[8, 6\]"):
        b.Manifest.from_dict(photo_manifest(crop=[8, 6]))


def test_a_transform_needs_uint8_input():
    data = photo_manifest()
    data["input"].update(dtype="float32")
    with pytest.raises(InputSpecError, match=r"^input\.preprocess: .*expected dtype uint8, got "
                                             r"float32"):
        b.Manifest.from_dict(data)


@pytest.mark.parametrize("version", range(1, 9))
def test_before_version_9_a_transform_is_refused(version):
    data = photo_manifest(version)
    if version < 2:
        del data["batch_dim"]
    with pytest.raises(BundleError, match=rf"^input\.preprocess: needs schema version 9 \(a "
                                          rf"version-{version} bundle .*\); set schema_version: "
                                          r"9 or remove it"):
        b.Manifest.from_dict(data)


def test_version_9_round_trips_through_yaml_and_a_written_bundle(tmp_path):
    data = photo_manifest()
    m = b.Manifest.from_dict(data)
    assert m.input.preprocess == b.Preprocess(**PRE)
    assert m.to_dict() == data
    text = b.manifest_to_yaml(m)
    assert text.startswith(f"# edge-sdk bundle manifest (schema version {b.SCHEMA_VERSION})")
    assert yaml.safe_load(text)["input"]["preprocess"] == PRE
    path = b.write_bundle(tmp_path / "photo", m, files_for(m))
    again = b.read_manifest(path)
    assert again == m and again.input.preprocess.crop == (8, 8)
    # the defaults may be left out; they read as written out
    short = photo_manifest()
    short["input"]["preprocess"] = {"resize": 10, "crop": [8, 8]}
    assert b.Manifest.from_dict(short) == m


@pytest.mark.parametrize("version", b.READABLE_VERSIONS)
def test_every_older_version_still_reads_and_writes_back_as_it_was(version):
    data = manifest_dict()
    data["schema_version"] = version
    if version < 3:
        del data["layout"]
    if version < 2:
        del data["batch_dim"]
    m = b.Manifest.from_dict(data)
    assert m.schema_version == version and m.input.preprocess is None
    assert m.to_dict() == data  # no preprocess key appears (nor any other)
    text = b.manifest_to_yaml(m)
    assert "preprocess" not in text
    assert list(yaml.safe_load(text)["input"]) == ["shape", "layout", "dtype", "value_range",
                                                   "mean", "std"]
    assert b.manifest_to_yaml(b.Manifest.from_dict(yaml.safe_load(text))) == text


def test_a_version_8_bundle_reads_and_is_rewritten_byte_for_byte(tmp_path):
    data = manifest_dict()
    data["schema_version"] = 8
    m = b.Manifest.from_dict(data)
    path = b.write_bundle(tmp_path / "v8", m, files_for(m))
    before = (path / b.MANIFEST_NAME).read_bytes()
    again = b.read_manifest(path)
    assert again == m and again.schema_version == 8
    assert b.manifest_to_yaml(again).encode("utf-8") == before


def test_the_json_schema_describes_the_transform():
    schema = ms.manifest_json_schema()
    pre = schema["$defs"]["Preprocess"]
    assert set(pre["properties"]) == {"resize", "crop", "interpolation", "exif"}
    assert pre["required"] == ["resize", "crop"]
    assert pre["properties"]["interpolation"]["enum"] == list(b.INTERPOLATIONS)
    assert "preprocess" not in schema["$defs"]["InputSpec"]["required"]
    assert ms.validate(photo_manifest()) == []


@pytest.mark.parametrize("change", [{"interpolation": "cubic"}, {"resize": 0},
                                    {"crop": [8, 8, 3]}, {"exif": "yes"}, {"colour": 1}],
                         ids=["interpolation", "resize 0", "crop of three", "exif", "extra key"])
def test_what_the_schema_refuses_in_a_transform_edge_sdk_refuses_too(change):
    data = copy.deepcopy(photo_manifest(**change))
    assert ms.validate(data), f"the schema accepts {change}"
    with pytest.raises(BundleError):
        b.Manifest.from_dict(data)
