"""``jaxfeed train``: its arguments, and the run: build the sources, agree with the
other processes, train the MNIST MLP through `jaxfeed.fit`, report each epoch."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from jaxfeed.cli.args import (
    DATA_DIR_HELP,
    DATASET_HELP,
    DEVICES_HELP,
    Datasets,
    add_storage_option,
    check_directory,
    check_writable,
    in_flags,
    learning_rate,
    momentum,
    non_negative,
    one_line,
    option,
    pick_devices,
    positive,
    public_command,
    seconds,
    seed,
    set_devices,
    storage_options,
    subcommand,
    weights,
)
from jaxfeed.cli.train_data import (
    check_fields_and_classes,
    data_record,
    dataset_used,
    image_transform,
    is_named,
    parts,
)
from jaxfeed.mnist.train import TrainConfig  # already imported with the jaxfeed package

FLOAT_IMAGE_LEARNING_RATE = 0.01
# How long a process that lost a peer waits to learn which one (see _lost_peer).
_NAME_WAIT_S = 2.0


def add_train(commands: argparse._SubParsersAction) -> None:
    train = subcommand(commands, "train", help="train the MNIST MLP through one loader backend")
    train.add_argument("--loader", default="numpy", help="backend name (see `jaxfeed backends`)")
    train.add_argument(
        "--dataset",
        action=Datasets,
        default="mnist-sample",
        help=DATASET_HELP + "; given several times with --weights: their mixture "
        "(docs/mixtures.md), an epoch ending when the first has been read once",
    )
    train.add_argument(
        "--weights",
        type=weights,
        default=None,
        metavar="W1,W2,...",
        help="the mixture's weights, one per --dataset (e.g. 0.7,0.3)",
    )
    train.add_argument(
        "--mix-by",
        choices=("row", "batch"),
        default="row",
        help="a mixture's rows drawn by weight (row) or exact shares in every batch (batch)",
    )
    train.add_argument(
        "--reweight",
        action="store_true",
        help="resume a mixture with other --weights on purpose (each dataset goes on "
        "from where it stood)",
    )
    train.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    add_storage_option(train)
    train.add_argument(
        "--resize",
        action="store_true",
        help="resize encoded images (an image folder, TFRecord shards, ...) to the MLP's "
        "28x28 grayscale; without it another size is refused",
    )
    defaults = TrainConfig()
    train.add_argument("--epochs", type=positive, default=defaults.epochs, help="epochs to train")
    train.add_argument("--batch-size", type=positive, default=128, help="per-process batch size")
    train.add_argument("--seed", type=seed, default=defaults.seed, help="shuffle and init seed")
    train.add_argument(
        "--learning-rate",
        type=learning_rate,
        default=None,
        help=f"SGD learning rate (> 0); None: {defaults.learning_rate} for uint8 images "
        f"(scaled to [0, 1]), {FLOAT_IMAGE_LEARNING_RATE} for float images (normalised to "
        "unit variance, as digits-png's augmentation gives them: many times the input energy)",
    )
    train.add_argument(
        "--momentum", type=momentum, default=defaults.momentum, help="SGD momentum, in [0, 1)"
    )
    train.add_argument(
        "--steps-per-transfer",
        type=positive,
        default=defaults.steps_per_transfer,
        help="batches per host-to-device transfer, run as one lax.scan (same result as 1)",
    )
    shuffle = train.add_mutually_exclusive_group()
    shuffle.add_argument("--no-shuffle", action="store_true", help="read in file order")
    shuffle.add_argument(
        "--block-shuffle",
        type=positive,
        metavar="ROWS",
        help="shuffle blocks of ROWS contiguous rows, and rows within windows of 16 blocks, "
        "instead of every row: disk-speed reads of data bigger than memory (docs/data.md)",
    )
    train.add_argument(
        "--drop-remainder", action="store_true", help="drop the last partial batch, not pad it"
    )
    train.add_argument(
        "--loader-option",
        type=option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="backend option, e.g. num_workers=2 (repeatable)",
    )
    train.add_argument("--devices", type=positive, default=None, metavar="N", help=DEVICES_HELP)
    train.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="multi-process: process 0's address; None: $JAXFEED_COORDINATOR, else one process",
    )
    train.add_argument(
        "--num-processes", type=positive, default=None, help="multi-process: how many"
    )
    train.add_argument(
        "--process-id",
        type=non_negative,
        default=None,
        help="multi-process: this process's index",
    )
    train.add_argument(
        "--peer-timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="multi-process: how long to wait for another process before reporting it "
        "missing; None: $JAXFEED_PEER_TIMEOUT, else 60",
    )
    train.add_argument("--json", type=Path, default=None, help="write per-epoch metrics here")
    train.add_argument("--quiet", action="store_true", help="no progress bar and no progress lines")
    train.add_argument(
        "--log-every",
        type=non_negative,
        default=None,
        metavar="N",
        help="print a progress line every N steps (0: none); None: only off a terminal "
        "(where no bar shows), about every 10%% of an epoch and at least every 30 s",
    )
    train.add_argument(
        "--tensorboard",
        type=Path,
        default=None,
        metavar="DIR",
        help="write TensorBoard scalars here (needs tensorboardX: the tensorboard extra)",
    )
    train.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="save checkpoints (Orbax) here: at every epoch's end, and see --checkpoint-every",
    )
    train.add_argument(
        "--checkpoint-every",
        type=positive,
        default=None,
        metavar="N",
        help="also save a checkpoint every N training steps; None: only at epoch ends",
    )
    train.add_argument(
        "--keep-checkpoints",
        type=positive,
        default=3,
        metavar="N",
        help="keep the newest N checkpoints",
    )
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --checkpoint-dir, exactly where it "
        "stood (starts fresh if there is none); refused on data whose content changed",
    )
    train.add_argument(
        "--resume-changed-data",
        action="store_true",
        help="with --resume: continue even though the data's content differs from what "
        "the checkpoint was trained on (a warning names what changed)",
    )
    train.add_argument(
        "--nan-policy",
        choices=("stop", "continue"),
        default="stop",
        help="stop (exit 2, naming the step and metric, saving nothing from it) when a "
        "metric becomes NaN or infinite, or continue training",
    )
    train.add_argument(
        "--save-params",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the final parameters here as .npz (layer{i}_w, layer{i}_b; process 0)",
    )


def _accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _agreed_settings(args: argparse.Namespace, sources: dict[str, Any]) -> dict[str, Any]:
    """What every process of a job must have in common: its command line and data.
    A directory is compared by its content, not its path: hosts reading local
    copies at other paths agree."""

    named = is_named(args.dataset)
    settings = {
        name: getattr(args, name)
        for name in ("loader", "batch_size", "seed", "drop_remainder", "devices")
    }
    if named:
        settings["dataset"] = args.dataset
    settings |= {
        "shuffle": _shuffle(args),
        "block_rows": args.block_shuffle,
        "loader_options": dict(args.loader_option),
        "epochs": args.epochs,
        "learning_rate": args.learning_rate,
        "momentum": args.momentum,
        "checkpoint_every": args.checkpoint_every,
        "resume": args.resume,
    }
    for split, source in sources.items():
        data = parts(source)
        if named and None in data:
            settings[f"{split}_data"] = data[None].name
        settings[f"{split}_examples"] = sum(len(d) for d in data.values())
        settings[f"{split}_fingerprint"] = data_record(source, "")["fingerprint"]
    return settings


def _shuffle(args: argparse.Namespace) -> bool | str:
    return "blocks" if args.block_shuffle else not args.no_shuffle


def _lost_peer(err: Exception) -> str | None:
    """What to say when ``err`` means another process of the job is gone, else None
    ("" when the pause watch has said it)."""
    import jax

    from jaxfeed.sharding.job.distributed import lost_processes, paused_too_long

    lost = isinstance(err, TimeoutError) or (
        isinstance(err, jax.errors.JaxRuntimeError) and "gloo" in str(err).lower()
    )
    if lost and paused_too_long():  # the others gave up on this one, as it said
        return ""
    if isinstance(err, TimeoutError):  # from check_agreement: it names the process
        return in_flags(str(err))
    if lost:
        # Process 0 sees a killed process's roll-call connection close, and tells
        # the others, about as soon as gloo fails here: wait that long for the name.
        gone = lost_processes(wait_s=_NAME_WAIT_S)
        who, it = "another process", "That process"
        if gone:
            names = ", ".join(f"{p} ({holder})" for p, holder in sorted(gone.items()))
            who = f"process{'es' * (len(gone) > 1)} {names}"
            it = "It" if len(gone) == 1 else "They"
        return (
            f"process {jax.process_index()} lost its connection to {who} during "
            f"training ({one_line(str(err))}). {it} stopped: killed, out of memory "
            f"or crashed. See the other processes' logs, then restart every process"
        )
    return None


def _check_checkpoint_args(args: argparse.Namespace) -> None:
    if args.resume_changed_data and not args.resume:
        raise ValueError("--resume-changed-data goes with --resume (it accepts changed data)")
    if args.checkpoint_dir is None:
        for flag, given in (
            ("--resume", args.resume),
            ("--checkpoint-every", args.checkpoint_every is not None),
        ):
            if given:
                raise ValueError(f"{flag} needs --checkpoint-dir DIR, where checkpoints go")
    check_directory(args.checkpoint_dir, "--checkpoint-dir")


def _save_params(params: Any, path: Path) -> None:
    """The final parameters as .npz, ``layer{i}_w`` / ``layer{i}_b``; process 0 writes."""
    import jax
    import numpy as np

    if jax.process_index() != 0:
        return
    arrays = {}
    for i, (w, b) in enumerate(params):
        arrays[f"layer{i}_w"] = np.asarray(w.addressable_data(0))
        arrays[f"layer{i}_b"] = np.asarray(b.addressable_data(0))
    with path.open("wb") as f:
        np.savez(f, **arrays)


def _announce_resume(args: argparse.Namespace, settings: dict, data: dict, prefix: str) -> None:
    """Says where training resumes, or that it starts fresh; refuses a checkpoint
    written with other settings, or on other data, before any work (fit checks
    again, and warns when changed data is accepted)."""
    import warnings

    from jaxfeed.training.checkpoint import latest
    from jaxfeed.training.verify import ChangedDataWarning, check_data, check_settings

    found = latest(args.checkpoint_dir)
    if found is None:
        print(
            f"jaxfeed: {prefix}--resume: no checkpoint in {args.checkpoint_dir}; starting fresh",
            file=sys.stderr,
            flush=True,
        )
        return
    where = f"checkpoint {args.checkpoint_dir}/{found['step']}"
    check_settings(found["settings"], settings, where)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChangedDataWarning)  # fit says it, once
        check_data(found["data"], data, where, args.resume_changed_data)
    where = f"epoch {found['epoch'] + 1}, batch {found['next_batch']}"
    if found["epoch"] >= args.epochs:
        where = f"all {found['epoch']} epochs done"
    print(
        f"{prefix}resuming from step {found['step']} ({where}) in {args.checkpoint_dir}", flush=True
    )


def _mixture(args: argparse.Namespace) -> Any:
    """The `Mixture` of several ``--dataset`` (None for one); ``args.dataset``
    becomes the first (its test split is the test data).

    Raises:
      ValueError: --weights without several --dataset, or not one per dataset.
    """
    datasets = args.dataset if isinstance(args.dataset, list) else [args.dataset]
    args.dataset = datasets[0]
    if len(datasets) == 1:
        if args.weights is not None or args.reweight:
            flag = "--weights" if args.weights is not None else "--reweight"
            raise ValueError(f"{flag} is for a mixture: give --dataset more than once")
        return None
    if args.weights is None or len(args.weights) != len(datasets):
        got = "no --weights" if args.weights is None else f"{len(args.weights)} weights"
        raise ValueError(
            f"{len(datasets)} --dataset and {got}: give --weights W1,W2,... with one weight "
            "per dataset (e.g. --weights 0.7,0.3)"
        )
    import jaxfeed

    names = [Path(str(d).rstrip("/")).name or str(d) for d in datasets]
    names = [n if names.count(n) == 1 else f"{n}{i}" for i, n in enumerate(names)]
    transforms = {
        n: image_transform(d, args.data_dir, args.resize, storage_options(args))
        for n, d in zip(names, datasets, strict=True)
    }
    return jaxfeed.Mixture(
        dict(zip(names, datasets, strict=True)),
        weights=dict(zip(names, args.weights, strict=True)),
        by=args.mix_by,
        until=names[0],
        transforms={n: t for n, t in transforms.items() if t is not None},
        reweight=args.reweight,
    )


def run_train(args: argparse.Namespace) -> int:
    set_devices(args.devices)
    mixture = _mixture(args)
    check_writable(args.json, "--json")
    check_writable(args.save_params, "--save-params")
    check_directory(args.tensorboard, "--tensorboard")
    _check_checkpoint_args(args)
    import jax

    from jaxfeed import loaders
    from jaxfeed.loaders.data.on_disk import MissingSplitError
    from jaxfeed.mnist.train import train
    from jaxfeed.sharding import announce_failure, check_agreement, data_mesh, initialize
    from jaxfeed.sharding.job.distributed import leave_job
    from jaxfeed.training.checkpoint import Checkpointing
    from jaxfeed.training.loop import run_settings

    initialize(args.coordinator, args.num_processes, args.process_id, timeout_s=args.peer_timeout)
    processes = jax.process_count()
    try:  # a process that fails here tells the others, which then stop waiting for it
        mesh = data_mesh(pick_devices(jax.devices(), args.devices))
        common = dict(
            dataset=args.dataset,
            data_dir=args.data_dir,
            batch_size=args.batch_size,
            seed=args.seed,
            process_index=jax.process_index(),
            process_count=processes,
            storage_options=storage_options(args),
            transform=image_transform(
                args.dataset, args.data_dir, args.resize, storage_options(args)
            ),
            **dict(args.loader_option),
        )
        train_common = common if mixture is None else dict(common, dataset=mixture, transform=None)
        train_source = loaders.make(
            args.loader,
            split="train",
            shuffle=_shuffle(args),
            block_rows=args.block_shuffle,
            drop_remainder=args.drop_remainder,
            **train_common,
        )
        try:
            test_source = loaders.make(args.loader, split="test", shuffle=False, **common)
        except MissingSplitError as missing:  # a directory of one split: train, said so
            test_source = None
            print(f"jaxfeed train: no test data, so no test accuracy: {missing}", flush=True)
    except Exception as err:
        announce_failure(err)
        raise
    rate = args.learning_rate
    if rate is None:
        uint8 = train_source.element_spec["image"].dtype == "uint8"
        rate = TrainConfig.learning_rate if uint8 else FLOAT_IMAGE_LEARNING_RATE
    config = TrainConfig(
        epochs=args.epochs,
        learning_rate=rate,
        momentum=args.momentum,
        seed=args.seed,
        steps_per_transfer=args.steps_per_transfer,
    )
    prefix = f"[process {jax.process_index()}] " if processes > 1 else ""

    def report(m: dict) -> None:
        print(
            f"{prefix}epoch {m['epoch']}/{config.epochs}  loss {m['loss']:.4f}  "
            f"train_acc {m['train_accuracy']:.4f}  test_acc {_accuracy(m['test_accuracy'])}  "
            f"{m['samples_per_second']:,.0f} samples/s  "
            f"data-wait {100 * m['data_wait_fraction']:.1f}%  {m['seconds']:.2f}s",
            flush=True,
        )

    try:
        check_fields_and_classes(args.dataset, {"train": train_source, "test": test_source})
        if processes > 1:
            sources = {"train": train_source, "test": test_source}
            check_agreement(_agreed_settings(args, {k: v for k, v in sources.items() if v}))
        dataset = dataset_used(train_source, args.dataset) if mixture is None else str(train_source)
        print(
            f"jaxfeed train: loader={args.loader} dataset={dataset} "
            f"train={train_source.num_batches} batches x {args.batch_size} "
            f"devices={mesh.devices.size} ({mesh.devices.flat[0].platform}) "
            f"processes={processes}",
            flush=True,
        )
        # What a resumed run must share with the one that wrote the checkpoint
        # (fit adds the batch size, batches per epoch and process count).
        settings = {
            "loader": args.loader,
            "seed": args.seed,
            "shuffle": _shuffle(args),
            "drop_remainder": args.drop_remainder,
        }
        if is_named(args.dataset):  # a directory is known by its content (data, below)
            settings["dataset"] = dataset
        if args.block_shuffle:  # only then: checkpoints written before it stay resumable
            settings["block_rows"] = args.block_shuffle
        checkpoint = None
        if args.checkpoint_dir is not None:
            data = {"train": data_record(train_source, dataset)}
            if test_source is not None:
                data["test"] = data_record(test_source, dataset)
            checkpoint = Checkpointing(
                args.checkpoint_dir,
                every=args.checkpoint_every,
                keep=args.keep_checkpoints,
                data=data,
                accept_changed_data=args.resume_changed_data,
            )
            if args.resume:
                _announce_resume(args, run_settings(train_source, settings), data, prefix)
        params, history = train(
            train_source,
            test_source,
            config,
            sharding=mesh,
            on_epoch=report,
            progress=False if args.quiet else None,
            log_every=0 if args.quiet and args.log_every is None else args.log_every,
            tensorboard=args.tensorboard,
            checkpoint=checkpoint,
            resume=args.resume,
            settings=settings,
            nan_policy=args.nan_policy,
        )
    except Exception as err:
        message = _lost_peer(err) if processes > 1 else None
        if message is None:
            raise
        # A peer is gone: the job cannot shut down together, so leave now.
        if args.debug:
            traceback.print_exc()
        leave_job(message)
    if args.save_params is not None:
        _save_params(params, args.save_params)
    if args.json is not None:
        record = {
            "command": public_command(sys.argv),
            "config": dataclasses.asdict(config),
            "loader": args.loader,
            "dataset": dataset,
            "epochs": history,
        }
        args.json.write_text(json.dumps(record, indent=2, default=str))
    return 0
