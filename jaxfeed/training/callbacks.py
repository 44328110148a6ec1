"""`Callback`: what `fit` tells a user's code as it trains, as Keras callbacks do."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Callback", "as_callbacks"]


class Callback:
    """Hooks `jaxfeed.fit` calls as it trains; a subclass overrides the ones it
    needs (each does nothing here); what a hook returns is ignored.

    Each record (see `jaxfeed.fit`) goes to one hook: `on_epoch` if it is the
    epoch's last, else `on_eval`. A plain function in ``fit(callbacks=[...])``
    is called with every record (both hooks).

    Example:
      >>> class Losses(jaxfeed.Callback):  # doctest: +SKIP
      ...     def __init__(self):
      ...         self.losses = []
      ...     def on_epoch(self, record):
      ...         self.losses.append(record["loss"])
      >>> result = jaxfeed.fit(step, state, train, epochs=3, callbacks=[Losses()])  # doctest: +SKIP
    """

    def on_step(self, info: dict[str, Any]) -> None:
        """After every step: ``{"epoch", "batch", "num_batches", "step"}``
        (host numbers: no device sync)."""

    def on_eval(self, record: dict[str, Any]) -> None:
        """With each record that ``eval_every`` makes before an epoch's end."""

    def on_epoch(self, record: dict[str, Any]) -> None:
        """With each epoch's last record, at the epoch's end."""


class _EachRecord(Callback):
    """A plain function, called with every record."""

    def __init__(self, function: Callable[[dict[str, Any]], object]):
        self.function = function

    def on_eval(self, record: dict[str, Any]) -> None:
        self.function(record)

    on_epoch = on_eval


def as_callbacks(callbacks: Sequence[Callback | Callable[[dict], object]]) -> tuple[Callback, ...]:
    """``fit``'s ``callbacks`` as `Callback` objects.

    Raises:
      TypeError: an entry is neither a `Callback` nor a function (a `Callback`
        class, not an instance, is refused too).
    """
    out = []
    for callback in callbacks:
        if isinstance(callback, Callback):
            out.append(callback)
        elif callable(callback) and not isinstance(callback, type):
            out.append(_EachRecord(callback))
        else:
            raise TypeError(
                f"callbacks takes jaxfeed.Callback objects or functions of a record, got "
                f"{callback!r}; pass an instance (MyCallback(), not MyCallback)"
            )
    return tuple(out)
