"""edge_sdk.bundle: manifest schema, verified reading, atomic writing. Must not import torch."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_sdk import bundle as b
from edge_sdk.errors import BundleError

LABELS = ["cat", "dog", "bird"]


def blob(tag: str, size: int = 96) -> bytes:
    """Distinct fake .tflite contents per tag."""
    return (hashlib.sha256(tag.encode()).digest() * (size // 32 + 1))[:size]


def config_dict(
    cid: str,
    scope: str,
    samples: int,
    names: list[str],
    *,
    classes: int = len(LABELS),
    width: float = 0.5,
) -> dict[str, Any]:
    return {
        "id": cid,
        "width": width,
        "scope": scope,
        "samples": samples,
        "files": [b.file_entry(n, blob(n)).to_dict() for n in names],
        "invokes": samples if scope == "all" else 1,
        "output": {"kind": "logits", "shape": [samples if scope == "head" else 1, classes]},
        "temperature": 1.25,
        "temperature_folded": False,
        "weights": "dequantize",
        "macs": 12345,
        "params": 678,
        "unique_values": 15,
        "weight_entropy_bits": 2.5,
        "thresholds": {"0.9": 0.55, "0.95": 0.8, "0.99": None},
        "cascade": {},
        "val_nll": 0.31,
        "test": {
            "raw": {"accuracy": 0.9, "nll": 0.35, "ece": 0.04, "brier": 0.15, "ood_auroc": 0.8},
            "calibrated": {"accuracy": 0.9, "nll": 0.3, "ece": 0.02, "brier": 0.14},
        },
        "latency_ms": None,
        "memory_mb": 1.5,
    }


def manifest_dict() -> dict[str, Any]:
    return {
        "schema_version": b.SCHEMA_VERSION,
        "input": {
            "shape": [1, 8, 8, 1],
            "layout": "NHWC",
            "dtype": "float32",
            "value_range": [0.0, 16.0],
            "mean": [4.9],
            "std": [6.0],
        },
        "labels": list(LABELS),
        "source": {"checkpoint": {"name": "digits.pt", "sha256": "ab" * 32}, "quantizer": "pwfn"},
        "batch_dim": 0,
        "layout": "files",
        "configurations": [
            config_dict("w0.50-point", "point", 1, ["w050_point.tflite"]),
            config_dict("w0.50-head4", "head", 4, ["w050_head4.tflite"]),
            config_dict("w0.50-all3", "all", 3, [f"w050_s{i}.tflite" for i in range(3)]),
        ],
    }


def files_for(manifest: b.Manifest) -> dict[str, bytes]:
    return {e.name: blob(e.name) for e in manifest.file_entries()}


@pytest.fixture
def manifest() -> b.Manifest:
    return b.Manifest.from_dict(manifest_dict())


@pytest.fixture
def written(tmp_path: Path, manifest: b.Manifest) -> Path:
    return b.write_bundle(tmp_path / "bundle", manifest, files_for(manifest))


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def write_manifest_text(directory: Path, text: str) -> Path:
    directory.mkdir(exist_ok=True)
    (directory / b.MANIFEST_NAME).write_text(text, encoding="utf-8")
    return directory


def write_raw(directory: Path, data: dict[str, Any]) -> Path:
    return write_manifest_text(directory, yaml.safe_dump(data, sort_keys=False))


# --------------------------------------------------------------------------- round trip


def test_round_trip_write_read(tmp_path: Path, manifest: b.Manifest) -> None:
    files = files_for(manifest)
    path = b.write_bundle(tmp_path / "out" / "bundle", manifest, files)
    assert path == tmp_path / "out" / "bundle"
    assert sorted(p.name for p in path.iterdir()) == sorted([b.MANIFEST_NAME, *files])
    for name, data in files.items():
        assert (path / name).read_bytes() == data
    again = b.read_manifest(path)
    assert again == manifest
    assert again.to_dict() == manifest_dict()
    # Only the bundle itself in the parent: no temp dirs left behind.
    assert [p.name for p in path.parent.iterdir()] == ["bundle"]


def test_dict_round_trip_normalises_types(manifest: b.Manifest) -> None:
    assert isinstance(manifest.labels, tuple) and isinstance(manifest.input.shape, tuple)
    assert b.Manifest.from_dict(manifest.to_dict()) == manifest
    data = manifest_dict()
    data["configurations"][0]["width"] = 1  # an int where a float is expected is fine
    assert b.Manifest.from_dict(data).configurations[0].width == 1.0
    assert type(b.Manifest.from_dict(data).configurations[0].width) is float


def test_lookup_and_num_classes(manifest: b.Manifest) -> None:
    assert manifest.num_classes == 3
    assert manifest.configuration("w0.50-head4").samples == 4
    with pytest.raises(BundleError, match=r"'nope'.*w0\.50-point, w0\.50-head4, w0\.50-all3"):
        manifest.configuration("nope")


def test_direct_construction_is_validated() -> None:
    entry = b.file_entry("a.tflite", b"xyz")
    assert entry.bytes == 3 and entry.sha256 == hashlib.sha256(b"xyz").hexdigest()
    with pytest.raises(BundleError, match=r"FileEntry\.sha256: expected 64 hex"):
        b.FileEntry("a.tflite", "ABC", 3)
    with pytest.raises(BundleError, match=r"FileEntry\.bytes: expected an integer >= 1"):
        b.FileEntry("a.tflite", "0" * 64, 0)


# --------------------------------------------------------------------------- verification


def test_checksum_mismatch_detected(written: Path) -> None:
    target = written / "w050_head4.tflite"
    data = bytearray(target.read_bytes())
    data[10] ^= 0x01
    target.write_bytes(bytes(data))
    expected = hashlib.sha256(blob("w050_head4.tflite")).hexdigest()
    actual = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(BundleError, match="checksum mismatch") as info:
        b.read_manifest(written)
    assert "w050_head4.tflite" in str(info.value)
    assert expected in str(info.value) and actual in str(info.value)
    b.read_manifest(written, verify=False)  # the manifest itself is fine


def test_size_mismatch_detected(written: Path) -> None:
    target = written / "w050_s1.tflite"
    target.write_bytes(target.read_bytes()[:-5])
    with pytest.raises(BundleError, match=r"'w050_s1\.tflite' has 91 bytes, the manifest says 96"):
        b.read_manifest(written)


def test_missing_file_detected(written: Path) -> None:
    (written / "w050_s2.tflite").unlink()
    with pytest.raises(BundleError, match=r"'w050_s2\.tflite' listed in the manifest is missing"):
        b.read_manifest(written)


def test_symlink_escaping_bundle_rejected(tmp_path: Path, written: Path) -> None:
    outside = tmp_path / "outside.tflite"
    name = "w050_point.tflite"
    outside.write_bytes((written / name).read_bytes())  # identical bytes: only the location is wrong
    (written / name).unlink()
    (written / name).symlink_to(outside)
    with pytest.raises(BundleError, match="outside the bundle"):
        b.read_manifest(written)


def test_symlink_inside_bundle_allowed(tmp_path: Path, written: Path) -> None:
    name = "w050_point.tflite"
    sub = written / "data"
    sub.mkdir()
    (written / name).rename(sub / name)
    (written / name).symlink_to(Path("data") / name)
    assert b.read_manifest(written).num_classes == 3


def test_missing_dir_and_manifest(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="bundle directory not found"):
        b.read_manifest(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match=r"has no manifest\.yaml"):
        b.read_manifest(tmp_path / "empty")
    (tmp_path / "file").write_text("x")
    with pytest.raises(BundleError, match="not a directory"):
        b.read_manifest(tmp_path / "file")


# --------------------------------------------------------------------------- parsing


def test_unknown_schema_version(tmp_path: Path) -> None:
    data = manifest_dict()
    data["schema_version"] = b.SCHEMA_VERSION + 1
    bundle = write_raw(tmp_path / "b", data)
    readable = ", ".join(map(str, range(1, b.SCHEMA_VERSION + 1)))
    assert b.READABLE_VERSIONS == tuple(range(1, b.SCHEMA_VERSION + 1))
    with pytest.raises(BundleError, match=f"schema_version: unsupported schema version "
                                          f"{b.SCHEMA_VERSION + 1}.*versions {readable}"):
        b.read_manifest(bundle, verify=False)


def test_version_1_reads_as_batch_1_and_batch_dim_needs_version_2(tmp_path: Path) -> None:
    data = manifest_dict()
    del data["batch_dim"], data["layout"]
    v1 = b.Manifest.from_dict({**data, "schema_version": 1})
    assert v1.schema_version == 1 and v1.batch_dim is None and not v1.batch_resizable
    assert "batch_dim" not in v1.to_dict()  # a version-1 manifest writes back as version 1
    assert b.manifest_to_yaml(v1).startswith("# edge-sdk bundle manifest (schema version 1)")
    v2 = b.Manifest.from_dict(manifest_dict())
    assert v2.batch_dim == 0 and v2.batch_resizable
    assert list(v2.to_dict())[:5] == ["schema_version", "input", "labels", "source", "batch_dim"]
    assert b.Manifest.from_dict(v2.to_dict()) == v2
    assert not b.Manifest.from_dict({**data, "schema_version": 2}).batch_resizable
    with pytest.raises(BundleError, match=r"^batch_dim: needs schema version 2"):
        b.Manifest.from_dict({**data, "schema_version": 1, "batch_dim": 0})
    for bad in (1, 3, -1, "0", True, 0.0):
        with pytest.raises(BundleError, match=r"^batch_dim: expected"):
            b.Manifest.from_dict({**data, "schema_version": 2, "batch_dim": bad})


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    bundle = write_manifest_text(tmp_path / "b", "schema_version: 1\nlabels: [a, b\ninput: {}\n")
    with pytest.raises(BundleError, match=r"manifest\.yaml: invalid YAML at line \d+") as info:
        b.read_manifest(bundle)
    assert str(bundle / b.MANIFEST_NAME) in str(info.value)


@pytest.mark.parametrize(
    "tag",
    ["!!python/object/apply:os.mkdir", "!!python/object/new:os.mkdir", "!!python/name:os.mkdir"],
)
def test_python_tags_rejected_without_executing(tmp_path: Path, tag: str) -> None:
    marker = tmp_path / "pwned"
    text = f"schema_version: 1\nsource: {tag} [{str(marker)!r}]\n"
    bundle = write_manifest_text(tmp_path / "b", text)
    with pytest.raises(BundleError, match="invalid YAML at line 2"):
        b.read_manifest(bundle)
    assert not marker.exists()


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    bundle = write_manifest_text(tmp_path / "b", "- 1\n- 2\n")
    with pytest.raises(BundleError, match="expected a YAML mapping at the top level"):
        b.read_manifest(bundle)


def test_error_names_dotted_key_path() -> None:
    data = manifest_dict()
    data["configurations"][2]["files"][0]["sha256"] = "xyz"
    with pytest.raises(
        BundleError, match=r"^configurations\[2\]\.files\[0\]\.sha256: expected 64 hex characters"
    ):
        b.Manifest.from_dict(data)


def test_unknown_and_missing_keys() -> None:
    data = manifest_dict()
    data["configurations"][1]["temprature"] = 1.0
    with pytest.raises(BundleError, match=r"configurations\[1\]: unknown key\(s\) 'temprature'"):
        b.Manifest.from_dict(data)
    data = manifest_dict()
    del data["configurations"][0]["val_nll"]
    with pytest.raises(BundleError, match=r"configurations\[0\]\.val_nll: missing required key"):
        b.Manifest.from_dict(data)
    data = manifest_dict()
    del data["configurations"][0]["latency_ms"]  # nullable keys default to null
    assert b.Manifest.from_dict(data).configurations[0].latency_ms is None


@pytest.mark.parametrize(
    "name",
    [
        "sub/x.tflite",
        "../x.tflite",
        "..",
        ".",
        "/etc/x.tflite",
        "/abs/path.tflite",
        "a\\b.tflite",
        ".hidden.tflite",
        "model.bin",
        ".tflite",
        "c:x.tflite",
        "a\x00.tflite",
        "",
    ],
)
def test_bad_file_names_rejected(name: str) -> None:
    data = manifest_dict()
    data["configurations"][0]["files"][0]["name"] = name
    with pytest.raises(BundleError, match=r"configurations\[0\]\.files\[0\]\.name: expected"):
        b.Manifest.from_dict(data)
    with pytest.raises(BundleError):
        b.resolve_file("/tmp", name)


def test_duplicate_configuration_ids() -> None:
    data = manifest_dict()
    data["configurations"][2]["id"] = "w0.50-point"
    with pytest.raises(
        BundleError, match=r"configurations\[2\]\.id: duplicate configuration id 'w0\.50-point'"
    ):
        b.Manifest.from_dict(data)


def test_duplicate_labels() -> None:
    data = manifest_dict()
    data["labels"] = ["cat", "dog", "cat"]
    with pytest.raises(BundleError, match=r"labels\[2\]: duplicate label 'cat'"):
        b.Manifest.from_dict(data)


def test_head_output_shape_mismatch() -> None:
    data = manifest_dict()
    data["configurations"][1]["output"]["shape"] = [1, 3]  # head with 4 samples needs [4, 3]
    with pytest.raises(BundleError, match=r"configurations\[1\]\.output\.shape: expected \[S, C\]"):
        b.Manifest.from_dict(data)


def test_output_classes_must_match_labels() -> None:
    data = manifest_dict()
    data["configurations"][0]["output"]["shape"] = [1, 4]
    with pytest.raises(BundleError, match=r"configurations\[0\]\.output\.shape\[1\]: expected 3"):
        b.Manifest.from_dict(data)


def test_all_scope_wrong_file_count() -> None:
    data = manifest_dict()
    data["configurations"][2]["files"].pop()
    with pytest.raises(
        BundleError, match=r"configurations\[2\]\.files: expected 3 file\(s\) for scope 'all'"
    ):
        b.Manifest.from_dict(data)


def test_invokes_and_point_samples_checked() -> None:
    data = manifest_dict()
    data["configurations"][2]["invokes"] = 1
    with pytest.raises(BundleError, match=r"configurations\[2\]\.invokes: expected 3"):
        b.Manifest.from_dict(data)
    data = manifest_dict()
    data["configurations"][0]["samples"] = 2
    with pytest.raises(BundleError, match=r"configurations\[0\]\.samples: expected 1"):
        b.Manifest.from_dict(data)


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (("input", "std"), [0.0], r"input\.std\[0\]: expected a positive number float32 can "
                                  r"carry \(>= 1\.175e-38"),
        (("input", "mean"), [0.0, 1.0], r"input\.mean: expected a list of 1 items"),
        (("input", "shape"), [2, 8, 8, 1], r"input\.shape\[0\]: expected batch dimension 1"),
        (("input", "dtype"), "int8", r"input\.dtype: expected one of 'float32', 'uint8'"),
        (("configurations", 0, "width"), 1.5, r"configurations\[0\]\.width: expected a number <= 1"),
        (("configurations", 0, "temperature"), 0, r"\.temperature: expected a positive number "
                                                   r"float32 can carry"),
        (("configurations", 0, "macs"), 1.5, r"\.macs: expected an integer, got float"),
        (("configurations", 0, "macs"), True, r"\.macs: expected an integer, got bool"),
        (("configurations", 0, "thresholds"), {"0.9": 1.2}, r"thresholds\['0\.9'\]: expected a number <= 1"),
        (("configurations", 0, "thresholds"), {"high": 0.5}, r"thresholds\.high: keys must be target"),
        (("configurations", 0, "test"), {"raw": {"nll": "x"}}, r"test\.raw\.nll: expected a number"),
        (("configurations", 0, "weights"), "int4", r"\.weights: expected one of"),
        (("source",), {"x": object()}, r"source\.x: expected a plain YAML value"),
        (("labels",), [], r"labels: expected a non-empty list"),
        (("configurations",), [], r"configurations: expected a non-empty list"),
    ],
)
def test_schema_value_errors(where: tuple, value: Any, message: str) -> None:
    data = manifest_dict()
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(BundleError, match=message):
        b.Manifest.from_dict(data)


def test_shared_file_must_agree() -> None:
    data = manifest_dict()
    shared = data["configurations"][0]["files"][0]
    data["configurations"][1]["files"] = [dict(shared)]
    b.Manifest.from_dict(data)  # the same file listed twice with the same entry is fine
    data["configurations"][1]["files"] = [dict(shared, bytes=shared["bytes"] + 1)]
    with pytest.raises(BundleError, match=r"configurations\[1\]\.files\[0\]: file .* different"):
        b.Manifest.from_dict(data)


# --------------------------------------------------------------------------- writing


def test_write_requires_matching_files(tmp_path: Path, manifest: b.Manifest) -> None:
    files = files_for(manifest)
    target = tmp_path / "bundle"
    missing = dict(files)
    missing.pop("w050_s1.tflite")
    with pytest.raises(BundleError, match=r"no data provided .*w050_s1\.tflite"):
        b.write_bundle(target, manifest, missing)
    with pytest.raises(BundleError, match=r"not listed .*extra\.tflite"):
        b.write_bundle(target, manifest, {**files, "extra.tflite": b"123"})
    with pytest.raises(BundleError, match=r"'w050_point\.tflite': manifest sha256 .* does not match"):
        b.write_bundle(target, manifest, {**files, "w050_point.tflite": blob("other")})
    with pytest.raises(BundleError, match=r"'w050_point\.tflite': the manifest says 96 bytes"):
        b.write_bundle(target, manifest, {**files, "w050_point.tflite": b"short"})
    assert list(tmp_path.iterdir()) == []


def test_existing_bundle_needs_force(tmp_path: Path, written: Path, manifest: b.Manifest) -> None:
    before = snapshot(written)
    data = manifest_dict()
    data["configurations"] = data["configurations"][:1]
    smaller = b.Manifest.from_dict(data)
    with pytest.raises(BundleError, match="already exists; pass --force"):
        b.write_bundle(written, smaller, files_for(smaller))
    assert snapshot(written) == before
    assert b.write_bundle(written, smaller, files_for(smaller), force=True) == written
    assert b.read_manifest(written) == smaller
    assert sorted(p.name for p in written.iterdir()) == [b.MANIFEST_NAME, "w050_point.tflite"]
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]  # old copy deleted, no temp dirs


def test_force_refuses_non_bundle_directory(tmp_path: Path, manifest: b.Manifest) -> None:
    target = tmp_path / "home"
    target.mkdir()
    (target / "precious.txt").write_text("keep me")
    with pytest.raises(BundleError, match="not a bundle"):
        b.write_bundle(target, manifest, files_for(manifest), force=True)
    assert (target / "precious.txt").read_text() == "keep me"


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_atomic_write_replace_failure_keeps_existing(
    tmp_path: Path, written: Path, manifest: b.Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = snapshot(written)

    def boom(src: Any, dst: Any) -> None:
        raise OSError("injected rename failure")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(BundleError, match="injected rename failure"):
        b.write_bundle(written, manifest, files_for(manifest), force=True)
    monkeypatch.undo()
    assert _leftovers(tmp_path) == []
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]
    assert snapshot(written) == before


def test_atomic_write_second_rename_failure_restores_existing(
    tmp_path: Path, written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old bundle moved aside, then moving the new one in fails: the old one comes back."""
    before = snapshot(written)
    data = manifest_dict()
    data["configurations"] = data["configurations"][1:2]
    other = b.Manifest.from_dict(data)
    real_replace = os.replace
    calls = []

    def flaky(src: Any, dst: Any) -> None:
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError("injected failure moving the new bundle in")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(BundleError, match="injected failure"):
        b.write_bundle(written, other, files_for(other), force=True)
    monkeypatch.undo()
    assert len(calls) == 3  # aside, (failed) in, restore
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]
    assert snapshot(written) == before


