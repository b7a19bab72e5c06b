"""Work split over forked processes: the candidates of one bound build priced a share per CPU core.

A build's candidates are independent (each one's values are its own sums), so :func:`split` prices shares of
them in child processes made by ``fork`` (each starts with the parent's memory: the graph, the pricer and its
caches, nothing copied) while the parent prices the first share, and returns the shares' results in order:
the values are those one process computes. A child sends back arrays only (``numpy.save`` without pickles) and
leaves by ``os._exit``; a share whose child fails (killed, out of memory, an error) is priced again by the
parent, which raises whatever pricing it raises. What children price is not remembered by the parent's caches.

Forked only where that is safe and pays: on Linux (``fork`` without ``exec`` is unsafe with macOS's system
libraries), with one Python thread (a forked child holds no other thread, nor its locks), without JAX imported
(multithreaded: a fork may deadlock it), with more than one core available and at least :data:`MIN_SHARE`
candidates per share. ``LAYOUTSEARCH_PROCESSES``: the most processes to use (1: never fork)."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence

import numpy as np

MIN_SHARE = 192
"""Candidates per share, at least: a build costs about 0.1 s whatever its candidates, and a fork of a large
process some milliseconds; below this, one process is faster."""


def processes(n: int) -> int:
    """How many processes to split ``n`` candidates over (1: no fork)."""
    if not sys.platform.startswith("linux") or "jax" in sys.modules or threading.active_count() > 1:
        return 1
    cores = len(os.sched_getaffinity(0))
    cap = os.environ.get("LAYOUTSEARCH_PROCESSES", "")
    most = int(cap) if cap.isdigit() and int(cap) > 0 else cores
    return max(1, min(cores, most, n // MIN_SHARE))


def split(n: int, work: Callable[[np.ndarray], Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
    """The results of ``work`` (arrays) on consecutive shares of ``range(n)`` that together cover it, in order:
    one share (all of it) unless :func:`processes` allows more, those past the first in forked children."""
    k = processes(n)
    shares = np.array_split(np.arange(n), k)
    children: list[tuple[int, int]] = []
    try:
        children = [_start(work, share) for share in shares[1:]]
        parts = [list(work(shares[0]))]
        while children:
            pid, fd = children.pop(0)
            got = _collect(pid, fd)
            parts.append(got if got is not None else list(work(shares[len(parts)])))
        return parts
    finally:
        for pid, fd in children:  # (the parent failed or was interrupted: the children go too)
            os.close(fd)
            _stop(pid)


def _start(work: Callable[[np.ndarray], Sequence[np.ndarray]], share: np.ndarray) -> tuple[int, int]:
    """A child pricing ``share``, writing its arrays to a pipe: (its pid, the pipe's read end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the parent's code
        status = 1
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C is the parent's: it stops the children)
            os.close(r)
            buf = io.BytesIO()
            arrays = list(work(share))
            np.save(buf, np.array(len(arrays)))
            for a in arrays:
                np.save(buf, np.asarray(a), allow_pickle=False)
            with os.fdopen(w, "wb") as f:
                f.write(buf.getvalue())
            status = 0
        finally:
            os._exit(status)
    os.close(w)
    return pid, r


def _stop(pid: int) -> None:
    """Kill child ``pid`` and reap it."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _collect(pid: int, fd: int) -> list[np.ndarray] | None:
    """The arrays the child ``pid`` wrote to ``fd``; None when it failed."""
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0:
        return None
    buf = io.BytesIO(data)
    try:
        count = int(np.load(buf, allow_pickle=False))
        return [np.load(buf, allow_pickle=False) for _ in range(count)]
    except (ValueError, EOFError, OSError):
        return None


__all__ = ["MIN_SHARE", "processes", "split"]
