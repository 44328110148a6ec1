"""Which format a path holds, and which of its files make up a split.

A path is a directory, a glob or a list of files. Files are told apart by
name (``.tfrecord``, ``.array_record``, ``.parquet``, ``.arrow``) and, for
Parquet and Arrow, by their magic bytes; directories by their layout (an
image folder's class subdirectories, TFDS's ``dataset_info.json`` +
``features.json``, Hugging Face's ``state.json`` / ``dataset_dict.json``).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path, PurePath

from jaxfeed.loaders.data.formats import imagefolder, prepared
from jaxfeed.loaders.data.formats.tables import ARROW_MAGIC, PARQUET_MAGIC
from jaxfeed.loaders.data.on_disk import MissingSplitError

__all__ = [
    "FILE_FORMATS",
    "FORMATS",
    "Found",
    "LeftOutFilesWarning",
    "file_format",
    "locate",
    "named_split",
    "unknown_directory",
]

FILE_FORMATS = ("tfrecord", "arrayrecord", "parquet", "arrow")
FORMATS = (*FILE_FORMATS, "imagefolder", "tfds", "hf")
# Splits jaxfeed has no name for: a file naming one is in no split (refused
# beside files that name train or test), never silently read as one of them.
_OTHER_SPLITS = ("validation", "valid", "val", "dev", "eval", "training", "testing")
_LOOKED_FOR = (
    "<field>.npy files, MNIST IDX files (train-images-idx3-ubyte[.gz]), TFRecord "
    "(*.tfrecord*), ArrayRecord (*.array_record*), Parquet (*.parquet), Arrow IPC "
    "(*.arrow), an image folder (one subdirectory of images per class), a prepared TFDS "
    "directory (dataset_info.json + features.json) or a Hugging Face save_to_disk "
    "directory (state.json or dataset_dict.json)"
)


@dataclasses.dataclass(frozen=True)
class Found:
    """One split's data: its format, its files (or directory) in reading order."""

    format: str
    files: tuple[Path, ...]
    name: str
    record_format: str = ""  # a TFDS directory's shard format
    classes: tuple[str, ...] = ()


def file_format(path: Path) -> str | None:
    """The format of one file by its name, then its first bytes; None if unknown."""
    name = path.name.lower()
    if ".tfrecord" in name:
        return "tfrecord"
    if ".array_record" in name or name.endswith(".arrayrecord"):
        return "arrayrecord"
    if name.endswith(".parquet"):
        return "parquet"
    if path.suffix.lower() in (".arrow", ".feather", ".ipc", ".arrows"):
        return "arrow"
    try:
        with open(path, "rb") as file:
            head = file.read(6)
    except OSError:
        return None
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    if head.startswith(ARROW_MAGIC) or head.startswith(b"\xff\xff\xff\xff"):
        return "arrow"
    return None


def locate(
    target: str | os.PathLike | Sequence[str | os.PathLike],
    split: str,
    splits: Sequence[str],
    format: str | None = None,
) -> Found | None:
    """The files of ``split`` in ``target``; None for a directory that holds
    none of the formats (the caller tries its other readers).

    Raises:
      ValueError: an unknown ``format``, a glob or list without files of one
        known format, files of several formats.
      MissingSplitError: the data holds other splits but not ``split``.
    """
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; choose one of {list(FORMATS)}")
    if isinstance(target, str | os.PathLike) and Path(target).expanduser().is_dir():
        return _in_directory(Path(target).expanduser(), split, splits, format)
    files = _listed(target)
    return _of_files(files, split, splits, format, _name(files[0].parent, files))


