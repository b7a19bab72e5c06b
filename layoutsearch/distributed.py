"""Multi-host runs: JAX's multi-process runtime (``jax.distributed.initialize``) with readable failures.

Every process of a job runs the same program; process 0 also hosts the coordinator. Call
:func:`initialize` first thing in every process, before anything else uses JAX, then build and run plans as
in one process (``plan.compile()`` lays the mesh over the global devices, ``jax.devices()``: process 0's
first, then process 1's, ...)::

    from layoutsearch import distributed

    distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=0)   # process 1: process_id=1
    program = ls.Plan.load("plan.json").compile()
    ...
    if distributed.is_coordinator():
        print(losses)

On CPU the processes exchange collectives with gloo (``jax_cpu_collectives_implementation``), and
``local_devices`` asks for that many simulated CPU devices per process (a 2-process job with
``local_devices=4`` has 8 devices), which is how the multi-process path is tested on one machine.

Failures: bad arguments raise :class:`~layoutsearch.errors.LayoutSearchError` at once. A coordinator that
does not answer raises one within ``timeout_s``: the processes other than 0 first wait for the
coordinator's port to accept connections. Once connected, JAX's runtime would abort the process (a C++
fatal error with a stack trace) if the job still cannot start, e.g. when a process never shows up; a
watchdog ends the process first, at ``timeout_s``, with one line ``layoutsearch: error: ...`` on stderr and
exit status 2 (an error cannot be raised from a call blocked in JAX's runtime).

JAX is imported only when :func:`initialize` is called.
"""

from __future__ import annotations

import math
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from layoutsearch.errors import LayoutSearchError

#: The exit status of a process ended by the start-up watchdog (that of invalid input on the command line).
EXIT_STATUS = 2
# JAX's own initialization timeout is ours plus this, so that our watchdog always fires first.
_BACKSTOP_S = 30


@dataclass(frozen=True)
class _Job:
    coordinator: str
    num_processes: int
    process_id: int

    @property
    def who(self) -> str:
        """This process in messages: ``process ID of N``."""
        return f"process {self.process_id} of {self.num_processes}"


_job: _Job | None = None


