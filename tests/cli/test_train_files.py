"""``jaxfeed train --dataset DIR`` on the user's files: an image folder and
TFRecord shards of encoded images, decoded to the example MLP's 28x28x1; an
image of another size is refused by name with the option that fixes it; each
Pillow mode is read as its true 8-bit grey values, or refused by name."""

import io
import re

import numpy as np
import pytest
from conftest import sample_digits

from jaxfeed.cli import main
from jaxfeed.cli.train_data import decode_for_mlp


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.slow  # trains the MLP
def test_an_image_folder_trains(tmp_path, capsys):
    images, labels = sample_digits()
    for split, rows in (("train", range(0, 160)), ("test", range(160, 200))):
        for i in rows:
            folder = tmp_path / "digits" / split / f"digit{labels[i]}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:05d}.png").write_bytes(_png(images[i]))
    args = ["train", "--dataset", str(tmp_path / "digits"), "--epochs", "1", "--quiet"]
    assert main([*args, "--batch-size", "32"]) == 0
    said = capsys.readouterr().out
    assert f"dataset={tmp_path / 'digits'} " in said and "epoch 1/1" in said


@pytest.mark.slow  # trains the MLP
def test_tfrecord_shards_of_another_size_are_refused_then_resized(tmp_path, capsys):
    import tensorflow as tf

    images, labels = sample_digits()
    (tmp_path / "shards").mkdir()
    for split, rows in (("train", range(0, 96)), ("test", range(96, 128))):
        with tf.io.TFRecordWriter(str(tmp_path / "shards" / f"{split}.tfrecord")) as writer:
            for i in rows:
                big = np.kron(images[i], np.ones((2, 2), np.uint8))  # 56x56
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_png(big)])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[i]])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
    args = ["train", "--dataset", str(tmp_path / "shards"), "--epochs", "1", "--quiet"]
    args += ["--batch-size", "32"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "the image is 56x56, but jaxfeed train's MLP takes 28x28" in err and "--resize" in err
    assert main([*args, "--resize"]) == 0
    assert "epoch 1/1" in capsys.readouterr().out


GREY = (np.arange(28 * 28) % 256).astype(np.uint8).reshape(28, 28)  # every 8-bit value


def _saved(image, format: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return buffer.getvalue()


def _modes() -> dict[str, tuple[bytes, np.ndarray]]:
    """Each mode's encoded image of `GREY` (as Pillow reopens it), and the grey it must read as."""
    from PIL import Image

    grey, wide = Image.fromarray(GREY), (GREY.astype(np.uint16) * 257)
    rgb = Image.fromarray(np.stack([GREY] * 3, -1))
    opaque = np.full_like(GREY, 255)
    return {
        "L": (_saved(grey, "PNG"), GREY),
        "I;16": (_saved(Image.fromarray(wide), "TIFF"), GREY),
        # The case. Pillow before 11 opens a 16-bit PNG as mode 'I', later ones as 'I;16'.
        "I;16 PNG": (_saved(Image.fromarray(wide), "PNG"), GREY),
        "I;16B": (
            _saved(Image.frombytes("I;16B", (28, 28), wide.astype(">u2").tobytes()), "TIFF"),
            GREY,
        ),
        # A 16-bit PGM, written by hand: Pillow before 11 cannot write one.
        "I": (b"P5\n28 28\n65535\n" + wide.astype(">u2").tobytes(), GREY),
        "1": (_saved(Image.fromarray(GREY > 127), "PNG"), np.where(GREY > 127, 255, 0)),
        "P": (_saved(grey.convert("P"), "PNG"), GREY),
        "RGB": (_saved(rgb, "PNG"), GREY),
        "RGBA": (_saved(Image.fromarray(np.stack([GREY] * 3 + [opaque], -1)), "PNG"), GREY),
        "LA": (_saved(Image.fromarray(np.stack([GREY, opaque], -1)), "PNG"), GREY),
        "CMYK": (_saved(rgb.convert("CMYK"), "TIFF"), GREY),
    }


@pytest.mark.parametrize("mode", list(_modes()))
def test_each_mode_reads_as_its_grey_values(mode):
    from PIL import Image

    encoded, want = _modes()[mode]
    assert Image.open(io.BytesIO(encoded)).mode in ({"I", "I;16"} if mode == "I;16 PNG" else {mode})
    got = decode_for_mlp({"image": encoded, "label": 0}, None, resize=False)["image"]
    np.testing.assert_array_equal(got[:, :, 0], want)


def _refused() -> dict[str, tuple[bytes, str]]:
    from PIL import Image

    alpha = np.stack([GREY] * 3 + [np.full_like(GREY, 255)], -1)
    alpha[0, 0, 3] = 0
    return {
        "F": (
            _saved(Image.fromarray(GREY.astype(np.float32)), "TIFF"),
            "is of mode 'F' (32-bit floats)",
        ),
        "I": (
            _saved(Image.fromarray(GREY.astype(np.int32)), "TIFF"),
            "is of mode 'I' (32-bit integers)",
        ),
        "RGBA": (
            _saved(Image.fromarray(alpha), "PNG"),
            "has transparent pixels (mode 'RGBA', alpha down to 0",
        ),
    }


@pytest.mark.parametrize("mode", list(_refused()))
def test_a_mode_without_exact_grey_values_is_refused(mode):
    encoded, said = _refused()[mode]
    with pytest.raises(ValueError, match=re.escape(f"the image {said}")):
        decode_for_mlp({"image": encoded, "label": 0}, None, resize=False)


def test_an_image_folder_with_a_refused_mode_names_the_file_before_training(tmp_path, capsys):
    (tmp_path / "digits" / "train" / "zero").mkdir(parents=True)
    (tmp_path / "digits" / "train" / "zero" / "a.png").write_bytes(_modes()["I;16"][0])
    bad = tmp_path / "digits" / "train" / "zero" / "b.tif"
    bad.write_bytes(_refused()["F"][0])
    args = ["train", "--dataset", str(tmp_path / "digits"), "--epochs", "1", "--quiet"]
    assert main([*args, "--batch-size", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{bad} is of mode 'F' (32-bit floats)" in err and "save it as 8-bit grayscale" in err
