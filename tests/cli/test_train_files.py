"""``jaxfeed train --dataset DIR`` on the user's files: an image folder and
TFRecord shards of encoded images, decoded to the example MLP's 28x28x1; an
image of another size is refused by name with the option that fixes it."""

import io

import numpy as np
import pytest
from conftest import sample_digits

from jaxfeed.cli import main


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
