"""edge_sdk.store.container: the store.bin format (deterministic, bounds-checked, zero-copy)."""
from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from edge_sdk.errors import BundleError, ConfigError
from edge_sdk.store.container import (ALIGN, MAGIC, MAX_INNER_BYTES, Store, compress_store,
                                      decode_store, encode_store)

DTYPES = [np.float32, np.float16, np.int8, np.uint8, np.uint16, np.int32, np.uint32]


def _store() -> Store:
    rng = np.random.default_rng(0)
    arrays = {f"a{i}/{np.dtype(dt).name}": (rng.normal(size=(3, 5, 2)) * 50).astype(dt)
              for i, dt in enumerate(DTYPES)}
    arrays["empty"] = np.zeros((0, 4), dtype=np.float32)
    arrays["odd"] = np.arange(7, dtype=np.uint8)  # 7 bytes: the next array is padded
    arrays["scalar"] = np.array(3.5, dtype=np.float32)
    arrays["big_endian"] = np.arange(4, dtype=">u2")
    return Store(index={"layers": {"conv1": {"kind": "codebook", "bits": 3}}, "widths": ["0.50"]},
                 arrays=arrays)


def _prefix(header: bytes) -> bytes:
    return struct.pack("<8sIQ", MAGIC, 1, len(header)) + header


