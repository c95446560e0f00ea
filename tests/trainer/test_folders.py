"""Photo folders (trainer/folders.py, trainer/photo_cache.py): the user's splits, streamed
decoding, the evaluation transform shared with the device, the decoded cache."""
import numpy as np
import pytest
import torch

from edge_sdk.errors import ConfigError, DataError, InputSpecMismatchError
from edge_sdk.inputs.images import prepare
from trainer.config import DataConfig, load_config
from trainer.data import calibration_subset, load_data, load_ood, nhwc_inputs, training_view
from trainer.folders import FolderDataset, find_images, split_folders

from support import write_photos

SIZE = 16


def _cfg(root, **kw):
    return DataConfig(**{"source": f"imagefolder:{root}", "image_size": SIZE, **kw})


@pytest.fixture
def split_root(tmp_path):
    write_photos(tmp_path / "train", n=10)
    write_photos(tmp_path / "validation", n=3, seed=1)
    write_photos(tmp_path / "test", n=4, seed=2)
    return tmp_path


def test_the_users_splits_are_used_as_they_are(split_root):
    d = load_data(_cfg(split_root))
    assert (len(d.train), len(d.val), len(d.test)) == (20, 6, 8)
    assert "the folder's own splits (train/, validation/, test/)" in d.note
    assert d.spec.classes == ("cat", "dog")
    assert d.spec.shape == (1, SIZE, SIZE, 3) and d.spec.dtype == "uint8"
    assert d.spec.preprocess.crop == (SIZE, SIZE) and d.spec.preprocess.resize == round(SIZE / 0.875)
    # validation and test are the evaluation transform of their files, bit for bit: the
    # function the device applies to the bundle's recorded transform
    paths, _, _ = find_images(split_root / "test", d.spec.classes)
    expected = np.stack([prepare(p.decode(), d.spec.preprocess) for p in paths])
    assert np.array_equal(d.test.raw, expected)


def test_missing_test_split_is_carved_from_train(tmp_path):
    write_photos(tmp_path / "train", n=10)
    write_photos(tmp_path / "val", n=3, seed=1)
    assert split_folders(tmp_path).keys() == {"train", "val"}
    d = load_data(_cfg(tmp_path, test_fraction=0.2))
    assert len(d.val) == 6 and len(d.test) == 4 and len(d.train) == 16
    assert "test carved from train" in d.note


def test_one_folder_is_split_three_ways(tmp_path):
    write_photos(tmp_path, n=10)
    d = load_data(_cfg(tmp_path, val_fraction=0.2, test_fraction=0.2))
    assert len(d.train) + len(d.val) + len(d.test) == 20
    assert "one folder, stratified split" in d.note
    for split in (d.train, d.val, d.test):
        assert set(split.y.tolist()) == {0, 1}


def test_a_class_the_training_folder_lacks_is_named(split_root):
    write_photos(split_root / "validation", classes=("bird",), n=1)
    with pytest.raises(DataError, match=r"class folder\(s\) \['bird'\]"):
        load_data(_cfg(split_root))


def test_missing_folder_and_empty_folder_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_data(_cfg(tmp_path / "nowhere"))
    (tmp_path / "cls").mkdir()
    with pytest.raises(DataError, match="has no images"):
        load_data(_cfg(tmp_path))


def test_training_items_are_random_crops_normalised(split_root):
    d = load_data(_cfg(split_root))
    assert isinstance(d.train, FolderDataset) and d.train.augment == "random_resized_crop"
    torch.manual_seed(0)
    a, y = d.train[0]
    assert a.shape == (3, SIZE, SIZE) and a.dtype == torch.float32 and int(y) == 0
    torch.manual_seed(1)
    b, _ = d.train[0]
    assert not torch.equal(a, b)  # a different crop per draw
    # the augmentation off: exactly the evaluation transform, normalised with the spec
    plain = d.train.subset(np.arange(len(d.train)), "none")
    x, _ = plain[0]
    raw = prepare(d.train.paths[0].decode(), d.spec.preprocess)
    want = (torch.tensor(raw).permute(2, 0, 1).float()
            - torch.tensor(d.spec.mean).view(3, 1, 1)) / torch.tensor(d.spec.std).view(3, 1, 1)
    assert torch.allclose(x, want.float(), atol=1e-6)
    # worker processes decode the same way
    loader = torch.utils.data.DataLoader(plain, batch_size=4, num_workers=2)
    first = next(iter(loader))[0]
    assert torch.allclose(first[0], x)


