"""The store's sigma coding (exporters.sigma_code, docs/store.md §2): the relative coding where
alpha = (sigma / |mu|)^2 is (nearly) one value per layer, the version-2 absolute one otherwise,
and what the device decodes from either (edge_sdk.store.materialize)."""
import numpy as np
import pytest

from edge_sdk.errors import BundleError, ConfigError
from edge_sdk.store import Store, decode_store, encode_store, normal, stream_id
from edge_sdk.store.decode import decode_point, sample_weights, sigma_reference
from edge_sdk.store.packing import pack_bits
from edge_sdk.tflite.quant import along, quantize_per_channel
from exporters.sigma_code import REL_TOL, code_sigma, encode_sigma, lloyd_log, relative_code

RNG = np.random.default_rng(0)


def _layer(shape=(6, 5, 3, 3), zeros=0.2):
    mu = RNG.normal(0, 0.2, shape).astype(np.float32)
    mu[RNG.random(shape) < zeros] = 0  # exact zeros: their int8 code is 0 too
    qt = quantize_per_channel(mu, 0)
    mu_dec = qt.values.astype(np.float32) * along(qt.scale, 0, mu.ndim)
    return mu, mu_dec, qt.scale.astype(np.float32)


def test_the_reference_is_the_decoded_weight_floored_at_half_a_step():
    mu_dec = np.array([[0.0, 0.3, -0.05], [0.0, -0.2, 1.0]], np.float32)
    step = np.array([0.2, 0.01], np.float32)
    ref = sigma_reference(mu_dec, step)
    assert ref.dtype == np.float32
    np.testing.assert_array_equal(ref, np.float32([[0.1, 0.3, 0.1], [0.005, 0.2, 1.0]]))


def test_a_constant_alpha_layer_needs_zero_bits():
    """sigma = |mu_dec| * c (alpha one value): one multiplier, no index bytes, sigma exact to
    float32 rounding; a weight whose mean decodes to 0 takes c * step / 2."""
    _, mu_dec, step = _layer()
    ref = sigma_reference(mu_dec, step).reshape(-1)
    sigma = (ref.astype(np.float64) * 0.135).reshape(mu_dec.shape)
    c = code_sigma(sigma, mu_dec, step)
    assert (c.coding, c.bits, c.book.size) == ("relative", 0, 1)
    assert c.book[0] == np.float32(0.135) and not pack_bits(c.idx, c.bits)
    np.testing.assert_allclose(c.decode(ref), sigma.reshape(-1), rtol=1e-6)
    assert c.rms < 1e-6


def test_sigma_zero_is_an_exact_entry():
    """PWFN's fixed weights (sigma 0) decode to exactly 0; the others are one alpha: one bit
    (0 and the multiplier)."""
    _, mu_dec, step = _layer()
    ref = sigma_reference(mu_dec, step).reshape(-1)
    sigma = ref.astype(np.float64) * 0.2
    sigma[::7] = 0
    c = code_sigma(sigma, mu_dec, step)
    assert (c.coding, c.bits) == ("relative", 1)
    got = c.decode(ref)
    assert (got[sigma == 0] == 0).all() and (got[sigma > 0] > 0).all()
    np.testing.assert_allclose(got, sigma, rtol=1e-6)


def test_all_sigma_zero_is_one_zero_entry():
    _, mu_dec, step = _layer()
    c = code_sigma(np.zeros(mu_dec.shape), mu_dec, step)
    assert c.bits == 0 and (c.decode() == 0).all()


def test_a_spread_alpha_keeps_the_absolute_coding():
    """alpha spread per weight (log alpha ~ N(0, 1)): no 0/1-bit relative code is within
    REL_TOL, so sigma keeps the version-2 4-bit absolute codebook, bytes unchanged."""
    _, mu_dec, step = _layer()
    ref = sigma_reference(mu_dec, step).reshape(-1).astype(np.float64)
    sigma = ref * np.exp(RNG.normal(-2, 1, ref.size))
    c = code_sigma(sigma, mu_dec, step, bits=4)
    book, idx = encode_sigma(sigma, 4)
    assert c.coding == "absolute" and c.bits == 4
    np.testing.assert_array_equal(c.book, book)
    np.testing.assert_array_equal(c.idx, idx)
    assert relative_code(sigma, mu_dec, step, 1).rms > REL_TOL
    assert code_sigma(sigma, mu_dec, step, rel_tol=None).coding == "absolute"


