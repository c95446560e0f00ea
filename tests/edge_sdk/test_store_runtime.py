"""The runtime side of a store bundle (issue 21, docs/store.md §5), on a *fake* store: the
session's files bundle re-described as ``layout: store``, ``decode_store`` / ``materialize_file``
monkeypatched to hand back its real ``.tflite`` bytes. What is tested here is the runtime's
contract, not the materialiser (tests/edge_sdk/test_store_materialize.py runs the real one):
store.bin verified at load, every materialised slice checked against the manifest's sha256 and
tensors before an interpreter sees it, the LRU bytes cache under ``memory_cap_mb``, one
materialisation per slice across threads, interpreters shared by file.

No torch here (only the ``bundle`` fixture needs it, or ``EDGE_SDK_TEST_BUNDLE``).
"""
from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
import edge_sdk.store
from edge_sdk.bundle import (
    MANIFEST_NAME,
    Manifest,
    StoreEntry,
    file_entry,
    manifest_to_yaml,
    read_manifest,
)
from edge_sdk.store.sources import StoreSlices, representatives
from edge_sdk.store.to_files import files_manifest
from edge_sdk.cli.device import materialize_main
from edge_sdk.errors import BundleError
from runtime_support import without_cascade_targets, without_val_accuracy

PLENTY_MB = 1e9
STORE = b"a fake weight store: only its sha256 and size matter here\n" * 7


class FakeStore:
    """What the fake decode_store returns: the files bundle's slices by name."""

    def __init__(self, blobs: dict[str, bytes]):
        self.blobs = blobs


class Fakes:
    """The monkeypatched store functions, counting materialisations per file; ``corrupt``:
    file names whose bytes come back with one bit flipped."""

    def __init__(self, blobs: dict[str, bytes]):
        self.blobs, self.calls, self.corrupt, self.delay = blobs, [], set(), 0.0
        self._lock = threading.Lock()

    def decode_store(self, data):
        assert bytes(data) == STORE  # only verified bytes are decoded
        return FakeStore(self.blobs)

    def materialize_file(self, store, manifest, config, i):
        name = config.files[i].name
        with self._lock:
            self.calls.append(name)
        if self.delay:
            time.sleep(self.delay)
        data = store.blobs[name]
        if name in self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 1])
        return data


def _recipes(c: dict) -> list[dict]:
    key = f"{c['width']:.2f}"
    if c["scope"] == "point":
        return [{"width": key, "sample": None, "heads": 0}]
    if c["scope"] == "head":
        return [{"width": key, "sample": None, "heads": c["samples"]}]
    return [{"width": key, "sample": s, "heads": 0} for s in range(c["samples"])]


