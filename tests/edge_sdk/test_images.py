"""edge_sdk.inputs.images: a photo -> the model's uint8 input by the recorded transform
(Pillow, no torch): torchvision's evaluation transform bit for bit, the same bytes from a file,
its decoded array and a Pillow image, and EXIF orientation. torchvision only inside the test
that compares with it (the torch-free run skips that one)."""
from __future__ import annotations

import numpy as np
import pytest

from edge_sdk.bundle import Preprocess
from edge_sdk.errors import InputError
from edge_sdk.inputs.images import from_array, open_image, prepare, resize_centre

Image = pytest.importorskip("PIL.Image")  # the [image] extra

# (H, W): portrait, landscape, square, odd sizes, smaller than the resize (upsampled), already
# at the resize
SIZES = [(150, 100), (97, 173), (64, 64), (53, 37), (20, 31), (36, 36), (33, 35)]
TRANSFORMS = [Preprocess(resize=36, crop=(32, 32)), Preprocess(resize=40, crop=(24, 32)),
              Preprocess(resize=33, crop=(32, 32)),  # an odd margin: round((h - H) / 2)
              Preprocess(resize=36, crop=(32, 32), interpolation="bicubic")]


def photo(h: int, w: int, seed: int = 0, channels: int = 3) -> np.ndarray:
    """A uint8 photo with structure (gradients) and noise, so resampling filters differ."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([255 * yy / max(h - 1, 1), 255 * xx / max(w - 1, 1),
                     127 + 100 * np.sin(yy / 3 + xx / 5)], -1)[..., :channels]
    noisy = base + rng.normal(0, 20, base.shape)
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_prepare_is_torchvisions_resize_and_centre_crop_bit_for_bit(size):
    try:  # the device-side run (EDGE_SDK_BLOCK_TORCH=1) blocks it with an ImportError
        import torchvision.transforms as tv
    except ImportError as e:
        pytest.skip(f"torchvision not importable here: {e}")
    a = photo(*size)
    img = Image.fromarray(a)
    for pre in TRANSFORMS:
        mode = tv.InterpolationMode[pre.interpolation.upper()]
        ref = np.asarray(tv.Compose([tv.Resize(pre.resize, interpolation=mode),
                                     tv.CenterCrop(list(pre.crop))])(img))
        got = prepare(img, pre)
        assert got.dtype == np.uint8 and got.shape == (*pre.crop, 3)
        np.testing.assert_array_equal(got, ref, err_msg=f"{size} {pre}")
        np.testing.assert_array_equal(resize_centre(img, pre), ref)
        np.testing.assert_array_equal(prepare(a, pre), ref)  # the array: the same bytes


def test_the_shorter_side_becomes_resize_and_the_centre_is_cut():
    # a photo whose left half is dark and right half bright, wider than tall: the crop keeps
    # the middle, where both halves meet
    a = np.zeros((40, 100, 3), np.uint8)
    a[:, 50:] = 200
    pre = Preprocess(resize=20, crop=(20, 20))
    out = prepare(a, pre, 3)
    assert out.shape == (20, 20, 3)
    assert out[:, :8].max() < 10 and out[:, 12:].min() > 190  # the middle 20 of 50 columns


def test_grey_models_get_one_channel():
    pre = Preprocess(resize=36, crop=(32, 32))
    a = photo(50, 40)
    out = prepare(a, pre, channels=1)
    assert out.shape == (32, 32, 1)
    grey = np.asarray(Image.fromarray(a).convert("L"))
    np.testing.assert_array_equal(out, prepare(grey, pre, channels=1))
    np.testing.assert_array_equal(out, prepare(grey[..., None], pre, channels=1))
    # a grey photo for a colour model: Pillow's L -> RGB (three equal channels)
    rgb = prepare(grey, pre, channels=3)
    assert rgb.shape == (32, 32, 3) and (rgb == rgb[..., :1]).all()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_file_its_decoded_array_and_its_pillow_image_give_the_same_bytes(tmp_path, fmt):
    a = photo(61, 47, seed=3)
    path = tmp_path / f"p.{fmt.lower()}"
    Image.fromarray(a).save(path, fmt)
    pre = Preprocess(resize=36, crop=(32, 32))
    from_file = prepare(path, pre)
    assert from_file.shape == (32, 32, 3)
    decoded = np.asarray(open_image(path))
    if fmt == "PNG":  # lossless: the decoded pixels are the array written
        np.testing.assert_array_equal(decoded, a)
    np.testing.assert_array_equal(from_file, prepare(decoded, pre))
    np.testing.assert_array_equal(from_file, prepare(str(path), pre))
    with Image.open(path) as img:
        np.testing.assert_array_equal(from_file, prepare(img, pre))
    # RGBA and palette files: converted to RGB as Pillow converts them
    Image.fromarray(a).convert("RGBA").save(tmp_path / "p4.png")
    Image.fromarray(a).convert("P").save(tmp_path / "pp.png")
    with Image.open(tmp_path / "pp.png") as img:
        np.testing.assert_array_equal(prepare(tmp_path / "pp.png", pre),
                                      prepare(np.asarray(img.convert("RGB")), pre))
    if fmt == "PNG":
        np.testing.assert_array_equal(prepare(tmp_path / "p4.png", pre), from_file)


def _exif_jpeg(path, pixels: np.ndarray, orientation: int):
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(pixels).save(path, "JPEG", exif=exif, quality=95)
    return path


def test_exif_orientation_turns_a_file_upright(tmp_path):
    # upright: taller than wide, bright on top, a red stripe on the left
    up = np.full((48, 32, 3), 30, np.uint8)
    up[:24] = 220
    up[:, :6] = (250, 0, 0)
    # orientation 6: the stored pixels must be turned 90 degrees clockwise to display, so a
    # camera held upright stores the picture turned counter-clockwise
    path = _exif_jpeg(tmp_path / "rot.jpg", np.ascontiguousarray(np.rot90(up, 1)), 6)
    stored = np.asarray(open_image(path, exif=False))
    assert stored.shape == (32, 48, 3)
    upright = np.asarray(open_image(path))
    assert upright.shape == (48, 32, 3)
    np.testing.assert_array_equal(upright, np.rot90(stored, -1))  # exact: a transpose
    assert np.abs(upright.astype(int) - up).mean() < 4  # the picture, up to JPEG's loss
    assert upright[:20, 10:].mean() > 200 and upright[28:, 10:].mean() < 50
    assert upright[:, :4, 0].mean() > 200 and upright[:, :4, 1].mean() < 50

    pre = Preprocess(resize=36, crop=(32, 32))
    np.testing.assert_array_equal(prepare(path, pre), prepare(upright, pre))
    off = Preprocess(resize=36, crop=(32, 32), exif=False)
    np.testing.assert_array_equal(prepare(path, off), prepare(stored, off))
    assert not np.array_equal(prepare(path, pre), prepare(path, off))


def test_a_file_that_is_not_an_image_names_the_file(tmp_path):
    pre = Preprocess(resize=36, crop=(32, 32))
    bad = tmp_path / "notes.jpg"
    bad.write_text("not a picture")
    with pytest.raises(InputError, match=r"notes\.jpg is not a readable image"):
        prepare(bad, pre)
    with pytest.raises(InputError, match=r"missing\.png is not a readable image"):
        prepare(tmp_path / "missing.png", pre)


@pytest.mark.parametrize("bad", [np.zeros((20, 20, 3), np.float32), np.zeros((20, 20, 2), np.uint8),
                                 np.zeros((2, 20, 20, 3), np.uint8), np.zeros(20, np.uint8)],
                         ids=["float32", "two channels", "4-d", "1-d"])
def test_an_array_that_is_not_a_photo_is_an_input_error_naming_it(bad):
    with pytest.raises(InputError, match="uint8 H x W x C") as info:
        from_array(bad)
    assert str(bad.dtype) in str(info.value) and str(bad.shape) in str(info.value)