def test_two_alphas_take_one_bit():
    _, mu_dec, step = _layer()
    ref = sigma_reference(mu_dec, step).reshape(-1).astype(np.float64)
    sigma = ref * np.where(RNG.random(ref.size) < 0.3, 0.05, 0.4)
    c = code_sigma(sigma, mu_dec, step)
    assert (c.coding, c.bits) == ("relative", 1)
    np.testing.assert_allclose(c.decode(ref), sigma, rtol=1e-6)


def test_bad_sigma_is_refused():
    _, mu_dec, step = _layer()
    with pytest.raises(ConfigError, match="finite and >= 0"):
        code_sigma(-np.ones(mu_dec.shape), mu_dec, step)
    with pytest.raises(ConfigError, match="values"):
        code_sigma(np.ones(3), mu_dec, step)


def test_lloyd_keeps_at_most_the_distinct_values():
    np.testing.assert_array_equal(lloyd_log(np.array([1.0, 1.0, 2.0]), 4), [1.0, 2.0])
    c = lloyd_log(np.r_[np.zeros(50), np.ones(50)], 2)
    np.testing.assert_allclose(c, [0.0, 1.0])


def _store(coding: str | None, version: int, sigma_bits: int, book, idx, mu, step):
    qt_codes = np.rint(mu / along(step, 0, mu.ndim)).astype(np.int8)
    layer = {"kind": "conv", "shape": list(mu.shape), "encoding": "int8", "bits": 8,
             "route": "int8", "sampler": "normal", "sigma_bits": sigma_bits}
    if coding:
        layer["sigma_coding"] = coding
    index = {"version": version, "sampler": "hash32-v1", "posterior": "gaussian", "seed": 5,
             "weights": "dequantize", "classifier": "c", "samples": 2, "layers": {"c": layer},
             "widths": {}}
    arrays = {"c/codes": qt_codes, "c/step": step,
              "c/sigma_codebook": np.asarray(book, np.float32),
              "c/sigma_index": np.frombuffer(pack_bits(idx, sigma_bits), np.uint8).copy()}
    return decode_store(encode_store(Store(index, arrays)))


def test_the_device_draws_a_relative_sigma_as_the_exporter_coded_it():
    """A version-3 store with a 0-bit relative sigma: sample s = mu_dec + book[0] * max(|mu|,
    step/2) * eps(seed + s), float32; a narrow width's draw is the prefix of the full one."""
    _, mu_dec, step = _layer()
    store = _store("relative", 3, 0, [0.125], np.zeros(mu_dec.size, int), mu_dec, step)
    assert store.array("c/sigma_index").size == 0
    mu = decode_point(store, "c")
    np.testing.assert_array_equal(mu, mu_dec)
    for s in range(2):
        eps = normal(5 + s, stream_id("c"), mu.size)
        want = mu.reshape(-1) + (np.float32(0.125) * sigma_reference(mu, step).reshape(-1)) * eps
        got = sample_weights(store, "c", s)
        np.testing.assert_array_equal(got.reshape(-1), want.astype(np.float32))
        np.testing.assert_array_equal(sample_weights(store, "c", s, out=2), got[:2])


def test_an_absolute_sigma_reads_in_a_version_2_and_a_version_3_store():
    _, mu_dec, step = _layer()
    sigma = np.abs(RNG.normal(0.05, 0.01, mu_dec.size))
    book, idx = encode_sigma(sigma, 4)
    a = _store(None, 2, 4, book, idx, mu_dec, step)
    b = _store(None, 3, 4, book, idx, mu_dec, step)
    eps = normal(5, stream_id("c"), mu_dec.size)
    want = (mu_dec.reshape(-1) + book[idx] * eps).astype(np.float32)
    for st in (a, b):
        np.testing.assert_array_equal(sample_weights(st, "c", 0).reshape(-1), want)


def test_a_relative_sigma_in_a_version_2_index_or_an_unknown_coding_is_refused():
    _, mu_dec, step = _layer()
    zero = np.zeros(mu_dec.size, int)
    with pytest.raises(BundleError, match="sigma_coding 'relative' in a version 2 index"):
        sample_weights(_store("relative", 2, 0, [0.1], zero, mu_dec, step), "c", 0)
    with pytest.raises(BundleError, match="sigma_coding 'log'"):
        sample_weights(_store("log", 3, 0, [0.1], zero, mu_dec, step), "c", 0)
