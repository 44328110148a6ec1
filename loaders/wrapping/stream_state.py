"""`Stream`: the epochs of a wrapped stream, where each stands, and the way back.

A stream is read through a `Cursor`, one framework's reader, pass by pass (a
pass is one iteration of the user's object). Epoch ``e`` is pass ``e``, or,
with ``steps_per_epoch=S``, batches ``[e*S, (e+1)*S)`` of one pass after
another. One cursor serves every epoch, so only the newest epoch iterator
may read.

Positions. As it reads, the stream notes where the cursor stands: after
every batch when the framework's state is cheap to take (Grain, torchdata,
HF without a shuffle buffer), and at every epoch's start (tf.data's own
checkpoint, which holds its buffers; for the others, the pass and how far
into it). A position is reached again from the nearest note before it, by
reading the batches in between again. `DeviceFeed` reads ahead, so the
position a checkpoint asks for is behind the cursor: the last `RING`
batches and `EPOCH_STARTS` epoch starts are kept.

Reading again reaches the same batches only if the stream replays its order.
So a position's state holds a digest of the batch before it
(`raw_batches.digest`), and a resume that read batches again to get there
compares the last one's: a stream that shuffles from the clock is refused,
not resumed into other batches.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from jaxfeed.loaders.wrapping.raw_batches import digest
from jaxfeed.loaders.wrapping.state_json import decode, encode

RING = 1024  # per-batch states kept: several DeviceFeed read-aheads of k-step transfers
EPOCH_STARTS = 3  # epoch starts kept: this epoch, the next one (opened during eval), a spare


class Cursor(Protocol):
    """One framework's reader of a stream, pass by pass.

    Attributes:
      per_batch: ``state()`` is cheap: the stream takes it after every batch.
      restartable: ``begin(p, None, 0)`` gives pass ``p`` from its start at
        any time. Else only the pass after the one just read (its order may
        follow from random state the passes before it left: tf.data, torch
        generators), or pass 0 of a fresh cursor; other positions need a
        ``state()``.
      refusal: None, or why no position but the live one can be reached.
      keep_state: set by `Stream` for each reader: False when nothing will ask
        for a state of what it reads, so a cursor whose state costs time
        (tf.data's checkpoints) may skip it.
    """

    per_batch: bool
    restartable: bool
    refusal: str | None
    keep_state: bool

    def begin(self, pass_: int, state: Any, in_pass: int) -> int:
        """Stands at the start of pass ``pass_`` (``state`` None), or where
        ``state()`` was taken, batch ``in_pass`` of that pass; returns the
        batch of the pass it stands at: ``in_pass``, or an earlier one (0 for
        no state; a state that holds only where the pass began) from which
        the stream reads the batches up to ``in_pass`` again, and checks them."""

    def next(self) -> Any:
        """The pass's next raw batch; StopIteration at its end."""

    def state(self) -> Any:
        """What ``begin`` needs to stand here again (see `encode`), or None:
        the pass's start, then its batches read again."""


@dataclasses.dataclass(frozen=True)
class Note:
    """Where the cursor stood: batch ``in_pass`` of pass ``pass_``, which was
    batch ``next_batch`` of ``epoch``; ``state``: the cursor's, encoded, or
    None (the pass's start, then ``in_pass`` batches read again)."""

    epoch: int
    next_batch: int
    pass_: int
    in_pass: int
    state: Any = None

    @property
    def position(self) -> tuple[int, int]:
        return self.epoch, self.next_batch


_END = object()


class Stream:
    """The epochs of a stream read through ``cursor``; `Epochs.batches`.

    Args:
      kind: the loader's name, for messages.
      cursor: the framework's reader.
      steps: ``steps_per_epoch``, or None (an epoch is a pass).
    """

    def __init__(self, kind: str, cursor: Cursor, steps: int | None):
        self.kind, self._cursor, self._steps = kind, cursor, steps
        self._per_batch = cursor.per_batch  # off if a state cannot be stored as JSON
        self._lock = threading.RLock()  # DeviceFeed may read on its own thread
        self._reader = 0  # the newest epoch iterator; only it may advance
        self._at: Note | None = None  # where the cursor stands (None: unknown)
        self._fresh = True  # the cursor has not begun: any kind can begin pass 0
        self._ended = False  # the pass of epoch `_at.epoch` has ended (epochs are passes)
        self._ring: collections.OrderedDict[tuple[int, int], Note] = collections.OrderedDict()
        self._anchors: collections.OrderedDict[int, Note] = collections.OrderedDict()
        # Digests of the batches before the last RING positions read (see `state`).
        self._digests: collections.OrderedDict[tuple[int, int], str] = collections.OrderedDict()
        self._expected: tuple[int, int, str] | None = None  # a restored state's digest
        self._replayed: str | None = None  # the digest of the last batch a seek read again

    def __call__(self, epoch: int, start: int, keep_state: bool = True) -> Iterator[Any]:
        """The raw batches from ``(epoch, start)``; ``keep_state=False``: no
        state of them will be asked for (see `Cursor.keep_state`)."""
        with self._lock:
            self._cursor.keep_state = keep_state  # (what _route's refusal depends on)
            self._route(epoch, start)  # an unreachable position is refused now, at the call
        return self._read(epoch, start, keep_state)

    def _read(self, epoch: int, start: int, keep_state: bool) -> Iterator[Any]:
        with self._lock:
            self._reader += 1  # the iterator that began reading last owns the cursor
            reader = self._reader
            self._cursor.keep_state = keep_state  # again: another call may have come between
            self._seek(epoch, start)
        while True:
            with self._lock:
                self._claim(reader)
                batch = self._step()
            if batch is _END:
                return
            yield batch

    def _claim(self, reader: int) -> None:
        if reader != self._reader:
            raise RuntimeError(
                f"the wrapped {self.kind} is read as one live stream, one epoch at a "
                f"time, and a later iter_epoch() took it over; finish each epoch first"
            )

    # --- getting to a position ------------------------------------------------------

    def _route(self, epoch: int, start: int) -> Note | None:
        """Where reading toward ``(epoch, start)`` starts: a note, or None for
        on from where the cursor stands; the nearest one.

        Raises:
          ValueError: no exact way there (see `Cursor.refusal`), naming the fix.
        """
        live = self._at is not None and self._live_reaches(epoch, start)
        refusal = self._cursor.refusal
        if refusal is not None:
            if start == 0 and self._steps is None and self._cursor.restartable:
                return Note(epoch, 0, epoch, 0)  # a fresh pass is the epoch
            if start == 0 and live:
                return None
            if start == 0 and epoch == 0 and (self._cursor.restartable or self._fresh):
                return Note(0, 0, 0, 0)
            raise ValueError(self._refused(epoch, start, refusal))
        notes = [n for n in self._notes(epoch) if n.position <= (epoch, start)]
        best = max(notes, key=lambda n: n.position, default=None)
        if live and (best is None or self._live_start(epoch) >= best.position):
            return None
        if best is None:
            raise ValueError(self._passed(epoch, start))
        return best

    def _passed(self, epoch: int, start: int) -> str:
        """Why ``(epoch, start)``, behind every note, cannot be reached, and
        what reads an epoch again."""
        starts = ", ".join(str(e) for e in sorted(self._anchors)) or "none"
        kept = f"the starts of epochs {starts} (its last {EPOCH_STARTS})"
        if self._per_batch:
            kept = f"its last {RING} batches and {kept}"
        moved = "" if self._at is None else f" (it stands in epoch {self._at.epoch})"
        return (
            f"the wrapped {self.kind} cannot come back to batch {start} of epoch {epoch}: it "
            f"is a stream, read forward, and it has moved on past that position{moved}; "
            f"it can come back only to {kept}. An old epoch of a stream "
            f"cannot be read again. To read any epoch at any time (e.g. an evaluation set "
            f"read from epoch 0 each time), wrap a random-access dataset instead (a TFDS "
            f"data_source, a torch map-style Dataset, a Grain MapDataset, a "
            f"datasets.Dataset) or pass your arrays to jaxfeed.make(dataset={{...}}); or "
            f"wrap the stream anew for each read (a new wrap starts at its epoch 0)"
        )

    def _live_start(self, epoch: int) -> tuple[int, int]:
        """Where reading on from the cursor toward ``epoch`` starts: a later
        epoch that is a pass starts with the next pass, the rest of this one
        unread."""
        at = self._at
        return (at.epoch + 1, 0) if self._steps is None and epoch > at.epoch else at.position

    def _live_reaches(self, epoch: int, start: int) -> bool:
        """Whether reading on from the cursor gets to ``(epoch, start)``."""
        at = self._at
        if self._steps is not None:
            return at.epoch * self._steps + at.next_batch <= epoch * self._steps + start
        return epoch > at.epoch or (epoch == at.epoch and at.next_batch <= start)

    def _notes(self, epoch: int) -> list[Note]:
        """Notes from which ``epoch`` is reached: this epoch's batches, recent
        epoch starts, and, for a restartable cursor, a pass's start."""
        notes = [n for (e, _), n in self._ring.items() if e == epoch]
        notes += [n for e, n in self._anchors.items() if e <= epoch]
        if self._cursor.restartable:
            first = 0 if self._steps is not None else epoch
            notes.append(Note(first, 0, first, 0))
        elif self._fresh:
            notes.append(Note(0, 0, 0, 0))
        return notes

    def _refused(self, epoch: int, start: int, refusal: str) -> str:
        return (
            f"the wrapped {self.kind} cannot restart at batch {start} of epoch {epoch}: {refusal}"
        )

    def _seek(self, epoch: int, start: int) -> None:
        """Puts the cursor at ``(epoch, start)``, reading on from the nearest note."""
        note = self._route(epoch, start)
        self._replayed = None
        if note is not None:
            self._fresh = False
            state = decode(note.state)
            at = self._cursor.begin(note.pass_, state, note.in_pass)
            self._skip_in_pass(note.pass_, at, note.in_pass)  # (from an earlier batch)
            self._at, self._ended = dataclasses.replace(note, state=None), False
            if note.next_batch == 0 and (note.state or self._cursor.restartable):
                self._keep_anchor(note)  # an epoch's start: the note comes back to it
            elif note.next_batch == 0:
                self._anchor()  # a fresh cursor's start: its state, taken now
        while self._at.position != (epoch, start):
            if self._at.epoch < epoch and (self._steps is None or self._epoch_over()):
                self._enter(self._at.epoch + 1)  # (a pass: the rest of this one unread)
            elif not self._epoch_over():
                self._step()
            else:
                self._ran_out(epoch, start)
        self._check_replay(epoch, start)

    def _check_replay(self, epoch: int, start: int) -> None:
        """After a restore, the batch read again just before ``(epoch, start)``
        is the one the state's run read there (when the state says which).

        Raises:
          ValueError: another batch: the stream does not replay its order.
        """
        expected, self._expected = self._expected, None
        if expected is None or self._replayed is None or expected[:2] != (epoch, start):
            return
        if self._replayed != expected[2]:
            raise ValueError(
                self._refused(
                    epoch,
                    start,
                    f"read again up to there, its batch {start - 1} is another (digest "
                    f"{self._replayed}) than the run the data state was taken from read "
                    f"(digest {expected[2]}): the stream does not replay the same order, as "
                    f"one that shuffles from an unseeded random source (the clock, e.g. "
                    f"WebDataset's .shuffle(1000) without a seed). Seed it (e.g. "
                    f"random.Random(seed + epoch) in __iter__, or the shuffle's own seed or "
                    f"rng), so that reading it again gives the same batches",
                )
            )

    def _ran_out(self, epoch: int, start: int) -> None:
        raise ValueError(
            f"the wrapped {self.kind} ended before batch {start} of epoch {epoch}; it "
            f"yields fewer batches than when that position was reached"
        )

    def _skip_in_pass(self, pass_: int, at: int, count: int) -> None:
        """Reads batches ``[at, count)`` of pass ``pass_`` again, keeping the
        last one's digest for `_check_replay`."""
        for index in range(at, count):
            try:
                batch = self._cursor.next()
                if index == count - 1 and self._expected is not None:
                    self._replayed = digest(batch)
            except StopIteration:
                raise ValueError(
                    f"the wrapped {self.kind}'s pass {pass_} ended before batch {count}; "
                    f"it yields fewer batches than when that position was reached"
                ) from None

    def _epoch_over(self) -> bool:
        if self._steps is not None:
            return self._at.next_batch >= self._steps
        return self._ended

    def _enter(self, epoch: int) -> None:
        """From the end of epoch ``epoch - 1`` to the start of ``epoch``."""
        if self._steps is None:
            self._cursor.begin(epoch, None, 0)
            self._at, self._ended = Note(epoch, 0, epoch, 0), False
        else:
            self._at = Note(epoch, 0, self._at.pass_, self._at.in_pass)
        self._anchor()

    def _anchor(self) -> None:
        """Notes the start of the cursor's epoch (tf.data: a checkpoint)."""
        note = self._note_here()
        if self._cursor.refusal is None:  # (taking the state may have found one)
            self._keep_anchor(note)

    def _keep_anchor(self, note: Note) -> None:
        self._anchors[note.epoch] = note
        self._anchors.move_to_end(note.epoch)
        while len(self._anchors) > EPOCH_STARTS:
            self._anchors.popitem(last=False)

    def _note_here(self) -> Note:
        """The cursor's position with the state `begin` needs to come back to
        it (none for a pass's start, or when the cursor cannot come back)."""
        at = self._at
        if self._steps is None and self._ended:  # the next epoch's pass, from its start
            at = Note(at.epoch + 1, 0, at.epoch + 1, 0)
        if (self._cursor.restartable and at.in_pass == 0) or self._cursor.refusal is not None:
            return at
        kept = self._ring.get(self._at.position)
        if kept is not None:
            return dataclasses.replace(kept, epoch=at.epoch, next_batch=at.next_batch)
        state = self._cursor.state()
        return dataclasses.replace(at, state=None if state is None else encode(state, self.kind))

    def _step(self) -> Any:
        """The next batch of the cursor's epoch, or _END; notes where it stands."""
        if self._epoch_over():
            return _END
        at = self._at
        while True:
            try:
                batch = self._cursor.next()
                break
            except StopIteration:
                if self._steps is None:
                    self._ended = True
                    return _END
                if at.in_pass == 0:
                    raise ValueError(
                        f"the wrapped {self.kind} yielded no batches in its pass {at.pass_}, "
                        f"so no epoch of steps_per_epoch={self._steps} can fill"
                    ) from None
                at = Note(at.epoch, at.next_batch, at.pass_ + 1, 0)
                self._cursor.begin(at.pass_, None, 0)
        self._at = Note(at.epoch, at.next_batch + 1, at.pass_, at.in_pass + 1)
        if self._cursor.keep_state or self._expected is not None:
            self._replayed = digest(batch)
            self._digests[self._at.position] = self._replayed
            if len(self._digests) > RING:
                self._digests.popitem(last=False)
        if self._per_batch:
            try:
                state = encode(self._cursor.state(), self.kind)
            except TypeError:  # not storable: positions are reached by reading again
                self._per_batch = False
                self._ring.clear()
            else:
                self._ring[self._at.position] = dataclasses.replace(self._at, state=state)
                if len(self._ring) > RING:
                    self._ring.popitem(last=False)
        return batch

    # --- data_state / restore_data_state ----------------------------------------------

    def state(self, epoch: int, next_batch: int) -> dict[str, Any]:
        """JSON: the stream as it stood when batch ``next_batch - 1`` of
        ``epoch`` had been read, as a note and the position it leads to.

        Raises:
          ValueError: that position cannot be reached again, saying why.
        """
        with self._lock:
            note = self._ring.get((epoch, next_batch))
            if note is None and self._at is not None and self._here_is(epoch, next_batch):
                # (with steps_per_epoch, the end of epoch - 1 is the start of epoch)
                note = dataclasses.replace(self._note_here(), epoch=epoch, next_batch=next_batch)
            if note is None:
                note = self._route(epoch, next_batch)
                if note is None:  # the cursor is behind the position: not read yet
                    raise ValueError(
                        f"batch {next_batch} of epoch {epoch} of the wrapped {self.kind} "
                        f"has not been read yet; ask for a position already read"
                    )
            refusal = self._cursor.refusal  # (taking the state may have found one)
            fresh = note.state is None and note.in_pass == 0 and self._cursor.restartable
            if refusal is not None and not (fresh and note.position == (epoch, next_batch)):
                raise ValueError(self._refused(epoch, next_batch, refusal))
            out = {
                "target": [epoch, next_batch],
                "note": [note.epoch, note.next_batch, note.pass_, note.in_pass],
                "state": note.state,
            }
            before = (epoch, next_batch)
            if next_batch == 0 and self._steps is not None:  # read last: epoch - 1's end
                before = (epoch - 1, self._steps)
            if (digest_ := self._digests.get(before)) is not None:
                out["digest"] = digest_  # of the batch before the position
            return out

    def _here_is(self, epoch: int, next_batch: int) -> bool:
        """Whether the cursor stands exactly at ``(epoch, next_batch)``."""
        at = self._at
        if self._steps is not None:
            return at.epoch * self._steps + at.next_batch == epoch * self._steps + next_batch
        if self._ended:
            return (epoch, next_batch) == (at.epoch + 1, 0)
        return at.position == (epoch, next_batch)

    def restore(self, state: dict[str, Any]) -> tuple[int, int]:
        """Makes ``state`` (from `state`) the note the next read starts from;
        returns the position it leads to.

        Raises:
          ValueError: a malformed state, or one this stream cannot reach.
        """
        try:
            epoch, next_batch = (int(v) for v in state["target"])
            note = Note(*(int(v) for v in state["note"]), state=state["state"])
            expected = state.get("digest")  # (none in a state taken before digests)
            if expected is not None and not isinstance(expected, str):
                raise TypeError(f"digest {expected!r} is not a str")
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"not a data state of a wrapped stream ({error!r}); pass what data_state() "
                f"returned, unchanged"
            ) from None
        with self._lock:
            refusal = self._cursor.refusal
            if refusal is not None and (note.in_pass or note.position != (epoch, next_batch)):
                raise ValueError(self._refused(epoch, next_batch, refusal))
            self._reader += 1  # an epoch iterator still open must not move the cursor
            self._at, self._ended = None, False
            self._ring.clear()
            self._anchors.clear()
            self._digests.clear()
            self._keep_anchor(note)
            self._expected = None if expected is None else (epoch, next_batch, expected)
            if expected is not None:
                self._digests[epoch, next_batch] = expected
        return epoch, next_batch