def test_statistics_come_from_a_stated_sample_or_the_config(split_root):
    d = load_data(_cfg(split_root, stats_samples=5))
    again = load_data(_cfg(split_root, stats_samples=5), d.spec)  # an export's re-check
    assert again.spec == d.spec
    other = load_data(_cfg(split_root, stats_samples=20))
    assert other.spec.mean != d.spec.mean  # a different sample, different numbers
    given = load_data(_cfg(split_root, mean=[1.0, 2.0, 3.0], std=[4.0, 5.0, 6.0]))
    assert given.spec.mean == (1.0, 2.0, 3.0) and given.spec.std == (4.0, 5.0, 6.0)
    with pytest.raises(InputSpecMismatchError, match="mean"):
        load_data(_cfg(split_root, mean=[1.0, 2.0, 3.0], std=[4.0, 5.0, 6.0]), d.spec)


def test_arrays_for_the_exporter(split_root):
    d = load_data(_cfg(split_root))
    calib = calibration_subset(d.train, 6, seed=0)  # BN re-collection: evaluation transform
    assert calib.raw.shape == (6, SIZE, SIZE, 3) and calib.augment == "none"
    view = training_view(d.train)
    assert len(view) == len(d.train)
    x, y = nhwc_inputs(d.train, limit=3)
    assert x.shape == (3, SIZE, SIZE, 3) and np.array_equal(y, d.train.y.numpy()[:3])
    ood = load_ood(f"imagefolder:{split_root}", d.spec)  # its test/ split, our transform
    assert ood.raw.shape == (8, SIZE, SIZE, 3) and np.array_equal(ood.raw, d.test.raw)


def test_decoded_cache(split_root, tmp_path):
    cache_dir = tmp_path / "cache"
    d = load_data(_cfg(split_root, cache="memmap", cache_dir=str(cache_dir)))
    files = sorted(cache_dir.glob("*.u8"))
    assert len(files) == 1 and "decoded cache" in d.note
    # the evaluation crop from the cache is the device's transform, bit for bit
    plain = d.train.subset(np.arange(len(d.train)), "none")
    for i in range(len(plain)):
        assert np.array_equal(plain.raw(i), prepare(plain.paths[i].decode(), d.spec.preprocess))
    torch.manual_seed(0)
    x, _ = d.train[3]
    assert x.shape == (3, SIZE, SIZE)
    load_data(_cfg(split_root, cache="memmap", cache_dir=str(cache_dir)))
    assert sorted(cache_dir.glob("*.u8")) == files  # reused, not rebuilt
    load_data(_cfg(split_root, cache="memmap", cache_dir=str(cache_dir), image_size=12))
    assert len(list(cache_dir.glob("*.u8"))) == 2  # another size, another file
    assert not list(cache_dir.glob(".*"))  # no temporary left behind


def test_config_checks(split_root):
    with pytest.raises(ConfigError, match=r"data\.mean and data\.std go together"):
        load_config("digits", ["data.source=imagefolder:x", "data.image_size=8",
                               "data.mean=[1.0, 2.0, 3.0]"])
    with pytest.raises(ConfigError, match="imagefolder:<path> sources only"):
        load_config("digits", ["data.augment=random_resized_crop"])
    with pytest.raises(ConfigError, match=r"data\.crop_scale"):
        load_config("digits", ["data.source=imagefolder:x", "data.image_size=8",
                               "data.crop_scale=[0.9, 0.5]"])
    with pytest.raises(DataError, match="random_resized_crop, none or auto"):
        load_data(_cfg(split_root, augment="crop_flip"))
