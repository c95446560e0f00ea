"""edge_sdk.store.sampler, hash32-v1 (docs/store.md section 4): pinned bits and the statistics."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edge_sdk.errors import ConfigError
from edge_sdk.store.sampler import (NORMAL_BOUND, NORMAL_SCALE, SAMPLER, categorical, hash32,
                                    normal, stream_id, uniform_u16, uniform_u32)

M = 0xFFFFFFFF
GOLDEN = 0x9E3779B9


def ref_hash(x: int) -> int:
    """lowbias32 in pure Python ints: the documented algorithm, independent of numpy."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M
    x ^= x >> 15
    x = (x * 0x846CA68B) & M
    x ^= x >> 16
    return x


def ref_word(seed: int, stream: int, domain: int, c: int) -> int:
    k1 = ref_hash(ref_hash(seed) ^ ref_hash((stream + GOLDEN) & M) ^ domain)
    k2 = ref_hash(k1 ^ GOLDEN)
    return ref_hash((ref_hash(c ^ k1) + k2) & M)


def ref_normal(seed: int, stream: int, j: int) -> np.float32:
    w0, w1 = ref_word(seed, stream, 2, 2 * j), ref_word(seed, stream, 2, 2 * j + 1)
    total = (w0 & 0xFFFF) + (w0 >> 16) + (w1 & 0xFFFF) + (w1 >> 16) - 131070
    return np.float32(total) * np.float32(NORMAL_SCALE)


def test_version_and_the_pinned_scale():
    assert SAMPLER == "hash32-v1"
    assert NORMAL_SCALE.dtype == np.float32
    assert NORMAL_SCALE == np.float32(math.sqrt(3 / (65536**2 - 1)))
    assert NORMAL_BOUND <= 2 * math.sqrt(3)


@pytest.mark.parametrize("x", [1, 0xDEADBEEF, 0x9E3779B9])
def test_the_hash_is_lowbias32(x):
    assert int(hash32(x)[0]) == ref_hash(x)


def test_the_whole_stream_matches_the_pure_python_reference():
    s = stream_id("features.3.conv")
    np.testing.assert_array_equal(uniform_u32(5, s, 6, offset=10),
                                  [ref_word(5, s, 1, c) for c in range(10, 16)])
    got = normal(5, s, 4, offset=3)
    want = np.array([ref_normal(5, s, j) for j in range(3, 7)], dtype=np.float32)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


# (seed, layer name, element i) -> the float32 bits of normal(seed, stream_id(name))[i].
# Pinned on purpose: a change to the documented algorithm must show up here (and bump SAMPLER).
GOLDEN_NORMALS = [
    (0, "features.0", 0, 0xBFD67847),
    (1, "features.0", 1, 0x3CD68ECB),
    (7, "classifier", 12345, 0xBE0C4BCE),
    (2**32 - 1, "layer4.1.conv2", 999_999, 0x4013B389),
]


@pytest.mark.parametrize("seed, name, i, bits", GOLDEN_NORMALS)
def test_golden_normals(seed, name, i, bits):
    s = stream_id(name)
    assert int(normal(seed, s, 1, offset=i).view(np.uint32)[0]) == bits
    assert int(ref_normal(seed, s, i).view(np.uint32)) == bits
    if i < 20_000:  # the offset form and the full draw agree
        assert int(normal(seed, s, i + 1).view(np.uint32)[i]) == bits


def test_stream_id_is_fnv1a_of_the_utf8_name():
    assert stream_id("") == 0x811C9DC5
    assert stream_id("a") == 0xE40C292C  # the published FNV-1a 32 test vectors
    assert stream_id("foobar") == 0xBF9CF968
    assert stream_id("features.0") == 0xA993A754 != stream_id("features.1")
    with pytest.raises(ConfigError):
        stream_id(b"a")


