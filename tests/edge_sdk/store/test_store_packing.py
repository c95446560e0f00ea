"""edge_sdk.store.packing: bit-packed codebook indices (docs/store.md section 2)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_sdk.errors import BundleError, ConfigError
from edge_sdk.store.packing import (bits_for, pack_bits, pack_mask, packed_size, unpack_bits,
                                    unpack_lookup, unpack_mask)


@pytest.mark.parametrize("k, bits", [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (16, 4), (17, 5),
                                     (256, 8), (257, 9), (2**16, 16), (2**16 + 1, 17),
                                     (2**32, 32)])
def test_bits_for_is_ceil_log2(k, bits):
    assert bits_for(k) == bits


@pytest.mark.parametrize("k", [0, -3, 2**32 + 1, 2.0, True, "4"])
def test_bits_for_refuses_what_is_not_a_codebook_size(k):
    with pytest.raises(ConfigError):
        bits_for(k)


def test_the_bit_order_is_little_endian_lsb_first():
    # 1 = b01, 2 = b10, 3 = b11 at 2 bits: stream bits 1,0, 0,1, 1,1, pad 0,0 -> 0b00111001
    assert pack_bits(np.array([1, 2, 3]), 2) == bytes([0x39])
    assert pack_bits(np.array([0x1234]), 16) == b"\x34\x12"
    assert pack_bits(np.array([5, 1]), 3) == bytes([0b00001101])


@pytest.mark.parametrize("k", [1, 2, 4, 8, 256, 2**12, 3, 5, 9, 17, 257, 2**12 + 1, 2**20 + 1])
@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 1001])
def test_round_trip_at_every_codebook_size(k, count):
    bits = bits_for(k)
    rng = np.random.default_rng(k * 1000 + count)
    idx = rng.integers(0, k, size=count)
    idx[:1] = k - 1  # the largest index is stored too
    buf = pack_bits(idx, bits)
    assert len(buf) == packed_size(count, bits) == (count * bits + 7) // 8
    out = unpack_bits(buf, bits, count)
    assert out.dtype == (np.uint16 if bits <= 16 else np.uint32)
    assert out.shape == (count,)
    np.testing.assert_array_equal(out, idx)


def test_one_entry_codebook_stores_nothing():
    assert pack_bits(np.zeros((3, 4), dtype=np.int64), 0) == b""
    np.testing.assert_array_equal(unpack_bits(b"", 0, 12), np.zeros(12))
    with pytest.raises(ConfigError, match="does not fit in 0 bits"):
        pack_bits(np.array([0, 1]), 0)
    with pytest.raises(BundleError, match="expected 0 bytes"):
        unpack_bits(b"\x00", 0, 12)


def test_empty_and_shaped_input():
    assert pack_bits(np.array([], dtype=np.uint8), 5) == b""
    assert unpack_bits(b"", 5, 0).shape == (0,)
    grid = np.arange(12).reshape(3, 4)  # read in C order
    np.testing.assert_array_equal(unpack_bits(pack_bits(grid, 4), 4, 12), grid.reshape(-1))


@pytest.mark.parametrize("values, bits", [([0, 4], 2), ([256], 8), ([-1], 8), ([2**16], 16)])
def test_a_value_that_does_not_fit_is_refused(values, bits):
    with pytest.raises(ConfigError, match=f"does not fit in {bits} bits"):
        pack_bits(np.array(values), bits)


def test_non_integer_indices_and_bad_bits_are_refused():
    with pytest.raises(ConfigError, match="integer array"):
        pack_bits(np.array([0.0, 1.0]), 1)
    for bits in (-1, 33, 1.5):
        with pytest.raises(ConfigError, match="bits per index"):
            pack_bits(np.array([0]), bits)


def test_a_buffer_of_the_wrong_length_is_refused_naming_both_sizes():
    buf = pack_bits(np.arange(10) % 8, 3)  # 30 bits -> 4 bytes
    with pytest.raises(BundleError, match="expected 4 bytes .* got 3 bytes"):
        unpack_bits(buf[:3], 3, 10)
    with pytest.raises(BundleError, match="expected 4 bytes .* got 5 bytes"):
        unpack_bits(buf + b"\x00", 3, 10)


def test_non_zero_padding_is_refused():
    buf = bytearray(pack_bits(np.arange(10) % 8, 3))
    buf[-1] |= 0x80  # bit 31: padding
    with pytest.raises(BundleError, match="padding bits"):
        unpack_bits(bytes(buf), 3, 10)


def test_memoryview_input_and_mask_round_trip():
    mask = np.random.default_rng(0).random((5, 7)) < 0.3
    buf = pack_mask(mask.astype(np.float32))  # any dtype: non-zero is True
    assert len(buf) == 5
    np.testing.assert_array_equal(unpack_mask(memoryview(buf), 35), mask.reshape(-1))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 32).flatmap(lambda b: st.tuples(
    st.just(b), st.lists(st.integers(0, 2**b - 1), max_size=70))))
def test_round_trip_property(case):
    bits, values = case
    idx = np.array(values, dtype=np.uint64)
    buf = pack_bits(idx, bits)
    assert len(buf) == (len(values) * bits + 7) // 8
    np.testing.assert_array_equal(unpack_bits(buf, bits, len(values)).astype(np.uint64), idx)


def _reference_unpack(buf: bytes, bits: int, count: int) -> list[int]:
    """The stream format read bit by bit in pure Python (independent of numpy)."""
    stream = int.from_bytes(buf, "little")
    return [(stream >> (i * bits)) & ((1 << bits) - 1) for i in range(count)]


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 7, 8, 12, 16, 17, 26, 32])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 333])
def test_unpack_matches_a_bit_by_bit_reader(bits, count):
    # every width, the fast paths (1, 2, 4, 8, 16, 32 bits) and the general gather alike, at
    # counts that end mid-byte
    idx = np.random.default_rng(bits * 1000 + count).integers(0, 1 << bits, size=count,
                                                              dtype=np.uint64)
    idx[-1] = (1 << bits) - 1
    buf = pack_bits(idx, bits)
    out = unpack_bits(buf, bits, count)
    assert out.dtype == (np.uint16 if bits <= 16 else np.uint32) and out.shape == (count,)
    assert out.tolist() == _reference_unpack(buf, bits, count) == idx.tolist()


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_fast_paths_refuse_non_zero_padding(bits):
    buf = bytearray(pack_bits(np.zeros(3, dtype=np.uint8), bits))  # 3 values: padding left
    buf[-1] |= 0x80
    with pytest.raises(BundleError, match="padding bits"):
        unpack_bits(bytes(buf), bits, 3)


@pytest.mark.parametrize("bits", [0, 1, 2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("count", [0, 1, 3, 7, 8, 9, 333])
@pytest.mark.parametrize("k_less", [0, 1, 3])  # the table has 2**bits - k_less entries
def test_unpack_lookup_is_the_table_at_the_unpacked_indices(bits, count, k_less):
    k = max(1, (1 << bits) - k_less)
    rng = np.random.default_rng(bits * 100 + count * 3 + k_less)
    table = rng.standard_normal(k).astype(np.float32)
    idx = rng.integers(0, k, size=count)
    buf = pack_bits(idx, bits)
    out = unpack_lookup(buf, bits, count, table)
    assert out.dtype == np.float32 and out.shape == (count,)
    assert out.tobytes() == table[unpack_bits(buf, bits, count)].tobytes()


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_unpack_lookup_refuses_an_index_outside_the_table(bits):
    k = max(1, (1 << bits) - 2)
    idx = np.zeros(11, dtype=np.int64)
    idx[5] = k  # the first index without an entry
    with pytest.raises(BundleError, match=f"index {k} outside its {k}-entry codebook"):
        unpack_lookup(pack_bits(idx, bits), bits, 11, np.zeros(k, np.float32))
    with pytest.raises(BundleError, match="outside its 0-entry"):
        unpack_lookup(pack_bits(np.zeros(3, np.int64), bits), bits, 3, np.zeros(0, np.float32))
    buf = bytearray(pack_bits(np.zeros(3, dtype=np.uint8), bits))
    buf[-1] |= 0x80 if 3 * bits % 8 else 0xFF  # a padding bit (unpack_bits refuses it) or 255
    with pytest.raises(BundleError, match="padding bits" if 3 * bits % 8 else "index 255"):
        unpack_lookup(bytes(buf), bits, 3, np.zeros(k, np.float32))
