"""The library speaks in its own words (house style 22): its errors name the
argument the caller passed (``data_dir=``, ``coordinator=``), and only the
command line translates them into its flags (``jaxfeed.cli.args.FLAGS``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from jaxfeed.loaders.data import mnist
from jaxfeed.loaders.data.catalog import load_dataset
from jaxfeed.sharding import initialize

from jaxfeed.cli import main
from jaxfeed.cli.args import FLAGS
from jaxfeed.training.checkpoint import Checkpointer, Checkpointing

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("loaders", "sharding", "jaxfeed")
COMMAND_LINE = Path("jaxfeed", "cli")
FLAG = re.compile(r"--[A-Za-z][\w-]*")
# Flags of other programs, which a library message may rightly name.
# docker run's, for a container's small /dev/shm; ray start's, for a cluster to join
OTHER_PROGRAMS = {"--shm-size", "--head"}


def _is_warn(node: ast.AST) -> bool:
    """``warnings.warn(...)`` or ``warn(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr == "warn" and ast.unparse(func.value) == "warnings"
    return isinstance(func, ast.Name) and func.id == "warn"


def _messages(paths: list[Path]) -> list[tuple[str, str]]:
    """``(path:line, text)`` of each string literal in a ``raise`` or a
    ``warnings.warn`` in ``paths``; an f-string gives its literal parts."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) or _is_warn(node):
                for part in ast.walk(node):
                    if isinstance(part, ast.Constant) and isinstance(part.value, str):
                        found.append((f"{path.relative_to(ROOT)}:{node.lineno}", part.value))
    return found


def library_messages(root: Path) -> list[tuple[str, str]]:
    """The messages of the library modules under ``root``: all but the CLI's."""
    paths = [
        path
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        if not path.relative_to(root).is_relative_to(COMMAND_LINE)
    ]
    return _messages(paths)


def flags_named(root: Path) -> list[str]:
    """``path:line: --flag`` for each command-line flag a library message names."""
    return [
        f"{where}: {flag}"
        for where, text in library_messages(root)
        for flag in FLAG.findall(text)
        if flag not in OTHER_PROGRAMS
    ]


def test_library_messages_name_no_command_line_flag():
    named = flags_named(ROOT)
    assert not named, (
        f"library errors and warnings name command-line flags: {named}. Name the "
        f"argument the caller passed (data_dir=...), and add its flag to "
        f"jaxfeed.cli.args.FLAGS"
    )


def test_each_argument_the_command_translates_is_one_the_library_names():
    texts = [text for _, text in library_messages(ROOT)]
    unused = [argument for argument in FLAGS if not any(argument in text for text in texts)]
    assert not unused, f"no library message says {unused}: drop them from FLAGS"


def test_the_commands_own_errors_say_nothing_it_would_translate():
    own = _messages(sorted((ROOT / COMMAND_LINE).rglob("*.py")))
    said = [(where, a) for where, text in own for a in FLAGS if a in text]
    assert not said, f"the command's own errors use the library's spellings: {said}"


def _command_error(capsys, *argv: str) -> str:
    assert main(["train", "--epochs", "1", "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxfeed: error: ") and err.count("\n") == 1, err
    return err


def test_a_data_dir_without_mnist_is_data_dir_or_data_dir_flag(mnist_dir, capsys):
    # mnist_dir holds no training images.
    with pytest.raises(FileNotFoundError) as raised:
        load_dataset("mnist", "train", data_dir=mnist_dir)
    said = str(raised.value)
    assert said.startswith(f"data_dir={mnist_dir} lacks {mnist.TRAIN_IMAGES}"), said
    assert not FLAG.search(said)

    err = _command_error(capsys, "--dataset", "mnist", "--data-dir", str(mnist_dir))
    assert f"jaxfeed: error: --data-dir {mnist_dir} lacks {mnist.TRAIN_IMAGES}" in err, err
    assert "data_dir=" not in err


def test_a_checkpoint_directory_in_use_is_named_as_the_caller_gave_it(tmp_path, capsys):
    directory = tmp_path / "run"
    first = Checkpointer(Checkpointing(directory), {}, {"processes": 1, "devices": 1})
    try:
        with pytest.raises(ValueError) as raised:
            Checkpointer(Checkpointing(directory), {}, {"processes": 1, "devices": 1})
        said = str(raised.value)
        assert said.endswith("give this run its own Checkpointing(directory=...)"), said
        assert not FLAG.search(said)

        err = _command_error(capsys, "--batch-size", "500", "--checkpoint-dir", str(directory))
        assert f"{directory} is in use by another run" in err, err
        assert err.endswith("give this run its own --checkpoint-dir\n"), err
    finally:
        first.close()


def test_a_job_missing_its_process_count_is_named_as_the_caller_gave_it(monkeypatch, capsys):
    for variable in ("NUM_PROCESSES", "PROCESS_ID"):  # only the coordinator is given
        monkeypatch.delenv(f"JAXFEED_{variable}", raising=False)
        monkeypatch.delenv(f"JAX_{variable}", raising=False)
    with pytest.raises(ValueError) as raised:
        initialize("127.0.0.1:9")
    said = str(raised.value)
    assert "Pass coordinator=HOST:PORT, num_processes=N and process_id=I" in said, said
    assert not FLAG.search(said)

    err = _command_error(capsys, "--coordinator", "127.0.0.1:9")
    assert "Pass --coordinator HOST:PORT, --num-processes N and --process-id I" in err, err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        # Was an OverflowError from bind(), with its traceback and exit status 1.
        (["--coordinator", "127.0.0.1:99999", "--num-processes", "2", "--process-id", "0"],
         "--coordinator '127.0.0.1:99999' is not HOST:PORT with a port in [1, 65535]"),
        (["--coordinator", "nohost", "--num-processes", "2", "--process-id", "1"],
         "--coordinator 'nohost' is not HOST:PORT"),  # was "coordinator must be HOST:PORT"
        # Were "[Errno 20] Not a directory", once training had begun.
        (["--tensorboard", "FILE"], "--tensorboard FILE is a file; pick a directory"),
        (["--tensorboard", "FILE/tb"], "--tensorboard FILE/tb lies under the file FILE; pick a"),
        (["--checkpoint-dir", "FILE/ck"], "--checkpoint-dir FILE/ck lies under the file FILE; "),
    ],
)  # fmt: skip
def test_bad_multi_process_and_output_flags_are_refused_by_name(tmp_path, capsys, flags, said):
    file = tmp_path / "file"
    file.write_text("")
    flags = [flag.replace("FILE", str(file)) for flag in flags]
    assert main(["train", "--epochs", "1", "--quiet", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("jaxfeed: error: ") and captured.err.count("\n") == 1
    assert said.replace("FILE", str(file)) in captured.err, captured.err
    assert captured.out == ""  # refused before any work
    assert sorted(tmp_path.iterdir()) == [file]  # and nothing made


def test_a_bad_coordinator_is_named_as_the_caller_gave_it():
    with pytest.raises(ValueError) as raised:
        initialize("nohost", num_processes=2, process_id=1)
    said = str(raised.value)
    assert said.startswith("coordinator='nohost' is not HOST:PORT"), said
    assert not FLAG.search(said)