def fake_store_bundle(files_bundle: Path, dst: Path, all1: bool = True) -> tuple[Path, dict]:
    """``files_bundle`` as a ``layout: store`` bundle at ``dst`` (manifest + store.bin, no
    .tflite files), plus an ``all1`` configuration per width listing the ``all`` scope's first
    sample file (as the exporter's S = 1 .. S_max configurations do). Returns the bundle and
    its slices' real bytes by name."""
    m = read_manifest(files_bundle)
    data = m.to_dict()
    blobs = {e.name: (files_bundle / e.name).read_bytes() for e in m.file_entries()}
    configs = data["configurations"]
    if all1:
        for c in [c for c in configs if c["scope"] == "all"]:
            one = {**c, "id": c["id"].rsplit("-", 1)[0] + "-all1", "samples": 1, "invokes": 1,
                   "files": c["files"][:1], "cascade": {}}
            configs.append(one)
    for c in configs:
        c["materialize"] = _recipes(c)
    widths = sorted({f"{c['width']:.2f}" for c in configs})
    data.pop("uncertainty", None)  # schema version 5's (its file is not in this bundle)
    data.pop("input_stats", None)  # schema version 6's
    without_cascade_targets(data)  # schema version 8's
    without_val_accuracy(data)  # schema version 10's
    data.update(schema_version=3, layout="store",
                store=file_entry("store.bin", STORE, StoreEntry).to_dict(),
                graphs={w: {"tensors": [], "ops": [], "inputs": [], "outputs": []}
                        for w in widths})
    dst.mkdir(parents=True)
    (dst / "store.bin").write_bytes(STORE)
    (dst / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    return dst, blobs


@pytest.fixture
def fake(bundle, tmp_path, monkeypatch):
    """(store bundle dir, Fakes) with the store functions monkeypatched."""
    path, blobs = fake_store_bundle(bundle, tmp_path / "store")
    fakes = Fakes(blobs)
    monkeypatch.setattr(edge_sdk.store, "decode_store", fakes.decode_store, raising=False)
    monkeypatch.setattr(edge_sdk.store, "materialize_file", fakes.materialize_file,
                        raising=False)
    return path, fakes


def _x(bundle: Path) -> np.ndarray:
    spec = read_manifest(bundle).input
    lo, hi = spec.value_range
    return np.random.default_rng(3).uniform(lo, hi, spec.shape[1:]).astype(spec.dtype)


def test_a_store_bundle_loads_and_predicts_as_its_files_do(bundle, fake):
    path, fakes = fake
    x = _x(bundle)
    files_model = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    model = edge_sdk.load(path, profile=None, memory_reader=lambda: PLENTY_MB)
    m = model.manifest
    assert m.is_store and model._slices.layout == "store"
    # load(): one representative per distinct graph, materialised, verified, parsed
    reps = set(representatives(m).values())
    assert sorted(fakes.calls) == sorted(reps)
    widths = {c.width for c in m.configurations}
    assert len(reps) == 3 * len(widths)  # point, one sample, one head per width
    for c in files_model.manifest.configurations:
        assert np.array_equal(model.predict(x, config_id=c.id).probs,
                              files_model.predict(x, config_id=c.id).probs)
    assert model.predict(x).label == files_model.predict(x).label
    # every slice materialised once: the cache is unbounded without memory_cap_mb
    assert sorted(fakes.calls) == sorted(model._slices.names())


def test_a_flipped_bit_in_store_bin_is_refused_at_load(fake):
    path, fakes = fake
    blob = bytearray((path / "store.bin").read_bytes())
    blob[len(blob) // 2] ^= 0x10
    (path / "store.bin").write_bytes(bytes(blob))
    with pytest.raises(BundleError, match=r"checksum mismatch for 'store.bin'"):
        edge_sdk.load(path, profile=None)
    (path / "store.bin").write_bytes(bytes(blob[:-1]))
    with pytest.raises(BundleError, match=r"'store.bin' has \d+ bytes, the manifest says"):
        edge_sdk.load(path, profile=None)
    assert fakes.calls == []  # nothing materialised from an unverified store


def test_a_missing_store_is_refused_at_load(fake):
    path, _ = fake
    (path / "store.bin").unlink()
    with pytest.raises(BundleError, match=r"'store.bin' listed in the manifest is missing"):
        edge_sdk.load(path, profile=None)


def test_a_materialised_slice_not_matching_the_manifest_is_refused(bundle, fake):
    """The device must build byte for byte what the exporter measured: a representative that
    differs fails load(); any other slice fails its first use, before an interpreter sees it,
    and is not cached (the next use tries, and refuses, again)."""
    path, fakes = fake
    m = read_manifest(path, verify=False)
    reps = set(representatives(m).values())
    rep = sorted(reps)[0]
    fakes.corrupt = {rep}
    with pytest.raises(BundleError, match=rf"materialised .*checksum mismatch for '{rep}'"):
        edge_sdk.load(path, profile=None)
    other = next(c for c in m.configurations if c.scope == "all" and c.samples > 1)
    bad = other.files[1].name
    assert bad not in reps
    fakes.corrupt = {bad}
    model = edge_sdk.load(path, profile=None, memory_reader=lambda: PLENTY_MB)
    built = []
    real = model._interp_cls
    model._interp_cls = lambda **kw: built.append(kw["model_name"]) or real(**kw)
    for _ in range(2):
        with pytest.raises(BundleError, match=rf"checksum mismatch for '{bad}'.*exporter measured"):
            model.predict(_x(bundle), config_id=other.id)
    assert bad not in built and bad not in model._slices.resident()
    assert fakes.calls.count(bad) == 2
    x2 = np.stack([_x(bundle)] * 2)
    with pytest.raises(BundleError, match=rf"checksum mismatch for '{bad}'"):
        model.predict_batch(x2, config_id=other.id)
    assert model._batchable.get(other.id, True)  # a refused slice is not a failed resize


def test_materialised_tensors_are_checked_too(bundle, fake, monkeypatch):
    """A slice with the manifest's sha256 but another configuration's tensors (a manifest
    listing a head file's hash for a point file) is refused by check_slice."""
    path, fakes = fake
    data = read_manifest(path, verify=False).to_dict(expand=True)
    point = next(c for c in data["configurations"] if c["scope"] == "point")
    head = next(c for c in data["configurations"] if c["scope"] == "head")
    fakes.blobs = {**fakes.blobs, point["files"][0]["name"]: fakes.blobs[head["files"][0]["name"]]}
    point["files"][0] = {**head["files"][0], "name": point["files"][0]["name"]}
    (path / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    with pytest.raises(BundleError, match="output tensor"):
        edge_sdk.load(path, profile=None)


def test_the_bytes_cache_is_lru_under_the_cap_and_re_verifies(fake):
    path, fakes = fake
    m = read_manifest(path, verify=False)
    store = edge_sdk.store.decode_store(STORE)
    names = list(dict.fromkeys(e.name for c in m.configurations for e in c.files))
    size = len(fakes.blobs[names[0]])
    a, b, c = [n for n in names if len(fakes.blobs[n]) == size][:3]  # three of one size
    cap = 2 * size  # two of them, not three
    src = StoreSlices(store, m, "fake", cap_bytes=cap)
    assert src[a] == fakes.blobs[a] and src[b] == fakes.blobs[b]
    assert src[a] is src[a]  # resident: no second materialisation
    assert fakes.calls == [a, b]
    src[c]  # evicts the least recently used (b), keeps a
    assert set(src.resident()) <= {a, c} and c in src.resident()
    assert src.resident_bytes() <= cap
    fakes.corrupt = {b}  # b is materialised again, and verified again
    with pytest.raises(BundleError, match=f"checksum mismatch for '{b}'"):
        src[b]
    fakes.corrupt = set()
    assert src[b] == fakes.blobs[b] and fakes.calls.count(b) == 3
    tiny = StoreSlices(store, m, "fake", cap_bytes=1)  # below one slice: keeps only the last
    tiny[a], tiny[b]
    assert tiny.resident() == (b,)


def test_one_materialisation_per_slice_across_threads(fake):
    path, fakes = fake
    m = read_manifest(path, verify=False)
    src = StoreSlices(edge_sdk.store.decode_store(STORE), m, "fake")
    name = m.configurations[0].files[0].name
    fakes.delay = 0.05
    got, barrier = [], threading.Barrier(8)

    def want():
        barrier.wait()
        got.append(src[name])

    threads = [threading.Thread(target=want) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 8 and all(g == fakes.blobs[name] for g in got)
    assert fakes.calls == [name]


def test_threads_predict_from_a_store_bundle_under_a_memory_cap(bundle, fake):
    """Several threads, each its own interpreters, one shared bytes cache under the cap:
    every answer equals the files bundle's."""
    path, fakes = fake
    x = _x(bundle)
    ref = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    ids = [c.id for c in ref.manifest.configurations]
    want = {i: ref.predict(x, config_id=i).probs for i in ids}
    small = min(ref.manifest.configurations, key=ref.policy.memory_need_mb)
    cap = ref.policy.memory_need_mb(small) * 1.5
    model = edge_sdk.load(path, profile=None, memory_reader=lambda: PLENTY_MB,
                          memory_cap_mb=cap)
    errors, answers = [], []

    def work(seed):
        try:
            order = np.random.default_rng(seed).permutation(ids * 3)
            answers.extend((i, model.predict(x, config_id=i).probs) for i in order)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(answers) == 4 * 3 * len(ids)
    assert all(np.array_equal(p, want[i]) for i, p in answers)
    assert model._slices.resident_bytes() <= cap * 2 ** 20 or len(model._slices.resident()) == 1
    # evicted slices were materialised again (and verified again: the fake counts every call)
    assert len(fakes.calls) > len(model._slices.names())


def test_an_evicted_slice_is_materialised_and_verified_again(bundle, fake):
    path, fakes = fake
    m = read_manifest(path, verify=False)
    points = sorted((c for c in m.configurations if c.scope == "point"), key=lambda c: c.width)
    narrow, wide = points[0], points[-1]
    model = edge_sdk.load(path, profile=None, memory_reader=lambda: PLENTY_MB,
                          memory_cap_mb=model_cap(narrow, wide))
    x = _x(bundle)
    model.predict(x, config_id=wide.id)
    model.predict(x, config_id=narrow.id)  # the cap holds one of them: wide is evicted
    assert wide.files[0].name not in model._slices.resident()
    before = fakes.calls.count(wide.files[0].name)
    fakes.corrupt = {wide.files[0].name}
    with pytest.raises(BundleError, match="checksum mismatch"):
        model.predict(x, config_id=wide.id)
    fakes.corrupt = set()
    p = model.predict(x, config_id=wide.id)
    assert p.config_id == wide.id and fakes.calls.count(wide.files[0].name) == before + 2
    assert model.first_use_ms[wide.id] > 0


def model_cap(narrow, wide) -> float:
    """A memory cap holding the narrow point slice's interpreter and bytes but not the wide
    one's next to it (files' bytes x 4: the policy's need without a measured memory_mb)."""
    return (narrow.files[0].bytes * 4 + 1) / 2 ** 20


def test_all_scope_configurations_share_sample_interpreters(bundle, fake):
    path, _ = fake
    model = edge_sdk.load(path, profile=None, memory_reader=lambda: PLENTY_MB)
    m = model.manifest
    for c in m.configurations:
        if c.scope != "all" or c.samples == 1:
            continue
        one = m.configuration(c.id.rsplit("-", 1)[0] + "-all1")
        assert one.files[0] == c.files[0]
        assert model._interpreters(one)[0][0] is model._interpreters(c)[0][0]
        x = model._feed(_x(bundle))
        assert np.array_equal(model._run(one, x)[0][0], model._run(c, x)[0][0])


def test_edge_sdk_materialize_writes_the_files_bundle(bundle, fake, tmp_path, capsys):
    path, fakes = fake
    out = tmp_path / "files"
    assert materialize_main([str(path), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    store_m, files_m = read_manifest(path, verify=False), read_manifest(out)  # verify: sha256
    assert files_m.layout == "files" and files_m.store is None and files_m.schema_version == 3
    assert files_m.configurations == files_manifest(store_m).configurations
    assert [c.files for c in files_m.configurations] == [c.files for c in store_m.configurations]
    for e in files_m.file_entries():
        assert (out / e.name).read_bytes() == fakes.blobs[e.name]
    assert files_m.source["materialized_from"]["sha256"] == store_m.store.sha256
    x = _x(bundle)
    a = edge_sdk.load(out, profile=None, memory_reader=lambda: PLENTY_MB)
    b = edge_sdk.load(path, profile=None, memory_reader=lambda: PLENTY_MB)
    for c in store_m.configurations:
        assert np.array_equal(a.predict(x, config_id=c.id).probs,
                              b.predict(x, config_id=c.id).probs)
    with pytest.raises(BundleError, match="already exists"):
        materialize_main([str(path), "--out", str(out)])
    assert materialize_main([str(path), "--out", str(out), "--force"]) == 0
    with pytest.raises(BundleError, match="already a files bundle"):
        materialize_main([str(out), "--out", str(tmp_path / "again")])


def test_edge_sdk_materialize_refuses_a_broken_store_and_writes_nothing(fake, tmp_path):
    path, fakes = fake
    name = sorted(fakes.blobs)[-1]
    fakes.corrupt = {name}
    with pytest.raises(BundleError, match=f"checksum mismatch for '{name}'"):
        materialize_main([str(path), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_earlier_schema_versions_still_load(bundle, tmp_path):
    """The session's files bundle rewritten as schema version 2 (no layout) answers the same."""
    copy = tmp_path / "v2"
    shutil.copytree(bundle, copy)
    data = read_manifest(copy).to_dict()
    data["schema_version"] = 2
    for key in ("layout", "store", "graphs", "uncertainty", "input_stats"):
        data.pop(key, None)
    without_cascade_targets(data)
    without_val_accuracy(data)
    (copy / MANIFEST_NAME).write_text(manifest_to_yaml(Manifest.from_dict(data)))
    x = _x(bundle)
    old = edge_sdk.load(copy, profile=None, memory_reader=lambda: PLENTY_MB)
    new = edge_sdk.load(bundle, profile=None, memory_reader=lambda: PLENTY_MB)
    assert old.manifest.schema_version == 2 and old._slices.layout == "files"
    for c in new.manifest.configurations:
        assert np.array_equal(old.predict(x, config_id=c.id).probs,
                              new.predict(x, config_id=c.id).probs)


def test_load_checks_each_representative_once_and_known_wrong_names_who_stands_on_it():
    """check_bundle(stand_ins=...) looks each checked slice up once (a store bundle
    materialises it on lookup): its known-wrong rules, then its parse; a representative the
    backend would answer wrongly is named with every configuration standing on it."""
    from types import SimpleNamespace

    from edge_sdk.backends import BackendError, check_bundle

    data_dir = Path(__file__).resolve().parent / "data"
    hybrid = (data_dir / "hybrid_fc_v3.tflite").read_bytes()  # tflite-runtime computes it wrongly
    clean = (data_dir / "hybrid_fc_v12.tflite").read_bytes()
    looked, parsed = [], []

    class Lazy(dict):
        def __getitem__(self, name):
            looked.append(name)
            return super().__getitem__(name)

        def items(self):
            return ((k, self[k]) for k in self)

    def f(name):
        return SimpleNamespace(name=name)

    manifest = SimpleNamespace(configurations=[
        SimpleNamespace(id="w1-all1", files=[f("s0")]),
        SimpleNamespace(id="w1-all2", files=[f("s0"), f("s1")]),
        SimpleNamespace(id="w1-point", files=[f("p")])])
    stand = {"s0": "s0", "s1": "s0", "p": "p"}
    # built and allocated at load() (issue 36): a stand-in whose allocation succeeds
    interp = lambda **kw: parsed.append(kw["model_name"]) or SimpleNamespace(  # noqa: E731
        allocate_tensors=lambda: None)

    check_bundle("b", manifest, "litert", Lazy(s0=hybrid, p=clean), interp, stand)
    assert sorted(looked) == ["p", "s0"] and sorted(parsed) == ["p", "s0"]
    looked.clear(), parsed.clear()
    plain = (data_dir / "layer_kinds_pools.tflite").read_bytes()  # float kernels only
    left = check_bundle("b", manifest, "tflite-runtime", Lazy(s0=hybrid, p=plain), interp, stand)
    assert sorted(left) == ["w1-all1", "w1-all2"]  # both stand on s0, left out
    assert sorted(looked) == ["p", "s0"] and parsed == ["p"]  # s0 never built
    looked.clear(), parsed.clear()
    with pytest.raises(BackendError, match=r"w1-all1, w1-all2 correctly"):
        check_bundle("b", manifest, "tflite-runtime", Lazy(s0=hybrid, p=clean), interp, stand)
    assert parsed == []  # nothing it answers correctly: refused, nothing built


def test_a_configuration_on_resident_files_has_no_first_use_cost(bundle, fake):
    path, _ = fake
    model = edge_sdk.load(path, profile=None, memory_reader=lambda: PLENTY_MB)
    two = next(c for c in model.manifest.configurations if c.scope == "all" and c.samples == 2)
    one = model.manifest.configuration(two.id.rsplit("-", 1)[0] + "-all1")
    x = _x(bundle)
    model.predict(x, config_id=two.id)
    assert model.first_use_ms[two.id] > 0 and one.id not in model.first_use_ms
    model.predict(x, config_id=one.id)
    assert model.first_use_ms[one.id] == 0.0  # its file was resident: nothing built
    row = next(r for r in model.explain().rows if r.config_id == one.id)
    assert row.first_use_ms == 0.0