def test_same_key_same_bits_other_key_other_bits():
    a = normal(3, 11, 1000)
    assert a.tobytes() == normal(3, 11, 1000).tobytes()
    for other in (normal(4, 11, 1000), normal(3, 12, 1000)):
        assert (a != other).mean() > 0.99
    u = uniform_u16(3, 11, 1000)
    assert u.dtype == np.uint16 and u.tobytes() == uniform_u16(3, 11, 1000).tobytes()
    assert (u != uniform_u16(3, 12, 1000)).mean() > 0.99
    np.testing.assert_array_equal(uniform_u16(3, 11, 10, offset=990), u[990:])


def test_streams_are_not_shifted_copies_of_each_other():
    a, b = uniform_u32(1, 100, 1 << 16), uniform_u32(1, 101, 1 << 16)
    assert len(np.intersect1d(a, b)) < 10  # ~1 expected for independent draws


def test_normal_moments_and_bounds():
    x = normal(12, stream_id("stats"), 1_000_000).astype(np.float64)
    assert abs(x.mean()) < 5e-3  # standard error 1e-3
    assert abs(x.var() - 1) < 7e-3  # standard error ~1.3e-3
    kurt = ((x - x.mean()) ** 4).mean() / x.var() ** 2 - 3
    assert abs(kurt - (-0.3)) < 0.03  # Irwin-Hall n=4: -6/(5n)
    assert np.abs(x).max() <= NORMAL_BOUND < 2 * math.sqrt(3)
    assert np.abs(x).max() > 3.0  # the tails are reached
    y = normal(13, stream_id("stats"), 1_000_000).astype(np.float64)
    assert abs(np.corrcoef(x, y)[0, 1]) < 5e-3


def test_uniform_u16_is_uniform():
    u = uniform_u16(9, 9, 1_600_000)
    counts = np.bincount(u >> 12, minlength=16)  # 16 bins of 100,000 expected
    chi2 = ((counts - 100_000) ** 2 / 100_000).sum()
    assert chi2 < 50  # 15 degrees of freedom: p ~ 1e-5


def test_categorical_frequencies_match_the_thresholds():
    p = np.array([0.1, 0.0, 0.25, 0.65])
    cum = np.round(np.cumsum(p) * 65536).astype(np.int64)
    cum[-1] = 65535  # the last threshold is not read
    n = 200_000
    t16 = np.tile(cum.astype(np.uint16), (n, 1))
    draws = categorical(21, stream_id("sqs.0"), t16)
    assert draws.shape == (n,) and draws.min() >= 0 and draws.max() <= 3
    freq = np.bincount(draws, minlength=4) / n
    assert freq[1] == 0  # a zero-probability entry is never drawn
    np.testing.assert_allclose(freq, p, atol=5 * math.sqrt(0.25 / n))
    # uint32 thresholds at the same scale (t << 16) give the very same draws
    t32 = t16.astype(np.uint32) << 16
    np.testing.assert_array_equal(categorical(21, stream_id("sqs.0"), t32), draws)


def test_categorical_edge_cases():
    assert categorical(0, 0, np.full((5, 1), 7, dtype=np.uint16)).tolist() == [0] * 5
    assert categorical(0, 0, np.zeros((0, 3), dtype=np.uint16)).shape == (0,)
    rows = np.array([[0, 0, 65535], [65535, 65535, 65535]], dtype=np.uint16)
    assert categorical(0, 0, rows).tolist() == [2, 0]  # u >= 0 always; u < 65535 nearly always
    with pytest.raises(ConfigError, match="non-decreasing"):
        categorical(0, 0, np.array([[5, 3, 9]], dtype=np.uint16))
    with pytest.raises(ConfigError, match="uint16 or uint32"):
        categorical(0, 0, np.array([[0.5, 1.0]]))


@pytest.mark.parametrize("kwargs", [{"seed": -1}, {"seed": 2**32}, {"stream": 1.0},
                                    {"n": -1}, {"offset": 2**31}])
def test_bad_arguments_are_refused(kwargs):
    args = {"seed": 0, "stream": 0, "n": 1, "offset": 0} | kwargs
    with pytest.raises(ConfigError):
        normal(**args)


def test_no_overflow_warning(recwarn):
    normal(2**32 - 1, 2**32 - 1, 1000, offset=5)
    uniform_u16(2**32 - 1, 0, 10)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
