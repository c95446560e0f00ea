"""edge_sdk.answers.metrics: hand-computed values, properties against brute force, input errors."""
from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_sdk.answers import metrics as m
from edge_sdk.errors import InputError

# Three samples, two classes. Predictions 0, 0, 1 -> correct, wrong, correct.
# Confidences 0.9, 0.6, 0.7; true-class probabilities 0.9, 0.4, 0.7.
PROBS = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]])
LABELS = np.array([0, 1, 1])


# --------------------------------------------------------------------------- hand-computed


def test_accuracy_hand() -> None:
    assert m.accuracy(PROBS, LABELS) == pytest.approx(2 / 3)


def test_nll_hand() -> None:
    # -(ln 0.9 + ln 0.4 + ln 0.7) / 3 = (0.1053605 + 0.9162907 + 0.3566749) / 3
    assert m.nll(PROBS, LABELS) == pytest.approx(0.4594421, abs=1e-7)


def test_nll_clips_at_eps() -> None:
    assert m.nll([[1.0, 0.0]], [1], eps=1e-4) == pytest.approx(-math.log(1e-4))
    assert m.nll([[1.0, 0.0]], [0]) == 0.0


def test_brier_hand() -> None:
    # (0.01 + 0.01) + (0.36 + 0.36) + (0.09 + 0.09) = 0.92, over 3 samples.
    assert m.brier(PROBS, LABELS) == pytest.approx(0.92 / 3)


def test_brier_extremes() -> None:
    assert m.brier([[0.0, 1.0]], [1]) == 0.0
    assert m.brier([[0.0, 1.0]], [0]) == pytest.approx(2.0)


def test_ece_hand_each_sample_in_own_bin() -> None:
    # 15 bins: 0.9, 0.6, 0.7 fall in different bins, so ECE = (|1-0.9| + |0-0.6| + |1-0.7|) / 3.
    assert m.ece(PROBS, LABELS) == pytest.approx(1.0 / 3.0)


def test_ece_hand_one_bin() -> None:
    # 2 bins: all confidences in (0.5, 1]; accuracy 2/3, mean confidence 2.2/3 -> gap 0.2/3.
    assert m.ece(PROBS, LABELS, n_bins=2) == pytest.approx(1.0 / 15.0)


def test_ece_hand_weights_bins_by_count() -> None:
    # Bin of 0.9: 3 samples, 2 correct -> gap |2/3 - 0.9|; bin of 0.6: 1 sample, correct -> 0.4.
    # ECE = 3/4 * 0.7/3 + 1/4 * 0.4 = 0.275 (an unweighted mean over bins would give 0.3167).
    probs = [[0.9, 0.1], [0.9, 0.1], [0.9, 0.1], [0.6, 0.4]]
    assert m.ece(probs, [0, 0, 1, 0]) == pytest.approx(0.275)