def parse_coordinator(coordinator: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6-address]:PORT`` for an IPv6 address) as ``(host, port)``; LayoutSearchError
    otherwise."""
    if not isinstance(coordinator, str):
        raise LayoutSearchError(f"coordinator must be HOST:PORT, got {coordinator!r}")
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]\s]+):(\d+)", coordinator.strip())
    if m is None:
        raise LayoutSearchError(f"coordinator {coordinator!r} is not HOST:PORT (e.g. 10.0.0.1:1234)")
    port = int(m.group(2))
    if not 0 < port < 65536:
        raise LayoutSearchError(f"coordinator {coordinator!r}: port {port} is not in 1..65535")
    return m.group(1).strip("[]"), port


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LayoutSearchError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise LayoutSearchError(f"{name} must be at least {low}, got {value}")
    return value


def _wait_for_port(host: str, port: int, deadline: float) -> None:
    """Return once ``host:port`` accepts a TCP connection; LayoutSearchError at ``deadline``."""
    while True:  # (one try at least, however late: the host is resolved before any timeout)
        try:
            with socket.create_connection((host, port), timeout=min(1.0, max(0.1, deadline - time.monotonic()))):
                return
        except socket.gaierror:
            raise
        except OSError as e:  # refused (nobody listens yet), unreachable
            if deadline - time.monotonic() <= 0:
                raise TimeoutError(str(e) or "timed out") from None
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def _watchdog(message: str, deadline: float) -> threading.Event:
    """A daemon thread that, unless the returned event is set by ``deadline``, prints ``message`` and ends the
    process (JAX's runtime would abort it a few seconds later with a C++ stack trace)."""
    done = threading.Event()

    def run() -> None:
        if not done.wait(max(0.0, deadline - time.monotonic())):
            sys.stdout.flush()
            sys.stderr.write(f"layoutsearch: error: {message}\n")
            sys.stderr.flush()
            os._exit(EXIT_STATUS)

    threading.Thread(target=run, name="layoutsearch-distributed-watchdog", daemon=True).start()
    return done


def _ask_local_devices(jax: Any, n: int) -> None:
    """``n`` simulated CPU devices in this process, asked for before JAX's backend starts."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags.strip()} --xla_force_host_platform_device_count={n}".strip()
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except AttributeError:  # an older JAX: the XLA flag alone
        pass


def _use_cpu_collectives(jax: Any) -> None:
    """Cross-process collectives on CPU: gloo unless another implementation (mpi) was chosen."""
    try:
        if jax.config.jax_cpu_collectives_implementation is None:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except AttributeError:  # an older JAX
        try:
            jax.config.update("jax_cpu_enable_gloo_collectives", True)
        except AttributeError:
            pass


def _backend_started() -> bool:
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - JAX's internals moved: let jax.distributed.initialize say it
        return False
    return bool(xla_bridge.backends_are_initialized())


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def initialize(coordinator: str, num_processes: int, process_id: int, *, local_devices: int | None = None,
               timeout_s: float = 60) -> None:
    """Join a job of ``num_processes`` processes as process ``process_id`` (0 hosts the coordinator at
    ``coordinator``, ``HOST:PORT``), then start JAX's backend so that ``jax.devices()`` lists the devices of
    every process. Call it before anything else uses JAX; calling it again with the same arguments does
    nothing.

    ``local_devices``: simulated CPU devices per process (CPU only; default: JAX's, or ``XLA_FLAGS``).
    ``timeout_s``: how long to wait for the coordinator and the other processes (see the module docstring
    for what happens at the deadline). LayoutSearchError for invalid arguments, a coordinator that does not
    answer, a port process 0 cannot listen on, or a JAX that has already started.
    """
    global _job
    job, host, port = _checked_job(coordinator, num_processes, process_id, local_devices, timeout_s)

    import jax

    start = time.monotonic()  # (after the import, however slow: only the wait for the others is timed)

    if _joined(jax, job):
        return
    if local_devices is not None:
        _ask_local_devices(jax, local_devices)
    _use_cpu_collectives(jax)

    deadline = start + float(timeout_s)
    waiting = _reach_coordinator(job, host, port, deadline, timeout_s)
    _start_runtime(jax, job, deadline, waiting)
    _job = job
    if jax.process_count() != num_processes:  # pragma: no cover - JAX ignored the runtime
        raise LayoutSearchError(f"JAX reports {jax.process_count()} processes, the job has {num_processes}")


def _checked_job(coordinator: str, num_processes: int, process_id: int, local_devices: int | None,
                 timeout_s: float) -> tuple[_Job, str, int]:
    """The job :func:`initialize`'s arguments describe, and the coordinator's host and port; LayoutSearchError
    for an invalid argument."""
    host, port = parse_coordinator(coordinator)
    _check_int("num_processes", num_processes, 1)
    _check_int("process_id", process_id, 0)
    if process_id >= num_processes:
        raise LayoutSearchError(f"process_id {process_id} is not below num_processes {num_processes} "
                                f"(processes are numbered 0..{num_processes - 1})")
    if local_devices is not None:
        _check_int("local_devices", local_devices, 1)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0 \
            or not math.isfinite(timeout_s):
        raise LayoutSearchError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    return _Job(coordinator.strip(), num_processes, process_id), host, port


def _joined(jax: Any, job: _Job) -> bool:
    """Whether this process has joined ``job`` already (nothing left to do); LayoutSearchError when JAX's
    multi-process runtime was initialized for another job, or JAX has started without it."""
    if jax.distributed.is_initialized():
        if job == _job:
            return True
        raise LayoutSearchError("JAX's multi-process runtime is already initialized"
                                + (f" (as process {_job.process_id} of {_job.num_processes} with coordinator "
                                   f"{_job.coordinator})" if _job is not None else ""))
    if _backend_started():
        raise LayoutSearchError("JAX has already started in this process: initialize the multi-process runtime "
                                "before anything uses JAX (devices, arrays, compiled programs)")
    return False


def _reach_coordinator(job: _Job, host: str, port: int, deadline: float, timeout_s: float) -> str:
    """For processes other than 0, wait until the coordinator's port accepts connections (LayoutSearchError at
    ``deadline``). Returns the watchdog's message for a job that then does not start in time."""
    who, num_processes = job.who, job.num_processes
    if job.process_id != 0:
        try:
            _wait_for_port(host, port, deadline)
        except socket.gaierror as e:
            raise LayoutSearchError(f"cannot resolve the coordinator's host {host!r} ({who}: {_first_line(e)})") \
                from None
        except (OSError, TimeoutError) as e:
            raise LayoutSearchError(
                f"the coordinator {job.coordinator} did not answer within {timeout_s:g} s ({who}: "
                f"{_first_line(e)}); start process 0 with the same coordinator address and check that this "
                f"host can reach it") from None
        return (f"{who} reached the coordinator {job.coordinator} but the job did not start within "
                f"{timeout_s:g} s: start all {num_processes} processes with the same coordinator and "
                f"number of processes, each with its own process id")
    others = "process 1" if num_processes == 2 else f"processes 1..{num_processes - 1}"
    return (f"process 0 of {num_processes} (the coordinator, on {job.coordinator}) waited {timeout_s:g} s "
            f"for the other processes: start {others} with the same coordinator and number of processes")


def _start_runtime(jax: Any, job: _Job, deadline: float, waiting: str) -> None:
    """Start JAX's multi-process runtime and its backend under the watchdog (``waiting``: its message at
    ``deadline``); LayoutSearchError when either fails."""
    done = _watchdog(waiting, deadline)
    try:
        try:
            jax.distributed.initialize(coordinator_address=job.coordinator, num_processes=job.num_processes,
                                       process_id=job.process_id,
                                       initialization_timeout=math.ceil(max(1.0, deadline - time.monotonic()))
                                       + _BACKSTOP_S)
        except Exception as e:  # JaxRuntimeError (e.g. the port in use), RuntimeError, ValueError
            hint = " (is the port in use?)" if job.process_id == 0 and "RPC server" in str(e) else ""
            raise LayoutSearchError(f"cannot start JAX's multi-process runtime with coordinator "
                                    f"{job.coordinator} ({job.who}): {_first_line(e)}{hint}") from None
        try:
            jax.devices()  # starts the backend: every process's devices, exchanged over the runtime
        except Exception as e:
            raise LayoutSearchError(f"JAX's multi-process runtime started but its devices did not ({job.who}): "
                                    f"{_first_line(e)}") from None
    finally:
        done.set()


def is_coordinator() -> bool:
    """Whether this is process 0 (True when JAX's multi-process runtime is not in use): the one that prints."""
    jax = sys.modules.get("jax")
    if jax is None or not jax.distributed.is_initialized():
        return True
    return jax.process_index() == 0


__all__ = ["EXIT_STATUS", "initialize", "is_coordinator", "parse_coordinator"]
