"""Materialisation on the device, end to end, with the real materialiser and no torch (issue 21):
a tiny store bundle built by hand with numpy (tests/store_support.py), loaded, predicted,
materialised to a files bundle, across threads and, through the pinned hashes, across numpy
1.x (the tflite-runtime CI venv) and 2.x. The torch-blocked CI steps run this file.

The pins: the sha256 of the hand-built store.bin and of slices materialised from it. They
change only when the store format, the sampler, the quantization or the writer changes what
it makes, which must then be deliberate: re-pin from ``python tests/store_support.py DIR``.
"""
from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest
from store_support import S_MAX, WIDTHS, build, store_arrays

import edge_sdk
import edge_sdk.store
from edge_sdk.cli import main as cli
from edge_sdk.bundle import read_manifest
from edge_sdk.store.sources import StoreSlices, read_store
from edge_sdk.errors import BundleError
from edge_sdk.store import Store, decode_store, encode_store, materialize

PLENTY_MB = 1e9
# numpy-version-independent by construction (integer sampler, float32 elementwise arithmetic):
# the same on numpy 1.26 + tflite-runtime 2.14 and on numpy 2.x + LiteRT
PINNED = {
    "store.bin": "9e0573b2c9ec6bc2902dbb99cc4fa1f702d44ecfc8620c8fc0c499f495435c91",
    "w1.00-point.tflite": "e3278be9d342b63397874a1886d3cbf979044493d9a45d3ebf8306e6dc3af091",
    "w1.00-s1.tflite": "72885b69974f0c02d2bebf420f498e61ef1bef86e7adaa5f81944a58dc622bb8",
    "w0.50-head3.tflite": "baa1a5735b9929b4559cec8e00854c8a23733557d274231fcf20189be77a0de2",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build(tmp_path_factory.mktemp("store") / "tiny")


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (6, 6, 1)).astype(np.float32)


def test_materialised_bytes_are_pinned_across_numpy_versions(tiny):
    m = read_manifest(tiny)
    entries = {e.name: e for e in (m.store, *m.file_entries())}
    assert {n: entries[n].sha256 for n in PINNED} == PINNED, (
        f"numpy {np.__version__}: the materialiser made other bytes than the pinned ones")
    store = read_store(tiny, m)  # from the file: decode_store of the verified bytes
    graph = m.graphs["1.00"]
    data = materialize(store, graph, "1.00", sample=1)
    assert hashlib.sha256(data).hexdigest() == PINNED["w1.00-s1.tflite"]


def test_same_bytes_across_runs_and_threads(tiny):
    """Every thread materialising every slice at once gets the manifest's bytes."""
    m = read_manifest(tiny)
    store = decode_store(encode_store(Store(*store_arrays())))
    recipes = [(c, i) for c in m.configurations for i in range(len(c.files))]
    errors: list = []

    def work():
        try:
            for c, i in recipes:
                data = edge_sdk.store.materialize_file(store, m, c, i)
                if hashlib.sha256(data).hexdigest() != c.files[i].sha256:
                    errors.append(c.files[i].name)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []


def test_a_store_bundle_loads_and_predicts(tiny):
    model = edge_sdk.load(tiny, profile=None, memory_reader=lambda: PLENTY_MB)
    m = model.manifest
    assert m.is_store and len(m.configurations) == len(WIDTHS) * (1 + 2 * S_MAX)
    # load() materialised, verified and parsed one slice per distinct graph: 3 per width
    assert model._slices.materialized == 3 * len(WIDTHS)
    x = _x()
    for c in m.configurations:
        p = model.predict(x, config_id=c.id)
        assert p.config_id == c.id and np.isfinite(p.probs).all()
        assert abs(sum(p.probs) - 1) < 1e-5
    p = model.predict(x)  # the policy's choice among 14 candidates
    assert p.config_id in {c.id for c in m.configurations}
    # every distinct file materialised once: 1 point + S_MAX heads + S_MAX samples per width
    assert model._slices.materialized == len(WIDTHS) * (1 + 2 * S_MAX)
    assert model.predict_batch(np.stack([x, _x(1)]))[0].label == model.predict(x).label