def test_reliability_bins_hand() -> None:
    bins = m.reliability_bins(PROBS, LABELS, n_bins=5)
    np.testing.assert_allclose(bins.edges, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    # 0.6 belongs to (0.4, 0.6]; 0.7 to (0.6, 0.8]; 0.9 to (0.8, 1].
    np.testing.assert_array_equal(bins.counts, [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(bins.accuracy, [np.nan, np.nan, 0.0, 1.0, 1.0])
    np.testing.assert_allclose(bins.confidence, [np.nan, np.nan, 0.6, 0.7, 0.9])
    assert bins.ece == pytest.approx(m.ece(PROBS, LABELS, n_bins=5))


def test_reliability_bins_edges_are_upper_inclusive() -> None:
    # Confidence exactly 0.5 goes to (0, 0.5]; exactly 1.0 to the last bin.
    bins = m.reliability_bins([[0.5, 0.5], [1.0, 0.0]], [0, 0], n_bins=2)
    np.testing.assert_array_equal(bins.counts, [1, 1])
    uniform4 = m.reliability_bins([[0.25] * 4], [2], n_bins=4)
    np.testing.assert_array_equal(uniform4.counts, [1, 0, 0, 0])


def test_perfectly_calibrated_has_zero_ece() -> None:
    # Confidence 0.75 and 3 of 4 correct in the same bin.
    probs = [[0.75, 0.25]] * 4
    assert m.ece(probs, [0, 0, 0, 1]) == pytest.approx(0.0)


def test_summarize_matches_individual_metrics() -> None:
    summary = m.summarize(PROBS, LABELS)
    assert summary == {
        "accuracy": m.accuracy(PROBS, LABELS),
        "nll": m.nll(PROBS, LABELS),
        "brier": m.brier(PROBS, LABELS),
        "ece": m.ece(PROBS, LABELS),
    }
    assert all(isinstance(v, float) for v in summary.values())


def test_reliability_plot_draws_on_given_axes() -> None:
    figure = pytest.importorskip("matplotlib.figure")
    ax = figure.Figure().add_subplot()
    bins = m.reliability_bins(PROBS, LABELS, n_bins=5)
    assert bins.plot(ax) is ax
    assert len(ax.patches) == 2 * 3  # accuracy and gap bars for the 3 non-empty bins
    assert "ECE" in ax.get_title()


# --------------------------------------------------------------------------- AUROC


def _brute_force_auroc(scores: list[float], positive: list[bool]) -> float:
    pos = [s for s, p in zip(scores, positive) if p]
    neg = [s for s, p in zip(scores, positive) if not p]
    wins = sum((sp > sn) + 0.5 * (sp == sn) for sp in pos for sn in neg)
    return wins / (len(pos) * len(neg))


@given(
    st.lists(
        st.tuples(st.integers(0, 5).map(float), st.booleans()), min_size=2, max_size=40
    ).filter(lambda xs: len({p for _, p in xs}) == 2)
)
def test_auroc_equals_pairwise_probability(data: list[tuple[float, bool]]) -> None:
    # Scores from a 6-value set, so ties are frequent.
    scores = [s for s, _ in data]
    positive = [p for _, p in data]
    assert m.auroc(scores, positive) == pytest.approx(_brute_force_auroc(scores, positive))


def test_auroc_obvious_cases() -> None:
    positive = [False, False, True, True]
    assert m.auroc([0.1, 0.2, 0.8, 0.9], positive) == 1.0
    assert m.auroc([0.9, 0.8, 0.2, 0.1], positive) == 0.0
    assert m.auroc([0.5, 0.5, 0.5, 0.5], positive) == 0.5
    assert m.auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0


def test_ood_auroc_out_is_positive() -> None:
    assert m.ood_auroc([0.1, 0.2], [0.8, 0.9]) == 1.0
    assert m.ood_auroc([0.8, 0.9], [0.1, 0.2]) == 0.0
    # (out, in) pairs: 0.5>0.2, 0.5=0.5 (half), 0.9>0.2, 0.9>0.5 -> 3.5 / 4.
    assert m.ood_auroc([0.2, 0.5], [0.5, 0.9]) == pytest.approx(0.875)


def test_auroc_needs_both_classes() -> None:
    with pytest.raises(InputError, match="is_positive.*both classes"):
        m.auroc([0.1, 0.2], [True, True])
    with pytest.raises(InputError, match="scores_out"):
        m.ood_auroc([0.1], [])


# --------------------------------------------------------------------------- uncertainty

_distributions = st.integers(2, 5).flatmap(
    lambda c: st.lists(
        st.lists(st.floats(0.0, 1.0), min_size=c, max_size=c).filter(lambda r: sum(r) > 1e-3),
        min_size=1,
        max_size=6,
    )
)


@given(_distributions, st.integers(1, 4))
def test_mutual_information_non_negative(rows: list[list[float]], n_inputs: int) -> None:
    p = np.array(rows) / np.sum(rows, axis=1, keepdims=True)  # [S, C]
    probs_s = np.repeat(p[:, None, :], n_inputs, axis=1)  # [S, N, C]
    mi = m.mutual_information(probs_s)
    assert mi.shape == (n_inputs,)
    assert np.all(mi >= 0.0)
    # MI = H[mean] - mean H, and each entropy is within [0, log C].
    pe, ee = m.predictive_entropy(probs_s), m.expected_entropy(probs_s)
    assert np.all(pe <= math.log(p.shape[1]) + 1e-9)
    np.testing.assert_allclose(mi, np.maximum(pe - ee, 0.0))


def test_mutual_information_zero_when_samples_agree() -> None:
    p = np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]])
    probs_s = np.stack([p, p, p])
    np.testing.assert_allclose(m.mutual_information(probs_s), [0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(m.predictive_entropy(probs_s), m.expected_entropy(probs_s))


def test_mutual_information_positive_when_samples_disagree() -> None:
    # Two confident samples that disagree: mean is uniform (H = ln 2), each sample has H = 0.
    probs_s = [[[1.0, 0.0]], [[0.0, 1.0]]]
    assert m.predictive_entropy(probs_s) == pytest.approx([math.log(2)])
    assert m.expected_entropy(probs_s) == pytest.approx([0.0])
    assert m.mutual_information(probs_s) == pytest.approx([math.log(2)])


@pytest.mark.parametrize("n_classes", [2, 3, 10])
def test_predictive_entropy_of_uniform_is_log_c(n_classes: int) -> None:
    probs = np.full((4, n_classes), 1.0 / n_classes)
    np.testing.assert_allclose(m.predictive_entropy(probs), math.log(n_classes))


@pytest.mark.filterwarnings("error")
def test_entropy_of_one_hot_is_zero_without_warnings() -> None:
    probs = [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]  # [N, C] is a single sample
    np.testing.assert_array_equal(m.predictive_entropy(probs), [0.0, 0.0])
    np.testing.assert_array_equal(m.mutual_information(probs), [0.0, 0.0])


def test_entropy_hand() -> None:
    # H([0.5, 0.25, 0.25]) = 0.5 ln 2 + 2 * 0.25 ln 4 = 1.5 ln 2
    assert m.predictive_entropy([[0.5, 0.25, 0.25]]) == pytest.approx([1.5 * math.log(2)])


# --------------------------------------------------------------------------- softmax


def test_softmax_hand() -> None:
    np.testing.assert_allclose(m.softmax([0.0, math.log(3)]), [0.25, 0.75])
    np.testing.assert_allclose(m.softmax([0.0, 2 * math.log(3)], temperature=2.0), [0.25, 0.75])
    np.testing.assert_allclose(m.softmax([[0.0, 1.0], [0.0, 1.0]], axis=0), [[0.5, 0.5]] * 2)


@pytest.mark.filterwarnings("error")
def test_softmax_is_stable_for_large_logits() -> None:
    np.testing.assert_allclose(m.softmax([1000.0, 1000.0]), [0.5, 0.5])
    np.testing.assert_allclose(m.softmax([-1000.0, 0.0]), [0.0, 1.0])
    np.testing.assert_allclose(m.log_softmax([-1000.0, 0.0]), [-1000.0, 0.0])


def test_softmax_keeps_float32() -> None:
    assert m.softmax(np.zeros((2, 3), dtype=np.float32)).dtype == np.float32
    assert m.softmax([1, 2, 3]).dtype == np.float64


@given(
    st.lists(st.floats(-50, 50), min_size=1, max_size=8),
    st.floats(0.1, 10.0),
)
def test_log_softmax_matches_softmax(logits: list[float], temperature: float) -> None:
    p = m.softmax(logits, temperature=temperature)
    assert p.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(
        np.exp(m.log_softmax(logits, temperature=temperature)), p, rtol=1e-10, atol=1e-300
    )


# --------------------------------------------------------------------------- input errors


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda: m.accuracy([0.5, 0.5], [0]), r"probs must be a 2-D array .*\[N, C\].*\(2,\)"),
        (lambda: m.nll(PROBS, [0, 1]), r"labels must be a 1-D array of length N=3.*\(2,\)"),
        (lambda: m.brier([[np.nan, 1.0]], [0]), r"probs must contain only finite"),
        (
            lambda: m.ece([[0.5, 0.5], [0.9, 0.9]], [0, 1]),
            r"probs rows must sum to 1.*row 1 sums to 1\.8",
        ),
        (lambda: m.accuracy([[1.5, -0.5]], [0]), r"probs must be probabilities >= 0"),
        (lambda: m.accuracy(np.zeros((0, 2)), []), r"probs must not be empty"),
        (lambda: m.accuracy(PROBS, [0, 1, 2]), r"labels must be class indices in \[0, 2\)"),
        (lambda: m.accuracy(PROBS, [0.0, 1.5, 1.0]), r"labels must be integer class indices"),
        (lambda: m.nll(PROBS, LABELS, eps=0.0), r"eps must be"),
        (lambda: m.ece(PROBS, LABELS, n_bins=0), r"n_bins must be an integer >= 1"),
        (lambda: m.reliability_bins(PROBS, LABELS, n_bins=2.5), r"n_bins must be an integer"),
        (lambda: m.auroc([[0.1, 0.2]], [True, False]), r"scores must be a non-empty 1-D array"),
        (lambda: m.auroc([0.1, 0.2], [True]), r"is_positive must be a 1-D array of length N=2"),
        (lambda: m.auroc([0.1, 0.2], [2, 0]), r"is_positive must be booleans"),
        (lambda: m.ood_auroc([np.inf], [0.1]), r"scores_in must contain only finite"),
        (lambda: m.mutual_information(np.full((1, 1, 2, 2), 0.5)), r"probs_s must .*\[S, N, C\]"),
        (lambda: m.expected_entropy([[[0.5, 0.6]]]), r"probs_s rows must sum to 1.*row \(0, 0\)"),
        (lambda: m.softmax([1.0, 2.0], temperature=0.0), r"temperature must be .* > 0"),
        (lambda: m.softmax([1.0, np.nan]), r"logits must contain only finite"),
        (lambda: m.log_softmax([1.0, 2.0], axis=1), r"axis must be in \[-1, 1\)"),
        (lambda: m.accuracy([[0.5, 0.5], [1.0]], [0, 1]), r"probs must be a numeric array"),
    ],
)
def test_input_errors_name_the_argument(call: Callable[[], object], pattern: str) -> None:
    with pytest.raises(InputError, match=pattern):
        call()


def test_input_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        m.accuracy([0.5, 0.5], [0])


@pytest.mark.parametrize("fn, name", [(m.sample_probs, "logits"),
                                      (m.predictive_probs, "logits"),
                                      (m.mutual_information, "probs_s"),
                                      (m.predictive_entropy, "probs_s")])
@pytest.mark.parametrize("shape", [(3,), (1, 2, 3, 4)])
def test_sample_arrays_of_the_wrong_rank_are_refused_by_name(fn, name, shape):
    with pytest.raises(InputError, match=re.escape(
            f"{name} must have shape [S, N, C] (or [N, C] for a single sample), got shape "
            f"{shape}")):
        fn(np.full(shape, 0.25))
