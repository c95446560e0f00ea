"""edge_sdk.store.container: the store.bin format (deterministic, bounds-checked, zero-copy)."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from edge_sdk.errors import BundleError, ConfigError
from edge_sdk.store.container import (ALIGN, MAGIC, Store, decode_store, encode_store)

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
    data[8] = 2
    with pytest.raises(BundleError, match="format version 2, expected 1"):
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
