"""trainer.data: sources, stratified splits, normalisation, input spec, OOD and subsets.

Offline only: digits is bundled with scikit-learn; npz and image-folder sources are
written to tmp_path. Nothing here reads /work/shared/data.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

import edge_sdk.bundle
from edge_sdk.errors import ConfigError, DataError
from trainer.config import DataConfig
from trainer.data import (
    ArrayDataset,
    InputSpec,
    _stratified_split,
    calibration_subset,
    load_data,
    load_ood,
    subset,
)
from trainer.sources import _digits_arrays


@pytest.fixture(scope="module")
def digits():
    return load_data(DataConfig(source="digits", split_seed=0))


def _rows(ds: ArrayDataset) -> np.ndarray:
    """(pixels..., label) rows sorted lexicographically: a multiset fingerprint of a dataset."""
    rows = np.concatenate([ds.raw.reshape(len(ds), -1), ds.y.numpy()[:, None].astype(np.float32)], axis=1)
    return rows[np.lexsort(rows.T[::-1])]


def _write_npz(path, n_train=60, n_test=15, hw=(6, 6), channels=None, classes=("a", "b", "c"), seed=0, **extra):
    rng = np.random.default_rng(seed)
    shape = hw if channels is None else (*hw, channels)
    k = len(classes) if classes is not None else 3
    arrays = {
        "x_train": rng.integers(0, 256, (n_train, *shape), dtype=np.uint8),
        "y_train": np.arange(n_train, dtype=np.int64) % k,
        "x_test": rng.integers(0, 256, (n_test, *shape), dtype=np.uint8),
        "y_test": np.arange(n_test, dtype=np.int64) % k,
    }
    if classes is not None:
        arrays["classes"] = np.array(classes)
    arrays.update(extra)
    np.savez_compressed(path, **arrays)
    return str(path)


# --------------------------------------------------------------------------- digits splits


def test_digits_splits_are_disjoint_and_cover_everything(digits):
    images, labels = _digits_arrays()
    assert len(digits.train) + len(digits.val) + len(digits.test) == len(labels) == 1797
    full = np.concatenate([images.reshape(len(labels), -1), labels[:, None]], axis=1).astype(np.float32)
    full = full[np.lexsort(full.T[::-1])]
    parts = np.concatenate([_rows(digits.train), _rows(digits.val), _rows(digits.test)])
    assert np.array_equal(parts[np.lexsort(parts.T[::-1])], full)


def test_split_indices_are_a_partition():
    y = np.repeat(np.arange(5), [50, 3, 2, 1, 40])
    train, val, test = _stratified_split(y, 5, (0.1, 0.2), seed=3)
    everything = np.concatenate([train, val, test])
    assert np.array_equal(np.sort(everything), np.arange(len(y)))
    # a class with >= 3 samples appears in every split; tiny classes keep training first
    for split in (train, val, test):
        assert {0, 1, 4} <= set(y[split].tolist())
    assert 3 in set(y[train].tolist())


def test_digits_sizes_and_stratification(digits):
    assert len(digits.val) == pytest.approx(0.1 * 1797, abs=10)
    assert len(digits.test) == pytest.approx(0.2 * 1797, abs=10)
    for split in (digits.train, digits.val, digits.test):
        assert set(split.y.tolist()) == set(range(10))
        assert split.y.dtype == torch.int64 and split.x.dtype == torch.float32
    assert (digits.source, digits.split_seed, digits.num_classes) == ("digits", 0, 10)


def test_splits_deterministic_per_seed(digits):
    again = load_data(DataConfig(source="digits", split_seed=0))
    for a, b in ((digits.train, again.train), (digits.val, again.val), (digits.test, again.test)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    other = load_data(DataConfig(source="digits", split_seed=1))
    assert not np.array_equal(_rows(other.test), _rows(digits.test))


def test_normalisation_uses_training_stats(digits):
    x = digits.train.x
    assert x.mean(dim=(0, 2, 3)).abs().max() < 1e-4
    assert (x.std(dim=(0, 2, 3)) - 1).abs().max() < 1e-3
    spec = digits.spec
    assert spec.mean == pytest.approx(tuple(digits.train.raw.astype(np.float64).mean(axis=(0, 1, 2))))
    assert spec.shape == (1, 8, 8, 1) and spec.dtype == "float32" and spec.value_range == (0.0, 16.0)
    assert spec.classes == tuple(str(c) for c in range(10))
    # val/test use the same (training) statistics
    for split in (digits.val, digits.test):
        assert np.allclose(spec.normalize(split.raw).transpose(0, 3, 1, 2), split.x.numpy(), atol=1e-5)
    assert digits.train.augment == "none"  # auto: no crop/flip for 8x8 grey


def test_spec_round_trip_and_validation(digits):
    spec = digits.spec
    d = spec.to_dict()
    assert InputSpec.from_dict(d) == spec
    assert InputSpec.from_dict(yaml.safe_load(yaml.safe_dump(d))) == spec
    assert all(isinstance(v, (str, list)) for v in d.values())
    bad = [
        {**d, "dtype": "int16"},
        {**d, "std": [1.0, 1.0]},
        {**d, "std": [0.0]},
        {**d, "shape": [8, 8, 1]},
        {**d, "layout": "NCHW"},
        {**d, "classes": []},
        {**d, "value_range": [1, 0]},
        {**d, "extra": 1},
        {k: v for k, v in d.items() if k != "mean"},
    ]
    for b in bad:
        with pytest.raises(DataError):
            InputSpec.from_dict(b)
    with pytest.raises(DataError, match=r"\(N, 8, 8, 1\)"):
        spec.normalize(np.zeros((2, 8, 7)))
    assert spec.normalize(np.zeros((2, 8, 8))).shape == (2, 8, 8, 1)  # grey: channel axis added


def test_dataloader_batches(digits):
    x, y = next(iter(torch.utils.data.DataLoader(digits.train, batch_size=32, shuffle=True)))
    assert x.shape == (32, 1, 8, 8) and y.shape == (32,)


# --------------------------------------------------------------------------- npz sources


def test_npz_source(tmp_path):
    path = _write_npz(tmp_path / "toy.npz")
    splits = load_data(DataConfig(source=f"npz:{path}"))
    spec = splits.spec
    assert spec.classes == ("a", "b", "c")
    assert spec.shape == (1, 6, 6, 1) and spec.dtype == "uint8" and spec.value_range == (0.0, 255.0)
    assert len(splits.test) == 15  # the file's own test split, untouched
    assert len(splits.train) + len(splits.val) == 60
    assert set(splits.val.y.tolist()) == {0, 1, 2}
    assert splits.train.raw.dtype == np.uint8 and splits.train.x.shape[1:] == (1, 6, 6)


def test_npz_rgb_32_gets_crop_flip_on_train_only(tmp_path):
    path = _write_npz(tmp_path / "rgb.npz", n_train=30, n_test=6, hw=(32, 32), channels=3, classes=None)
    splits = load_data(DataConfig(source=f"npz:{path}"))
    assert splits.spec.shape == (1, 32, 32, 3) and len(splits.spec.mean) == 3
    assert splits.spec.classes == ("0", "1", "2")  # no names stored: labels name themselves
    assert (splits.train.augment, splits.val.augment, splits.test.augment) == ("crop_flip", "none", "none")
    assert load_data(DataConfig(source=f"npz:{path}", augment="none")).train.augment == "none"


def test_test_only_npz_is_ood(tmp_path):
    in_dist = load_data(DataConfig(source=f"npz:{_write_npz(tmp_path / 'in.npz')}"))
    ood_path = _write_npz(tmp_path / "ood.npz", n_train=0, n_test=12, seed=5)
    with pytest.raises(DataError, match="load_ood"):
        load_data(DataConfig(source=f"npz:{ood_path}"))
    ood = load_ood(f"npz:{ood_path}", in_dist.spec)
    assert len(ood) == 12
    assert ood.x.shape == (12, 1, 6, 6) and ood.raw.shape == (12, *in_dist.spec.shape[1:])
    expected = in_dist.spec.normalize(ood.raw).transpose(0, 3, 1, 2)  # in-distribution statistics
    assert np.allclose(ood.x.numpy(), expected, atol=1e-6)


def test_unlabelled_ood_npz_with_only_x_test(tmp_path):
    in_dist = load_data(DataConfig(source=f"npz:{_write_npz(tmp_path / 'in.npz')}"))
    images = np.random.default_rng(3).integers(0, 256, (9, 6, 6), dtype=np.uint8)  # grey N x H x W
    np.savez(tmp_path / "ood.npz", x_test=images)
    ood = load_ood(f"npz:{tmp_path / 'ood.npz'}", in_dist.spec)
    assert len(ood) == 9 and ood.y.tolist() == [-1] * 9  # no labels: -1, never a class
    assert np.array_equal(ood.raw, images[..., None])
    with pytest.raises(DataError, match="has x_test but no y_test: evaluation data needs labels"):
        load_ood(f"npz:{tmp_path / 'ood.npz'}", in_dist.spec, labels=True)
    np.savez(tmp_path / "train_only.npz", x_train=images[:4])  # x_train alone is read too
    assert len(load_ood(f"npz:{tmp_path / 'train_only.npz'}", in_dist.spec)) == 4
    np.savez(tmp_path / "none.npz", y_test=np.zeros(3, np.int64))
    with pytest.raises(DataError, match=r"has no images: expected x_test \(or x_train\)"):
        load_ood(f"npz:{tmp_path / 'none.npz'}", in_dist.spec)


def test_grey_training_data_with_and_without_channel_axis_load_alike(tmp_path):
    flat = _write_npz(tmp_path / "flat.npz", seed=4)  # N x H x W
    with np.load(flat) as f:
        arrays = {k: f[k] for k in f.files}
    np.savez(tmp_path / "nhwc.npz", **{k: v[..., None] if k.startswith("x_") else v
                                       for k, v in arrays.items()})
    a = load_data(DataConfig(source=f"npz:{flat}"))
    b = load_data(DataConfig(source=f"npz:{tmp_path / 'nhwc.npz'}"))
    assert a.spec == b.spec and a.spec.shape == (1, 6, 6, 1)
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(a, split).x, getattr(b, split).x)
    # the spec normalises a grey batch with or without the channel axis alike
    raw = a.test.raw
    assert np.array_equal(a.spec.normalize(raw[..., 0]), a.spec.normalize(raw))


def test_ood_shape_mismatch_names_both_shapes(tmp_path):
    in_dist = load_data(DataConfig(source=f"npz:{_write_npz(tmp_path / 'in.npz')}"))
    other = _write_npz(tmp_path / "other.npz", n_train=0, n_test=4, hw=(5, 5))
    with pytest.raises(DataError, match=r"\(5, 5, 1\).*\(6, 6, 1\)"):
        load_ood(f"npz:{other}", in_dist.spec)
    with pytest.raises(DataError, match=r"\(8, 8, 1\).*\(6, 6, 1\)"):
        load_ood("digits", in_dist.spec)


@pytest.mark.parametrize(
    "extra, pattern",
    [
        ({"y_train": np.full(60, 3, dtype=np.int64)}, r"labels must be in \[0, 3\)"),
        ({"y_test": -np.ones(15, dtype=np.int64)}, r"labels must be in \[0, 3\)"),
        ({"y_train": np.zeros(60, dtype=np.float32)}, "integer class indices"),
        ({"y_train": np.zeros(59, dtype=np.int64)}, "1-D array of 60 labels"),
        ({"x_test": np.zeros((15, 7, 7), dtype=np.uint8)}, "x_test images are"),
        ({"x_train": np.zeros((60, 6, 6), dtype=np.int32)}, "uint8 or floating point"),
        ({"classes": np.array([1, 2, 3])}, "classes must be a 1-D array of strings"),
    ],
)
def test_bad_npz_contents(tmp_path, extra, pattern):
    path = _write_npz(tmp_path / "bad.npz", **extra)
    with pytest.raises(DataError, match=pattern):
        load_data(DataConfig(source=f"npz:{path}"))


def test_npz_missing_file_missing_keys_and_pickles(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_data(DataConfig(source=f"npz:{tmp_path / 'nope.npz'}"))
    np.savez(tmp_path / "partial.npz", x_train=np.zeros((4, 2, 2), np.uint8))
    with pytest.raises(DataError, match="lacks"):
        load_data(DataConfig(source=f"npz:{tmp_path / 'partial.npz'}"))
    pickled = _write_npz(tmp_path / "pickled.npz", classes=None, extra=np.array([{"a": 1}], dtype=object))
    with pytest.raises(DataError, match="cannot read"):
        load_data(DataConfig(source=f"npz:{pickled}"))


# --------------------------------------------------------------------------- datasets and subsets


def _toy_dataset(n=8, augment="crop_flip") -> ArrayDataset:
    raw = np.random.default_rng(0).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    spec = InputSpec(
        shape=(1, 32, 32, 3), dtype="uint8", value_range=(0, 255), mean=(120, 120, 120), std=(60, 60, 60),
        classes=("a", "b"),
    )
    return ArrayDataset.from_raw(raw, np.arange(n) % 2, spec, augment=augment)


def test_crop_flip_preserves_shape_and_changes_images():
    ds = _toy_dataset()
    changed = False
    for seed in range(10):
        torch.manual_seed(seed)
        x, y = ds[0]
        assert x.shape == (3, 32, 32) and int(y) == 0
        changed |= not torch.equal(x, ds.x[0])
    assert changed
    assert torch.equal(_toy_dataset(augment="none")[0][0], ds.x[0])
    with pytest.raises(DataError, match="augment"):
        _toy_dataset(augment="mixup")


def test_calibration_subset(digits):
    cal = calibration_subset(digits.train, 100, seed=0)
    assert len(cal) == 100 and cal.augment == "none"
    again = calibration_subset(digits.train, 100, seed=0)
    assert torch.equal(cal.x, again.x) and torch.equal(cal.y, again.y)
    assert not torch.equal(calibration_subset(digits.train, 100, seed=1).x, cal.x)
    assert len(calibration_subset(digits.train, 10**6, seed=0)) == len(digits.train)
    assert calibration_subset(_toy_dataset(), 4, seed=0).augment == "none"  # augmentation off
    with pytest.raises(DataError):
        calibration_subset(digits.train, 0, seed=0)


def test_subset(digits):
    part = subset(digits.val, [0, 2, 4])
    assert torch.equal(part.x, digits.val.x[[0, 2, 4]]) and np.array_equal(part.raw, digits.val.raw[[0, 2, 4]])
    with pytest.raises(DataError, match=r"\[0, \d+\)"):
        subset(digits.val, [len(digits.val)])
    with pytest.raises(DataError):
        subset(digits.val, [0.5])


# --------------------------------------------------------------------------- unknown / missing sources


def test_unknown_source_is_config_error(digits):
    with pytest.raises(ConfigError, match=r"data\.source.*npz:<path>"):
        load_data(DataConfig(source="imagenet"))
    with pytest.raises(ConfigError, match="npz:<path>"):
        load_ood("imagenet", digits.spec)
    with pytest.raises(ConfigError, match=r"data\.image_size is required"):
        load_data(DataConfig(source="imagefolder:/somewhere"))


def test_torchvision_source_missing_files_says_how_to_download(tmp_path):
    with pytest.raises(DataError, match="download") as err:
        load_data(DataConfig(source="mnist", root=str(tmp_path)))
    assert str(tmp_path) in str(err.value)


def test_imagefolder_source(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        for i in range(6):
            pixels = rng.integers(0, 256, (10 + i, 12, 3), dtype=np.uint8)  # sizes differ on purpose
            Image.fromarray(pixels).save(tmp_path / name / f"{i}.png")
    splits = load_data(DataConfig(source=f"imagefolder:{tmp_path}", image_size=8, val_fraction=0.2))
    assert splits.spec.classes == ("cat", "dog")
    assert splits.spec.shape == (1, 8, 8, 3) and splits.spec.dtype == "uint8"
    assert len(splits.train) + len(splits.val) + len(splits.test) == 12
    for split in (splits.train, splits.val, splits.test):
        assert set(split.y.tolist()) == {0, 1}
    ood = load_ood(f"imagefolder:{tmp_path}", splits.spec)  # resized to the spec's size
    assert ood.x.shape == (12, 3, 8, 8)


# --------------------------------------------------------------------------- a carried input spec


def test_load_data_uses_a_carried_spec_after_checking_it(digits):
    """quantize/export pass the checkpoint's spec: the reloaded data are checked against it
    and normalised with it (the recomputed statistics only serve the check)."""
    from dataclasses import replace

    assert isinstance(digits.spec, InputSpec) and InputSpec is edge_sdk.bundle.InputSpec
    again = load_data(DataConfig(source="digits", split_seed=0), digits.spec)
    assert again.spec == digits.spec and torch.equal(again.test.x, digits.test.x)
    carried = replace(digits.spec, mean=(digits.spec.mean[0] * (1 + 1e-9),))  # within tolerance
    assert load_data(DataConfig(source="digits", split_seed=0), carried).spec == carried


def test_load_data_refuses_data_that_changed_since_training(digits, tmp_path):
    from dataclasses import replace

    from edge_sdk.errors import InputSpecMismatchError

    shifted = replace(digits.spec, mean=(digits.spec.mean[0] + 0.5,))
    with pytest.raises(InputSpecMismatchError) as err:
        load_data(DataConfig(source="digits", split_seed=0), shifted)
    msg = str(err.value)
    assert "data source 'digits' (split seed 0) no longer matches the input spec" in msg
    assert (f"mean: the checkpoint has ({shifted.mean[0]:.9g},), "
            f"the data give ({digits.spec.mean[0]:.9g},)") in msg
    assert "std" not in msg  # only what differs is named

    path = _write_npz(tmp_path / "toy.npz")
    cfg = DataConfig(source=f"npz:{path}")
    spec = load_data(cfg).spec
    _write_npz(tmp_path / "toy.npz", hw=(7, 7))  # the file was replaced after training
    with pytest.raises(InputSpecMismatchError,
                       match=r"shape: the checkpoint has \(1, 6, 6, 1\), the data give \(1, 7, 7, 1\)"):
        load_data(cfg, spec)
    _write_npz(tmp_path / "toy.npz", classes=("a", "b", "z"))
    with pytest.raises(InputSpecMismatchError, match=r"classes: the checkpoint has \('a', 'b', 'c'\), "
                                                     r"the data give \('a', 'b', 'z'\)"):
        load_data(cfg, spec)


def test_crop_flip_batch_shifts_the_whole_batch_by_one_offset_and_flips_per_image():
    from trainer.data import crop_flip_batch

    torch.manual_seed(0)
    x = torch.randn(64, 3, 8, 8)
    out = crop_flip_batch(x)
    assert out.shape == x.shape
    # every output image is a reflect-padded crop of its input at one (top, left) for all
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4), mode="reflect")
    found = set()
    for i in range(len(x)):
        hits = {(t, l, f) for t in range(9) for l in range(9) for f in (False, True)
                if torch.equal(out[i], (lambda c: c.flip(-1) if f else c)(
                    padded[i, :, t:t + 8, l:l + 8]))}
        assert hits, f"image {i} is not a crop of its padded input"
        found.add(frozenset((t, l) for t, l, _ in hits))
    assert len(set.intersection(*[set(h) for h in found])) >= 1  # one offset for the batch
    flips = [any(torch.equal(out[i], padded[i, :, t:t + 8, l:l + 8].flip(-1)) for t in range(9)
                 for l in range(9)) for i in range(len(x))]
    assert 0 < sum(flips) < len(x)  # per image, not per batch


def test_batched_fetch_matches_per_item_fetch_without_augmentation():
    ds = ArrayDataset(torch.randn(10, 1, 4, 4), torch.arange(10), np.zeros((10, 4, 4, 1)), "none")
    items = ds.__getitems__([3, 1, 7])
    assert all(torch.equal(a[0], ds[i][0]) and int(a[1]) == i for a, i in zip(items, [3, 1, 7]))
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    xb, yb = next(iter(loader))
    assert torch.equal(xb, ds.x[:4]) and torch.equal(yb, ds.y[:4])