def _raw(header: dict, payload: bytes) -> bytes:
    """A store file with a hand-written header (for the refusals)."""
    head = _prefix(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    return head + b"\x00" * (-len(head) % ALIGN) + payload


def test_round_trip_every_dtype_and_shape():
    store = _store()
    data = encode_store(store)
    out = decode_store(data)
    assert out.index == store.index
    assert set(out.arrays) == set(store.arrays)
    for name, a in store.arrays.items():
        b = out.arrays[name]
        assert b.shape == a.shape and b.dtype == a.dtype.newbyteorder("<")
        np.testing.assert_array_equal(b, a)
        assert not b.flags.writeable
    assert out.array("odd").tolist() == list(range(7))
    with pytest.raises(BundleError, match="no array 'missing'"):
        out.array("missing")


def test_layout_is_aligned_and_deterministic():
    store = _store()
    data = encode_store(store)
    assert data == encode_store(store)
    shuffled = Store(index=dict(reversed(list(store.index.items()))),
                     arrays=dict(reversed(list(store.arrays.items()))))
    assert encode_store(shuffled) == data  # insertion order does not matter
    assert data[:8] == MAGIC and struct.unpack_from("<I", data, 8)[0] == 1
    hlen = struct.unpack_from("<Q", data, 12)[0]
    header = json.loads(data[20:20 + hlen])
    assert data[20:20 + hlen] == json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    start = -(-(20 + hlen) // ALIGN) * ALIGN
    for name, e in header["arrays"].items():
        assert e["offset"] % ALIGN == 0
        a = np.asarray(store.arrays[name])
        assert data[start + e["offset"]:start + e["offset"] + e["bytes"]] == \
            a.astype(a.dtype.newbyteorder("<")).tobytes()
    assert header["arrays"]["a0/float32"]["dtype"] == "<f4"
    assert header["arrays"]["a2/int8"]["dtype"] == "|i1"


def test_decode_is_zero_copy():
    buf = bytearray(encode_store(Store({}, {"w": np.zeros(4, dtype=np.float32)})))
    w = decode_store(buf).arrays["w"]
    assert not w.flags.writeable
    buf[-4:] = np.float32(2.0).tobytes()
    assert w[-1] == 2.0  # a view into the buffer, not a copy


def test_empty_store():
    out = decode_store(encode_store(Store()))
    assert out.index == {} and out.arrays == {}


@pytest.mark.parametrize("bad", [np.zeros(2, dtype=np.float64), np.zeros(2, dtype=bool),
                                 np.zeros(2, dtype=np.int64), np.array(["x"])])
def test_encode_refuses_other_dtypes(bad):
    with pytest.raises(ConfigError, match="not allowed"):
        encode_store(Store({}, {"x": bad}))


def test_encode_refuses_an_index_that_is_not_json():
    for index in ({"x": float("nan")}, {"x": object()}, {1: 2}, {"x": (1, 2)}):
        with pytest.raises(ConfigError):
            encode_store(Store(index, {}))


def test_refuses_bad_magic_and_version():
    data = bytearray(encode_store(_store()))
    with pytest.raises(BundleError, match="magic"):
        decode_store(b"EDGESTOX" + bytes(data[8:]))
    data[8] = 3
    with pytest.raises(BundleError, match="format version 3, expected one of 1, 2"):
        decode_store(bytes(data))
    data[8] = 2  # a version-1 body under a version-2 prefix: not a zlib stream
    with pytest.raises(BundleError, match="does not inflate"):
        decode_store(bytes(data))
    with pytest.raises(BundleError, match="prefix"):
        decode_store(MAGIC)


def test_refuses_a_truncated_header():
    data = encode_store(_store())
    hlen = struct.unpack_from("<Q", data, 12)[0]
    with pytest.raises(BundleError, match="header of .* runs past the end"):
        decode_store(data[:20 + hlen // 2])


def test_refuses_a_truncated_or_extended_payload():
    data = encode_store(_store())
    with pytest.raises(BundleError, match="run past the end of the payload"):
        decode_store(data[:-1])
    with pytest.raises(BundleError, match="bytes after the last array"):
        decode_store(data + b"\x00" * 16)


def test_refuses_a_flipped_bit_that_breaks_the_header_json():
    data = bytearray(encode_store(_store()))
    data[20] ^= 0x01  # '{' -> 'z'
    with pytest.raises(BundleError, match="not valid UTF-8 JSON"):
        decode_store(bytes(data))
    data[20] ^= 0x01
    data[21] ^= 0x80  # '"' -> a byte that is not UTF-8
    with pytest.raises(BundleError, match="not valid UTF-8 JSON"):
        decode_store(bytes(data))


def _entry(dtype="<f4", shape=(4,), offset=0, nbytes=16):
    return {"dtype": dtype, "shape": list(shape), "offset": offset, "bytes": nbytes}


@pytest.mark.parametrize("arrays, payload, match", [
    ({"a": _entry(offset=16)}, 16, "run past the end of the payload"),
    ({"a": _entry(), "b": _entry(nbytes=32, shape=(8,))}, 32, "overlap"),
    ({"a": _entry(dtype="<f8", nbytes=32)}, 32, "dtype '<f8' is not allowed"),
    ({"a": _entry(dtype="O")}, 16, "is not allowed"),
    ({"a": _entry(shape=(5,))}, 16, "is 20 bytes, the header says 16"),
    ({"a": _entry(offset=8, nbytes=8, shape=(2,))}, 16, "multiple of 16"),
    ({"a": _entry(offset=-16)}, 16, "offset must be"),
    ({"a": _entry(shape=(2, -2))}, 16, "shape must be"),
    ({"a": _entry(shape=(4.0,))}, 16, "shape must be"),
    ({"a": {"dtype": "<f4", "shape": [4], "offset": 0}}, 16, "expected keys"),
])
def test_refuses_bad_array_entries(arrays, payload, match):
    with pytest.raises(BundleError, match=match):
        decode_store(_raw({"index": {}, "arrays": arrays}, b"\x00" * payload))


def test_refuses_headers_of_the_wrong_shape():
    for header in ({"index": {}}, {"index": [], "arrays": {}}, {"index": {}, "arrays": {},
                                                                 "extra": 1}):
        with pytest.raises(BundleError, match="exactly the keys"):
            decode_store(_raw(header, b""))
    dup = _prefix(b'{"arrays":{},"index":{},"index":{}}')
    with pytest.raises(BundleError, match="duplicate key 'index'"):
        decode_store(dup + b"\x00" * (-len(dup) % ALIGN))


def test_refuses_non_zero_header_padding():
    head = _prefix(b'{"arrays":{},"index":{}}')
    with pytest.raises(BundleError, match="padding after the header"):
        decode_store(head + b"\x01" * (-len(head) % ALIGN))


# ------------------------------------------------------------------ version 2: deflated
def _v2(inner: bytes, stream: bytes | None = None, declared: int | None = None) -> bytes:
    """A version-2 file by hand: prefix (magic, 2, declared length) + ``stream`` (default: the
    zlib stream of ``inner``)."""
    stream = zlib.compress(inner, 9) if stream is None else stream
    return struct.pack("<8sIQ", MAGIC, 2, len(inner) if declared is None else declared) + stream


def _compressible() -> Store:
    """Mostly-repeating int8 codes, float16 folds, uint8 packed indices: like a real store."""
    rng = np.random.default_rng(1)
    return Store(index={"layers": {"fc": {"bits": 4}}},
                 arrays={"fc/codes": rng.integers(-3, 4, (64, 96)).astype(np.int8),
                         "fc/sfold": np.repeat(rng.normal(size=8), 16).astype(np.float16),
                         "fc/idx": np.tile(np.arange(16, dtype=np.uint8), 200),
                         "empty": np.zeros((0,), np.uint16)})


@pytest.mark.parametrize("make", [_store, _compressible, Store])
def test_version_2_round_trips_every_dtype_and_an_empty_array(make):
    store = make()
    v1, v2 = encode_store(store), encode_store(store, compress=True)
    assert v2[:8] == MAGIC and struct.unpack_from("<IQ", v2, 8) == (2, len(v1))
    assert zlib.decompress(v2[20:]) == v1  # a plain zlib stream of the version-1 bytes
    assert compress_store(v1) == v2 and encode_store(store, compress=True) == v2
    out = decode_store(v2)
    assert out.index == store.index and set(out.arrays) == set(store.arrays)
    for name, a in store.arrays.items():
        b = out.arrays[name]
        assert b.shape == a.shape and b.dtype == a.dtype.newbyteorder("<")
        np.testing.assert_array_equal(b, a)
        assert not b.flags.writeable
    # zero-copy: every non-empty array sits at its header offset in one buffer (the inflated
    # version-1 bytes, whose size the store records), not in a copy of its own
    assert out.nbytes == len(v1) == decode_store(v1).nbytes
    hlen = struct.unpack_from("<Q", v1, 12)[0]
    entries = json.loads(v1[20:20 + hlen])["arrays"]
    base = {out.arrays[n].__array_interface__["data"][0] - e["offset"]
            for n, e in entries.items() if e["bytes"]}
    assert len(base) == (1 if any(e["bytes"] for e in entries.values()) else 0)


def test_version_1_is_still_the_default_and_still_decodes():
    store = _compressible()
    v1 = encode_store(store)
    assert struct.unpack_from("<I", v1, 8)[0] == 1
    assert decode_store(v1).arrays["fc/codes"].tolist() == store.arrays["fc/codes"].tolist()


def test_version_2_is_smaller_for_a_compressible_store():
    store = _compressible()
    v1, v2 = encode_store(store), encode_store(store, compress=True)
    assert len(v2) < len(v1) / 2


def test_version_2_refuses_a_truncated_stream():
    v2 = encode_store(_compressible(), compress=True)
    for cut in (1, 4, len(v2) // 2):  # the adler32, mid-stream
        with pytest.raises(BundleError, match="truncated"):
            decode_store(v2[:-cut])
    with pytest.raises(BundleError, match="truncated"):
        decode_store(v2[:20])  # a prefix and no stream at all


def test_version_2_refuses_bytes_after_the_stream():
    v2 = encode_store(_compressible(), compress=True)
    with pytest.raises(BundleError, match="1 bytes after the compressed stream, expected none"):
        decode_store(v2 + b"\x00")
    with pytest.raises(BundleError, match="bytes after the compressed stream"):
        decode_store(v2 + v2[20:])  # a second complete stream


def test_version_2_refuses_a_wrong_declared_length():
    v1 = encode_store(_compressible())
    with pytest.raises(BundleError, match=f"more than the {len(v1) - 1} bytes the prefix"):
        decode_store(_v2(v1, declared=len(v1) - 1))
    with pytest.raises(BundleError, match="more than the 0 bytes"):
        decode_store(_v2(v1, declared=0))
    with pytest.raises(BundleError, match=f"inflates to {len(v1)} bytes, the prefix declares "
                                          f"{len(v1) + 1}"):
        decode_store(_v2(v1, declared=len(v1) + 1))


def test_version_2_never_inflates_more_than_the_declared_length(monkeypatch):
    """The bound is the decompressor's max_length, not a check after inflating everything: a
    small declared length over a huge stream (a zip bomb) produces at most that + 1 bytes."""
    made = []
    real = zlib.decompressobj

    class Spy:
        def __init__(self):
            self._d = real()

        def decompress(self, data, max_length=0):
            out = self._d.decompress(data, max_length)
            made.append((max_length, len(out)))
            return out

        def __getattr__(self, name):
            return getattr(self._d, name)

    monkeypatch.setattr(zlib, "decompressobj", Spy)
    bomb = _v2(b"", stream=zlib.compress(b"\x00" * (64 << 20), 9), declared=1000)
    # (issue 36) streamed: the inflated prefix's magic is checked as soon as it exists
    with pytest.raises(BundleError, match="the inflated store: magic b'.{0,40}', expected"):
        decode_store(bomb)
    assert made == [(1001, 1001)]


def test_version_2_refuses_a_declared_length_above_the_cap(monkeypatch):
    import edge_sdk.store.container as container

    def never():
        raise AssertionError("nothing may be inflated for a length above the cap")

    monkeypatch.setattr(container.zlib, "decompressobj", never)
    with pytest.raises(BundleError, match=f"declares {MAX_INNER_BYTES + 1} inflated bytes, "
                                          f"above the {MAX_INNER_BYTES} accepted"):
        decode_store(_v2(b"", stream=b"", declared=MAX_INNER_BYTES + 1))
    with pytest.raises(BundleError, match="above the"):
        decode_store(_v2(b"", stream=b"", declared=2 ** 64 - 1))


def test_version_2_refuses_a_nested_version_2():
    v2 = encode_store(_compressible(), compress=True)
    with pytest.raises(BundleError, match="holds a format version 2 store, expected 1 .*never "
                                          "nested"):
        decode_store(_v2(v2))
    with pytest.raises(ConfigError, match="version-1 store"):
        compress_store(v2)  # the writer refuses to nest too
    with pytest.raises(BundleError, match="inflated store: magic b'NOTASTOR'"):
        decode_store(_v2(b"NOTASTOR" + bytes(v2[8:])))
    with pytest.raises(BundleError, match="inflated store: 3 bytes, shorter than"):
        decode_store(_v2(b"EDG"))


def test_version_2_refuses_a_flipped_bit_in_the_stream():
    v2 = bytearray(encode_store(_compressible(), compress=True))
    v2[-1] ^= 0x01  # the adler32 of the inflated bytes: zlib's own check
    with pytest.raises(BundleError, match=r"does not inflate \(.*incorrect data check"):
        decode_store(bytes(v2))
    v2[-1] ^= 0x01
    decode_store(bytes(v2))  # restored: decodes again
    for pos in range(20, len(v2) - 5, max(1, (len(v2) - 25) // 25)):  # zlib header, deflate data
        bad = bytearray(v2)
        bad[pos] ^= 0x04
        with pytest.raises(BundleError, match="^store: "):
            decode_store(bytes(bad))


def test_version_2_inner_errors_are_the_version_1_refusals():
    """The inflated bytes are checked like a version-1 file: a bad body inside a good stream is
    refused with the same message."""
    v1 = bytearray(encode_store(_store()))
    v1[20] ^= 0x01  # header JSON
    with pytest.raises(BundleError, match="not valid UTF-8 JSON"):
        decode_store(_v2(bytes(v1)))
    with pytest.raises(BundleError, match="run past the end of the payload"):
        decode_store(_v2(encode_store(_store())[:-1]))


def test_a_megabyte_declaring_a_gibibyte_is_refused_before_inflating(monkeypatch):
    """(issue 36) a ratio far above any store's (they inflate under 2x) is refused before the
    decompressor runs at all (it used to cost 7.6 s and 2.1 GB before the typed refusal)."""
    calls = []
    real = zlib.decompressobj
    monkeypatch.setattr(zlib, "decompressobj", lambda: calls.append(1) or real())
    stream = zlib.compress(b"\x00" * (64 << 20), 9)  # ~64 kB: a 1000x ratio, as a bomb's
    with pytest.raises(BundleError, match=r"a ratio above the 32x accepted"):
        decode_store(_v2(b"", stream=stream, declared=64 << 20))
    assert calls == []


def test_garbage_inside_a_plausible_stream_is_refused_after_one_chunk(monkeypatch):
    """A declared length within the ratio cap whose inflated bytes are not a store: refused at
    the first megabyte (the inner magic), never inflated to the end."""
    import edge_sdk.store.container as container

    made = []
    real = zlib.decompressobj

    class Spy:
        def __init__(self):
            self._d = real()

        def decompress(self, data, max_length=0):
            out = self._d.decompress(data, max_length)
            made.append(len(out))
            return out

        def __getattr__(self, name):
            return getattr(self._d, name)

    monkeypatch.setattr(zlib, "decompressobj", Spy)
    raw = np.random.default_rng(0).integers(0, 4, 8 << 20, dtype=np.uint8).tobytes()
    stream = zlib.compress(raw, 1)
    with pytest.raises(BundleError, match="the inflated store: magic"):
        decode_store(_v2(b"", stream=stream, declared=len(raw)))
    assert made == [container._CHUNK]


def test_a_deeply_nested_header_is_a_typed_error():
    """(issue 36) json's RecursionError on a header nested 200,000 deep is a BundleError."""
    header = b"[" * 200_000 + b"]" * 200_000
    data = container_prefix(len(header)) + header
    with pytest.raises(BundleError, match="nested too deeply"):
        decode_store(data)


def container_prefix(hlen: int) -> bytes:
    from edge_sdk.store.container import _PREFIX, FORMAT_VERSION, MAGIC

    return _PREFIX.pack(MAGIC, FORMAT_VERSION, hlen)