def test_atomic_write_failure_mid_files_leaves_nothing(
    tmp_path: Path, manifest: b.Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync
    calls = []

    def flaky(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 3:  # while writing the third file
            raise OSError("injected disk full")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", flaky)
    with pytest.raises(BundleError, match="injected disk full"):
        b.write_bundle(tmp_path / "bundle", manifest, files_for(manifest))
    monkeypatch.undo()
    assert len(calls) == 3
    assert list(tmp_path.iterdir()) == []


def test_interrupt_mid_write_leaves_nothing_and_propagates(
    tmp_path: Path, written: Path, manifest: b.Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = snapshot(written)

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        b.write_bundle(written, manifest, files_for(manifest), force=True)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]
    assert snapshot(written) == before


def test_written_manifest_is_readable_yaml(written: Path) -> None:
    raw = yaml.safe_load((written / b.MANIFEST_NAME).read_text(encoding="utf-8"))
    assert list(raw) == ["schema_version", "input", "labels", "source", "batch_dim", "layout",
                         "configurations"]
    assert raw["configurations"][1]["thresholds"] == {"0.9": 0.55, "0.95": 0.8, "0.99": None}
    # Readable by other users too (not a 0700 temp dir).
    assert written.stat().st_mode & 0o777 == 0o777 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_bundle_module_does_not_need_torch() -> None:
    code = (
        "import sys\n"
        "for name in ('torch', 'trainer', 'exporters'):\n"
        "    sys.modules[name] = None\n"
        "import edge_sdk.bundle\n"  # ImportError here if it touched any of them
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_yaml_alias_bomb_refused(tmp_path: Path) -> None:
    """10**9 leaves by aliases: refused quickly instead of walked (or copied) to exhaustion."""
    valid = manifest_dict()
    del valid["source"]
    lines = [yaml.safe_dump(valid, sort_keys=False), "source:", f"  x0: &a0 [{', '.join(['lol'] * 10)}]"]
    lines += [f"  x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bundle = write_manifest_text(tmp_path / "b", "\n".join(lines) + "\n")
    with pytest.raises(BundleError, match=r"YAML anchor &a0 at line \d+, column 7: anchors and "
                                          r"aliases are not allowed"):
        b.read_manifest(bundle)
    data = manifest_dict()
    nested: Any = []
    for _ in range(10):
        nested = [nested] * 10
    data["source"] = {"bomb": nested}
    with pytest.raises(BundleError, match=r"source\.bomb.*too large"):
        b.Manifest.from_dict(data)


# --------------------------------------------------------------------------- property


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)
_floats01 = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
_finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
_plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _finite | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@st.composite
def manifests(draw: st.DrawFn) -> tuple[b.Manifest, dict[str, bytes]]:
    channels = draw(st.integers(1, 3))
    labels = draw(st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=5, unique=True))
    n_configs = draw(st.integers(1, 3))
    ids = draw(
        st.lists(st.text(min_size=1, max_size=12), min_size=n_configs, max_size=n_configs, unique=True)
    )
    files: dict[str, bytes] = {}
    configs = []
    for k, cid in enumerate(ids):
        scope = draw(st.sampled_from(b.SCOPES))
        samples = 1 if scope == "point" else draw(st.integers(1, 3))
        n_files = samples if scope == "all" else 1
        entries = []
        for j in range(n_files):
            name = f"c{k}_{j}_{draw(_names)}.tflite"
            data = draw(st.binary(min_size=1, max_size=64))
            files[name] = data
            entries.append(b.file_entry(name, data))
        thresholds = draw(
            st.dictionaries(
                st.sampled_from(["0.5", "0.9", "0.95", "0.99", "1"]), st.none() | _floats01, max_size=3
            )
        )
        metric_dict = st.dictionaries(_names, _finite, max_size=4)
        configs.append(
            b.Configuration(
                id=cid,
                width=draw(st.floats(min_value=1e-6, max_value=1.0)),
                scope=scope,
                samples=samples,
                files=tuple(entries),
                invokes=samples if scope == "all" else 1,
                output=b.OutputSpec(shape=(samples if scope == "head" else 1, len(labels))),
                temperature=draw(st.floats(min_value=1e-3, max_value=100.0)),
                temperature_folded=draw(st.booleans()),
                weights=draw(st.sampled_from(b.WEIGHT_ROUTES)),
                macs=draw(st.integers(0, 2**40)),
                params=draw(st.integers(0, 2**31)),
                unique_values=draw(st.none() | st.integers(0, 10_000)),
                weight_entropy_bits=draw(st.none() | st.floats(min_value=0.0, max_value=16.0)),
                thresholds=thresholds,
                val_nll=draw(st.floats(min_value=0.0, max_value=50.0)),
                test=draw(st.dictionaries(_names, metric_dict, max_size=2)),
                latency_ms=draw(st.none() | st.floats(min_value=0.0, max_value=1e4)),
                memory_mb=draw(st.none() | st.floats(min_value=0.0, max_value=1e4)),
            )
        )
    lo = draw(st.floats(min_value=-10.0, max_value=10.0))
    manifest = b.Manifest(
        input=b.InputSpec(
            shape=(1, draw(st.integers(1, 64)), draw(st.integers(1, 64)), channels),
            dtype="float32",
            value_range=(lo, lo + draw(st.floats(min_value=0.5, max_value=100.0))),
            # a mean float32 carries, whose normalised range stays a float32 (issue 36)
            mean=tuple(draw(st.lists(st.floats(-1e6, 1e6), min_size=channels,
                                     max_size=channels))),
            std=tuple(
                draw(st.lists(st.floats(1e-6, 1e6), min_size=channels, max_size=channels))
            ),
        ),
        labels=tuple(labels),
        source=draw(st.dictionaries(st.text(max_size=8), _plain, max_size=4)),
        configurations=tuple(configs),
    )
    return manifest, files


@settings(max_examples=15, deadline=None)
@given(manifests())
def test_round_trip_property(case: tuple[b.Manifest, dict[str, bytes]]) -> None:
    manifest, files = case
    assert b.Manifest.from_dict(manifest.to_dict()) == manifest
    with tempfile.TemporaryDirectory() as tmp:
        path = b.write_bundle(Path(tmp) / "bundle", manifest, files)
        assert b.read_manifest(path) == manifest
        assert {p.name for p in path.iterdir()} == {b.MANIFEST_NAME, *files}


# ----------------------------------------------------------------------- cascade plans


def _with_wider_point(d: dict[str, Any]) -> dict[str, Any]:
    wide = config_dict("w1.00-point", "point", 1, ["w1.00-point.tflite"], width=1.0)
    d["configurations"].append(wide)
    return d


def test_cascade_plan_round_trips_and_is_optional():
    d = _with_wider_point(manifest_dict())
    plan = {"w1.00-point": {"threshold": 0.9, "coverage": 0.6, "max_loss": 0.002}}
    d["configurations"][0]["cascade"] = plan
    m = b.Manifest.from_dict(d)
    assert m.configurations[0].cascade == plan
    del d["configurations"][0]["cascade"]  # bundles written before the field existed
    assert b.Manifest.from_dict(d).configurations[0].cascade == {}


@pytest.mark.parametrize("target, entry, message", [
    ("nope", {"threshold": 0.9, "coverage": 0.6, "max_loss": 0.0}, "wider configuration"),
    ("w0.50-head4", {"threshold": 0.9, "coverage": 0.6, "max_loss": 0.0}, "same scope"),
    ("w1.00-point", {"threshold": 0.9, "coverage": 0.6}, "expected keys"),
    ("w1.00-point", {"threshold": 1.5, "coverage": 0.6, "max_loss": 0.0}, "threshold"),
    ("w1.00-point", {"threshold": None, "coverage": -0.1, "max_loss": 0.0}, "coverage"),
])
def test_cascade_plan_is_validated(target, entry, message):
    d = _with_wider_point(manifest_dict())
    d["configurations"][0]["cascade"] = {target: entry}
    with pytest.raises(b.BundleError, match=message):
        b.Manifest.from_dict(d)


def test_cascade_plan_must_point_to_a_wider_configuration():
    d = _with_wider_point(manifest_dict())
    d["configurations"][-1]["cascade"] = {
        "w0.50-point": {"threshold": 0.9, "coverage": 0.6, "max_loss": 0.0}}
    with pytest.raises(b.BundleError, match=r"configurations\[3\]\.cascade"):
        b.Manifest.from_dict(d)


# --------------------------------------------------------------------------- the one InputSpec


def _spec(**change: Any) -> b.InputSpec:
    fields = {"shape": (1, 8, 8, 1), "dtype": "float32", "value_range": (0.0, 16.0),
              "mean": (4.9,), "std": (6.0,), "classes": tuple(LABELS)}
    return b.InputSpec(**{**fields, **change})


def test_input_spec_carries_classes_for_checkpoints_never_in_a_manifest():
    from dataclasses import replace

    from edge_sdk.errors import DataError, InputSpecError

    spec = _spec()
    assert spec.to_dict()["classes"] == list(LABELS) and spec.num_classes == len(LABELS)
    assert b.InputSpec.from_dict(yaml.safe_load(yaml.safe_dump(spec.to_dict()))) == spec
    bare = replace(spec, classes=None)  # the manifest's input: labels are top-level
    assert "classes" not in bare.to_dict()
    assert b.Manifest.from_dict(manifest_dict()).input == bare
    d = manifest_dict()
    d["input"]["classes"] = list(LABELS)
    with pytest.raises(BundleError, match=r"^input\.classes: unknown key"):
        b.Manifest.from_dict(d)
    # one error type for both readers: a bundle problem and a data problem
    for bad in ({"dtype": "int16"}, {"std": (0.0,)}, {"classes": ()}, {"classes": "abc"},
                {"mean": (1.0, 2.0)}):
        with pytest.raises(InputSpecError) as err:
            _spec(**bad)
        assert isinstance(err.value, BundleError) and isinstance(err.value, DataError)
    with pytest.raises(InputSpecError, match=r"input_spec: unknown key\(s\) 'extra'"):
        b.InputSpec.from_dict({**spec.to_dict(), "extra": 1}, "input_spec")


def test_input_spec_check_matches_names_both_values():
    from edge_sdk.errors import DataError, InputSpecMismatchError

    spec = _spec()
    spec.check_matches(_spec(mean=(4.9 * (1 + 1e-9),)), what="same")  # recomputed: tolerance
    spec.check_matches(_spec(classes=None), what="same")  # classes compared only when both carry them
    other = _spec(shape=(1, 7, 7, 1), std=(6.5,), classes=("a", "b"))
    assert [name for name, _, _ in spec.mismatches(other)] == ["shape", "std", "classes"]
    with pytest.raises(InputSpecMismatchError) as err:
        spec.check_matches(other, what="reloaded data", mine="the checkpoint has",
                           theirs="the data give")
    msg = str(err.value)
    assert isinstance(err.value, DataError)
    assert msg.startswith("reloaded data: shape: the checkpoint has (1, 8, 8, 1), the data give "
                          "(1, 7, 7, 1); std: the checkpoint has (6,), the data give (6.5,); ")
    assert "classes: the checkpoint has" in msg and "the data give ('a', 'b')" in msg