def _listed(target: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    if isinstance(target, str | os.PathLike):
        pattern = os.path.expanduser(os.fspath(target))
        files = sorted(Path(p) for p in glob.glob(pattern) if Path(p).is_file())
        if not files:
            raise ValueError(f"{pattern!r} names no files; pass a directory, a glob or files")
        return files
    files = [Path(p).expanduser() for p in target]
    missing = [str(p) for p in files if not p.is_file()]
    if missing or not files:
        raise ValueError(f"dataset files {missing or '[]'} do not exist; pass existing files")
    return sorted(files, key=lambda p: p.name)


def _in_directory(directory: Path, split: str, splits: Sequence[str], format: str | None):
    name = directory.resolve().name
    if format in (None, "tfds") and prepared.is_tfds_directory(directory):
        record_format, files, classes = prepared.tfds_split(directory, split)
        name = files[0].parent.parent.name  # <name>/<version>/: the dataset's name
        return Found("tfds", tuple(files), name, record_format, tuple(classes))
    if format in (None, "hf") and prepared.is_hf_directory(directory):
        files, classes = prepared.hf_split(directory, split)
        return Found("hf", tuple(files), name, "arrow", tuple(classes))
    if format in (None, "imagefolder"):
        laid_out = [s for s in splits if (directory / s).is_dir() and _image_folder(directory / s)]
        if laid_out:
            if split not in laid_out:
                raise _missing(directory, split, laid_out, "image folders")
            # Labels from the classes of all splits: a class missing from one
            # split must not shift the others' labels there.
            classes = {c for s in laid_out for c in imagefolder.folder_classes(directory / s)}
            return Found("imagefolder", (directory / split,), name, classes=tuple(sorted(classes)))
        if _image_folder(directory):
            if split != splits[0]:
                raise _one_split(directory, split, splits[0], "image folder")
            return _folder(directory, name)
    if format in (None, *FILE_FORMATS):
        laid_out = [s for s in splits if _format_files(directory / s, format)]
        if laid_out:
            if split not in laid_out:
                raise _missing(directory, split, laid_out, "file splits")
            _warn_left_out(directory, format)
            return _of_files(_format_files(directory / split, format), split, [split], format, name)
        files = _format_files(directory, format)
        if files:
            return _of_files(files, split, splits, format, name)
    if format is not None:
        raise FileNotFoundError(f"{directory} holds no {format} data; {_found(directory)}")
    return None


class LeftOutFilesWarning(UserWarning):
    """Files of a directory laid out in split subdirectories that no split reads."""


def _warn_left_out(directory: Path, format: str | None) -> None:
    """Warns of the files beside ``directory``'s split subdirectories, and in
    a subdirectory named for a split jaxfeed does not read (``validation/``):
    no split reads them (as for ``.npy`` directories), and a user should know."""
    others = sorted(d for d in directory.iterdir() if d.name.lower() in _OTHER_SPLITS)
    left = [
        *_format_files(directory, format),
        *(f for d in others for f in _format_files(d, format)),
    ]
    if left:
        more = f", ... ({len(left)} in all)" if len(left) > 4 else ""
        warnings.warn(
            f"{directory}: {', '.join(str(p.relative_to(directory)) for p in left[:4])}{more} "
            "are in no split: only its split subdirectories are read; a validation split "
            "is not read as 'test' (rename the directory test/ if it is the one to evaluate "
            "on), and files beside the subdirectories belong to none (move them into one)",
            LeftOutFilesWarning,
            stacklevel=2,
        )


def _folder(directory: Path, name: str) -> Found:
    classes = imagefolder.folder_classes(directory)
    return Found("imagefolder", (directory,), name, classes=tuple(classes))


def _image_folder(directory: Path) -> bool:
    return imagefolder.is_image_folder(directory)


def _format_files(directory: Path, format: str | None) -> list[Path]:
    if not directory.is_dir():
        return []
    files = [p for p in sorted(directory.iterdir()) if p.is_file() and not p.name.startswith(".")]
    return [p for p in files if (file_format(p) or "") in ((format,) if format else FILE_FORMATS)]


def _of_files(
    files: list[Path], split: str, splits: Sequence[str], format: str | None, name: str
) -> Found:
    formats = {format or file_format(p) for p in files}
    if None in formats or len(formats) > 1:
        kinds = {p.name: file_format(p) for p in files[:8]}
        raise ValueError(
            f"dataset files hold no one known format ({kinds}); pass files of one of "
            f"{list(FILE_FORMATS)}, or say which with format="
        )
    return Found(formats.pop(), tuple(named_split(files, split, splits)), name)


def named_split(files: Sequence[PurePath], split: str, splits: Sequence[str]) -> list[PurePath]:
    """The files of ``split`` among ``files`` by their names (a file is in the
    split its name holds as a word); all of them for the first split when
    none names one.

    Raises:
      ValueError: files a split would leave out or read twice (`_check_split_names`).
      MissingSplitError: no file is in ``split``.
    """
    files = list(files)
    named = {s: [p for p in files if _names_split(p.name, s)] for s in splits}
    laid_out = [s for s in splits if named[s]]
    _check_split_names(files, splits, laid_out)
    if laid_out:
        if split not in laid_out:
            raise _missing(files[0].parent, split, laid_out, "file-name splits")
        return named[split]
    if split != splits[0]:
        raise _one_split(files[0].parent, split, splits[0], "files")
    return files


def _names_split(file_name: str, split: str) -> bool:
    """Whether ``split`` is a word of ``file_name``, in any case, between its
    start or end and any character but a letter: ``train-00000-of-00004.parquet``,
    ``mnist-TEST.tfrecord-00000``, ``data_train2017.arrow``; not ``contest.parquet``."""
    return re.search(rf"(?<![a-z]){re.escape(split)}(?![a-z])", file_name.lower()) is not None


def _check_split_names(files: list[PurePath], splits: Sequence[str], laid_out: list[str]) -> None:
    """Refuses files a split would leave out, or read twice: where some name a
    split, one naming none (``contest-0.parquet``, ``validation-0.parquet``)
    or both; where none does, files naming different splits jaxfeed does not
    read (``training-*`` and ``testing-*``: both would be the train split)."""
    words = {p: {w for w in (*splits, *_OTHER_SPLITS) if _names_split(p.name, w)} for p in files}
    rule = (
        "a file is in the split its name holds as a word, in any case (train-00000.parquet, "
        f"data_TEST.arrow; not contest.parquet); jaxfeed's splits are {list(splits)}, and a "
        f"validation split is not read as {splits[-1]!r} (rename its files {splits[-1]}-* if "
        "it is the one to evaluate on)"
    )
    if not laid_out:
        if len({frozenset(w) for w in words.values()}) > 1:
            named = sorted({w for found in words.values() for w in found})
            raise ValueError(
                f"{files[0].parent}: its files name the splits {named} (and none "
                f"{list(splits)}), so they are no one split: {rule}. Rename them, or pass "
                "one split's files (a list or a glob)"
            )
        return
    stray = [p for p in files if len(words[p] & set(splits)) != 1]
    if stray:
        more = f", ... ({len(stray)} in all)" if len(stray) > 4 else ""
        raise ValueError(
            f"{files[0].parent}: {', '.join(p.name for p in stray[:4])}{more} would be in no "
            f"split, or in several, beside {len(files) - len(stray)} files of the "
            f"{laid_out} splits: {rule}. Rename them, move them out, or pass only the "
            "files you mean (a list or a glob)"
        )


def _name(parent: Path, files: list[Path]) -> str:
    return files[0].name.split(".")[0] if len(files) == 1 else parent.resolve().name


def _missing(directory: PurePath, split: str, laid_out: list[str], what: str) -> MissingSplitError:
    return MissingSplitError(
        f"{directory} has no {split!r} split: its {what} are {laid_out}; add {split} data "
        "beside them"
    )


def _one_split(directory: PurePath, split: str, first: str, what: str) -> MissingSplitError:
    return MissingSplitError(
        f"{directory} has no {split!r} split: its {what} are one split, {first!r}; to have "
        f"both, put them in {first}/ and {split}/ subdirectories (or name the files "
        f"{first}-* and {split}-*)"
    )


def _found(directory: Path) -> str:
    entries = sorted(directory.iterdir(), key=lambda p: p.name)
    shown = ", ".join(p.name + ("/" if p.is_dir() else "") for p in entries[:8])
    more = f", ... ({len(entries) - 8} more)" if len(entries) > 8 else ""
    return f"it holds {shown}{more}" if entries else "it is empty"


def unknown_directory(directory: Path) -> FileNotFoundError:
    """The error for a directory that holds no data jaxfeed reads."""
    return FileNotFoundError(
        f"{directory} holds no dataset jaxfeed reads: looked for {_LOOKED_FOR}; "
        f"{_found(directory)}. Pass format= to say which format its files are"
    )
