"""The SQS sampled store's categoricals (exporters.store.sqs_categorical, docs/store.md §2):
entries below ``min_prob`` are dropped and the rest renormalised before the 16-bit
thresholds; the argmax always stays; ``min_prob=0`` is the earlier rule (only entries whose
quantized mass is 0 dropped). Synthetic tensors, no training."""
from __future__ import annotations

import numpy as np
import torch

from exporters.store import SQS_MIN_PROB, sqs_categorical

TAU = 1.0


def _tensor(probs: np.ndarray) -> tuple[dict, np.ndarray]:
    """An SQS tensor of len(probs) non-zero weights in one window of K components whose
    categorical at TAU is ``probs`` (rows), and its store codebook."""
    n, k = probs.shape
    comp = np.linspace(-1.0, 1.0, k, dtype=np.float32)
    # eq. 9: phi ~ exp(exp(log_resp) / tau); choose exp(log_resp) = tau * log(probs) + c
    with np.errstate(divide="ignore"):
        logits = np.log(probs)
    resp = TAU * (logits - logits.min(axis=1, keepdims=True, where=np.isfinite(logits),
                                      initial=np.inf) + 1.0)
    t = {"mask": torch.ones(n, dtype=torch.bool), "window": torch.zeros(n, dtype=torch.long),
         "valid": torch.ones(1, k, dtype=torch.bool), "codebook": torch.from_numpy(comp[None]),
         "log_resp": torch.from_numpy(np.log(resp).astype(np.float32))}
    return t, comp


PROBS = np.array([[0.97, 0.02, 0.009, 0.001],     # two entries survive 1 %, four 0
                  [0.5, 0.3, 0.15, 0.05],         # all four
                  [0.995, 0.004, 0.0005, 0.0005],  # certain at 1 %, uncertain at 0
                  [0.25, 0.25, 0.25, 0.25]])


def _decoded(cat: dict) -> list[dict[int, float]]:
    """Per uncertain weight: codebook index -> probability from its thresholds."""
    out, e, t = [], 0, 0
    for c in cat["count"]:
        thr = list(cat["thresholds"][t:t + c - 1].astype(int)) + [1 << 16]
        prev = 0
        probs = {}
        for j in range(c):
            probs[int(cat["entries"][e + j])] = (thr[j] - prev) / 65536
            prev = thr[j]
        out.append(probs)
        e, t = e + c, t + c - 1
    return out


def test_small_entries_are_dropped_and_the_rest_renormalised():
    t, book = _tensor(PROBS)
    cat = sqs_categorical(t, TAU, book, min_prob=0.01)
    assert list(cat["uncertain"]) == [True, True, False, True]
    got = _decoded(cat)
    want = PROBS[0, :2] / PROBS[0, :2].sum()
    assert set(got[0]) == {0, 1}
    np.testing.assert_allclose([got[0][0], got[0][1]], want, atol=2 / 65536)
    np.testing.assert_allclose([got[1][j] for j in range(4)], PROBS[1], atol=2 / 65536)
    assert SQS_MIN_PROB > 0  # the exporter's default prunes


def test_min_prob_zero_is_the_earlier_rule_and_pruning_shrinks_the_tables():
    t, book = _tensor(PROBS)
    old = sqs_categorical(t, TAU, book, min_prob=0.0)
    new = sqs_categorical(t, TAU, book)
    assert list(old["uncertain"]) == [True, True, True, True]
    assert old["entries"].size == 4 + 4 + 4 + 4  # every entry of mass >= 1/65536
    np.testing.assert_allclose([_decoded(old)[0][j] for j in range(4)], PROBS[0], atol=2 / 65536)
    assert new["entries"].size < old["entries"].size
    assert new["thresholds"].size < old["thresholds"].size


def test_the_argmax_stays_even_below_min_prob():
    probs = np.full((1, 4), 0.25)
    t, book = _tensor(probs)
    cat = sqs_categorical(t, TAU, book, min_prob=0.5)  # every entry below it
    assert not cat["uncertain"].any()  # one entry left (the argmax): certain
