"""Time in a search: progress heartbeats for long phases, and the deadline of a time limit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Deadline:
    """When a search must stop (``at``, a ``time.perf_counter()`` value; None: never)."""

    at: float | None = None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        """The deadline ``seconds`` from now (None: no deadline)."""
        return cls(None if seconds is None else time.perf_counter() + seconds)

    def left(self) -> float | None:
        """Seconds left (0 when passed), None without a deadline."""
        return None if self.at is None else max(0.0, self.at - time.perf_counter())

    def passed(self) -> bool:
        """Whether the deadline has passed."""
        return self.at is not None and time.perf_counter() >= self.at

    def check(self) -> None:
        """:class:`TimeUp` when the deadline has passed."""
        if self.passed():
            raise TimeUp


__all__ = ["Deadline", "Progress", "TimeUp", "reporting"]
