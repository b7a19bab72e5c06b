"""Time in a search: progress heartbeats for long phases, and the deadline of a time limit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

Progress = Callable[[str], None]
"""A callback that reports a phase of the search in words."""


@contextmanager
def reporting(progress: Progress | None, what: str, every: float = 5.0) -> Iterator[None]:
    """Report ``what`` on entry and then every ``every`` seconds, or a fifth of the time spent when longer,
    until the block ends: the phases with no steps of their own to report (building a space, a solver's run)."""
    if progress is None:
        yield
        return
    progress(what)
    t0 = time.perf_counter()
    done = threading.Event()

    def beat() -> None:
        wait = every
        while not done.wait(wait):
            spent = time.perf_counter() - t0
            progress(f"{what}, {spent:.0f} s so far")
            wait = max(every, spent / 5)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()



class TimeUp(Exception):  # noqa: N818 -- control flow, caught inside the search
    """Raised by :meth:`Deadline.check` inside a phase that the time limit cuts short."""


@dataclass
class Deadline:
    """When a search must stop (``at``, a ``time.perf_counter()`` value; None: never).

    ``tail``: how many plans are priced after the searched phases (the baselines): the phases stop early
    enough to leave that many times the slowest plan priced so far (:meth:`priced`), so that the answer,
    baselines included, comes by ``at``. :meth:`final` is the deadline of that tail itself."""

    at: float | None = None
    tail: int = 0
    slowest: float = 0.0
    """The longest one plan's pricing took so far (seconds; :meth:`priced`)."""

    @classmethod
    def after(cls, seconds: float | None, tail: int = 0) -> Deadline:
        """The deadline ``seconds`` from now (None: no deadline), ``tail`` plans priced after it."""
        return cls(None if seconds is None else time.perf_counter() + seconds, tail)

    def _end(self) -> float | None:
        return None if self.at is None else self.at - self.tail * self.slowest

    def left(self) -> float | None:
        """Seconds left (0 when passed), None without a deadline."""
        end = self._end()
        return None if end is None else max(0.0, end - time.perf_counter())

    def passed(self) -> bool:
        """Whether the deadline (less the time its tail needs) has passed."""
        end = self._end()
        return end is not None and time.perf_counter() >= end

    def check(self) -> None:
        """:class:`TimeUp` when the deadline has passed."""
        if self.passed():
            raise TimeUp

    def priced(self, seconds: float) -> None:
        """One plan took ``seconds`` to price: the tail's plans are assumed as slow as the slowest."""
        self.slowest = max(self.slowest, seconds)

    def timed(self, price: Callable[..., T], *args: Any) -> T:
        """``price(*args)``, its duration recorded by :meth:`priced`."""
        t0 = time.perf_counter()
        try:
            return price(*args)
        finally:
            self.priced(time.perf_counter() - t0)

    def final(self) -> Deadline:
        """The deadline of the tail: ``at`` itself."""
        return Deadline(self.at)


__all__ = ["Deadline", "Progress", "TimeUp", "reporting"]