def test_a_compressed_store_bundle_loads_and_predicts_as_the_plain_one(tiny, tmp_path,
                                                                        monkeypatch):
    """store.bin as the container's version 2: the same slices (the manifest's sha256 of every
    file is unchanged), the same answers; the device holds the inflated store (its nbytes),
    not the smaller file."""
    packed = build(tmp_path / "packed", compress=True)
    m, m1 = read_manifest(packed), read_manifest(tiny)
    assert (packed / "store.bin").read_bytes()[8:12] == (2).to_bytes(4, "little")
    assert m.store.bytes < m1.store.bytes and m.store.sha256 != m1.store.sha256
    assert m.file_entries() == m1.file_entries()
    model = edge_sdk.load(packed, profile=None, memory_reader=lambda: PLENTY_MB)
    plain = edge_sdk.load(tiny, profile=None, memory_reader=lambda: PLENTY_MB)
    assert model._slices.store.nbytes == plain._slices.store.nbytes == m1.store.bytes
    x = _x(3)
    for c in m.configurations:
        got, want = model.predict(x, config_id=c.id), plain.predict(x, config_id=c.id)
        assert np.array_equal(got.probs, want.probs) and got.label == want.label
    # a flipped bit in the compressed file: refused by the sha256, before a byte is inflated
    import edge_sdk.store.container as container

    def never(buf):
        raise AssertionError("inflated before the sha256 was checked")

    blob = bytearray((packed / "store.bin").read_bytes())
    blob[len(blob) // 2] ^= 0x01
    (packed / "store.bin").write_bytes(bytes(blob))
    monkeypatch.setattr(container, "_inflate", never)
    with pytest.raises(BundleError, match=r"checksum mismatch for 'store.bin'"):
        edge_sdk.load(packed, profile=None)


def test_a_flipped_bit_in_the_store_is_refused_at_load(tiny, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny, bad)
    blob = bytearray((bad / "store.bin").read_bytes())
    for pos in (0, len(blob) // 2, len(blob) - 1):
        flipped = bytearray(blob)
        flipped[pos] ^= 0x01
        (bad / "store.bin").write_bytes(bytes(flipped))
        with pytest.raises(BundleError, match=r"checksum mismatch for 'store.bin'"):
            edge_sdk.load(bad, profile=None)


def test_load_holds_no_more_materialised_bytes_than_the_cap(tiny):
    """The representatives are checked one at a time through the capped cache."""
    m = read_manifest(tiny)
    cap_mb = 1.05 * 4 * min(e.bytes for e in m.file_entries()) / 2 ** 20
    model = edge_sdk.load(tiny, profile=None, memory_reader=lambda: PLENTY_MB,
                          memory_cap_mb=cap_mb)
    assert model._slices.materialized == 3 * len(WIDTHS)  # each representative checked
    assert 0 < model._slices.resident_bytes() <= cap_mb * 2 ** 20


def test_another_sample_than_the_manifest_lists_is_refused(tiny, monkeypatch):
    """The device building sample s + 1 where the exporter measured s (a sampler or seed
    mismatch): refused before an interpreter sees it."""
    real = edge_sdk.store.materialize_file

    def off_by_one(store, manifest, config, i):
        r = manifest.recipe(config, i)
        if r.sample is None:
            return real(store, manifest, config, i)
        return materialize(store, manifest.graphs[r.width], r.width, sample=r.sample + 1)

    monkeypatch.setattr(edge_sdk.store, "materialize_file", off_by_one)
    with pytest.raises(BundleError, match=r"materialised .*checksum mismatch for 'w0.50-s0"):
        edge_sdk.load(tiny, profile=None)


def test_lru_under_the_memory_cap_rematerialises_and_reverifies(tiny, monkeypatch):
    m = read_manifest(tiny)
    # the smallest configuration's need (its bytes x 4, no measured memory_mb): one
    # configuration's interpreters, and ~4 files' materialised bytes out of 14
    cap_mb = 1.05 * 4 * min(e.bytes for e in m.file_entries()) / 2 ** 20
    model = edge_sdk.load(tiny, profile=None, memory_reader=lambda: PLENTY_MB,
                          memory_cap_mb=cap_mb)
    src = model._slices
    assert src.cap_bytes == cap_mb * 2 ** 20
    x = _x()
    ids = [c.id for c in m.configurations]
    first = {i: model.predict(x, config_id=i).probs for i in ids}
    for _ in range(2):
        for i in ids:
            model._forget_interpreters()  # this thread's interpreters too: bytes are needed
            assert np.array_equal(model.predict(x, config_id=i).probs, first[i])
            assert src.resident_bytes() <= src.cap_bytes
    made = src.materialized
    assert made > len(m.file_entries())  # evicted slices were made again
    calls = []
    real = edge_sdk.store.materialize_file
    verify = StoreSlices.build

    def counting(self, name):
        calls.append(name)
        return verify(self, name)

    monkeypatch.setattr(StoreSlices, "build", counting)
    evicted = next(n for n in src.names() if n not in src.resident())
    config = next(c for c in m.configurations if c.files[-1].name == evicted)
    model._forget_interpreters()
    model.predict(x, config_id=config.id)
    assert evicted in calls  # built again, and build() verifies (sha256, tensors)
    assert real is edge_sdk.store.materialize_file


def test_edge_sdk_materialize_round_trip(tiny, tmp_path, capsys):
    out = tmp_path / "files"
    assert cli.main(["materialize", str(tiny), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    store_m, files_m = read_manifest(tiny), read_manifest(out)  # verify=True: every sha256
    assert files_m.layout == "files" and files_m.schema_version == 3
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.yaml", *(e.name for e in store_m.file_entries())])
    for e in store_m.file_entries():
        assert hashlib.sha256((out / e.name).read_bytes()).hexdigest() == e.sha256
    a = edge_sdk.load(tiny, profile=None, memory_reader=lambda: PLENTY_MB)
    b = edge_sdk.load(out, profile=None, memory_reader=lambda: PLENTY_MB)
    for c in store_m.configurations:
        for seed in range(3):
            assert np.array_equal(a.predict(_x(seed), config_id=c.id).probs,
                                  b.predict(_x(seed), config_id=c.id).probs)


def test_read_slices_refuses_a_store_bundle(tiny):
    from edge_sdk.bundle import read_slices

    with pytest.raises(BundleError, match="materialised from store.bin, not read"):
        read_slices(tiny, read_manifest(tiny))


def test_the_device_commands_run_on_a_store_bundle(tiny, tmp_path, capsys):
    """edge-sdk run and profile on a store bundle: slices from the verified store only."""
    from edge_sdk.policy.measured import measure_profile

    x = tmp_path / "x.npy"
    np.save(x, _x())
    assert cli.main(["run", str(tiny), "--input", str(x), "--profile", "none", "--json"]) == 0
    assert '"config_id"' in capsys.readouterr().out
    prof, rows = measure_profile(tiny, [1], repeats=2)
    m = read_manifest(tiny)
    assert {r["config"] for r in rows} == {c.id for c in m.configurations}
    assert all(r["measured_ms"] > 0 for r in rows)


def test_an_app_outside_python_reads_the_materialised_files(tiny, tmp_path):
    """docs/predict_with_litert.py (plain LiteRT + YAML) refuses the store bundle, naming
    edge-sdk materialize, and answers as predict does on the files bundle it writes."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "docs" / "predict_with_litert.py"
    spec = importlib.util.spec_from_file_location("predict_with_litert", script)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with pytest.raises(ValueError, match="edge-sdk materialize"):
        example.predict(tiny, _x(), "w1.00-point")
    out = tmp_path / "files"
    assert cli.main(["materialize", str(tiny), "--out", str(out)]) == 0
    model = edge_sdk.load(tiny, profile=None, memory_reader=lambda: PLENTY_MB)
    for c in model.manifest.configurations:
        got, want = example.predict(out, _x(), c.id), model.predict(_x(), config_id=c.id)
        assert got["config_id"] == want.config_id and got["label"] == want.label
        assert got["probs"] == pytest.approx(want.probs, abs=1e-5)
