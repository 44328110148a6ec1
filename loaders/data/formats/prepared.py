"""Datasets a framework prepared on disk: a TFDS directory and a Hugging
Face ``save_to_disk`` directory, read from their own shard files (offline:
no builder code, no download).

- TFDS: ``<name>/<version>/`` holds ``dataset_info.json``, ``features.json``
  and shards ``<name>-<split>.<tfrecord|array_record>-NNNNN-of-NNNNN`` of
  serialized Examples (TFDS's encoding: an ``Image`` is its encoded bytes, a
  ``ClassLabel`` an int64, names in ``<feature>.labels.txt``).
- Hugging Face: ``state.json`` lists a split's Arrow files (the files
  ``datasets.load_from_disk`` memory-maps); ``dataset_dict.json`` names the
  splits, one subdirectory each.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["hf_split", "is_hf_directory", "is_tfds_directory", "tfds_split"]


def is_tfds_directory(directory: Path) -> bool:
    return _tfds_version(directory) is not None


def is_hf_directory(directory: Path) -> bool:
    return (directory / "dataset_dict.json").is_file() or (directory / "state.json").is_file()


def _tfds_version(directory: Path) -> Path | None:
    """``directory`` if it is a version directory, else its newest version's."""
    if (directory / "dataset_info.json").is_file() and (directory / "features.json").is_file():
        return directory
    versions = [
        p for p in directory.iterdir() if p.is_dir() and re.fullmatch(r"\d+\.\d+\.\d+", p.name)
    ]
    for version in sorted(versions, key=lambda p: [int(x) for x in p.name.split(".")])[::-1]:
        if (version / "dataset_info.json").is_file():
            return version
    return None


def tfds_split(directory: Path, split: str) -> tuple[str, list[Path], list[str]]:
    """``(format, shard files in order, class names)`` of one split.

    Raises:
      MissingSplitError: the directory holds no shards of ``split``.
    """
    from jaxfeed.loaders.data.on_disk import MissingSplitError

    version = _tfds_version(directory)
    info = json.loads((version / "dataset_info.json").read_text())
    file_format = info.get("fileFormat", "tfrecord").replace("_", "")
    pattern = re.compile(rf".*-{re.escape(split)}\.(tfrecord|array_record)-(\d+)-of-(\d+)$")
    shards = sorted(
        (p for p in version.iterdir() if pattern.match(p.name)),
        key=lambda p: int(pattern.match(p.name).group(2)),
    )
    if not shards:
        names = [s.get("name") for s in info.get("splits", [])]
        raise MissingSplitError(
            f"{version} has no {split!r} split: its TFDS splits are {names}; prepare it "
            "with that split"
        )
    classes = []
    for labels in sorted(version.glob("*.labels.txt")):
        classes = labels.read_text().splitlines()
        break
    return file_format, shards, classes


def hf_split(directory: Path, split: str) -> tuple[list[Path], list[str]]:
    """``(Arrow files in order, class names)`` of one split.

    Raises:
      MissingSplitError: a dataset dict without ``split``, or a single
        dataset asked for any split but train.
    """
    from jaxfeed.loaders.data.on_disk import MissingSplitError

    if (directory / "dataset_dict.json").is_file():
        splits = json.loads((directory / "dataset_dict.json").read_text())["splits"]
        if split not in splits:
            raise MissingSplitError(
                f"{directory} has no {split!r} split: its splits are {splits}; save a "
                "DatasetDict holding it"
            )
        directory = directory / split
    elif split != "train":
        raise MissingSplitError(
            f"{directory} is one saved Dataset, read as the 'train' split; to have "
            f"{split!r} too, save a DatasetDict({{'train': ..., {split!r}: ...}})"
        )
    state = json.loads((directory / "state.json").read_text())
    files = [directory / f["filename"] for f in state["_data_files"]]
    classes: list[str] = []
    info_file = directory / "dataset_info.json"
    if info_file.is_file():
        features = json.loads(info_file.read_text()).get("features") or {}
        for feature in features.values():
            if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
                classes = list(feature.get("names", []))
                break
    return files, classes
