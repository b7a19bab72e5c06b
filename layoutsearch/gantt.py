"""Text Gantt charts of pipeline schedules: GPipe (Huang et al. 2019, Figure 2c), 1F1B and interleaved 1F1B.

``K`` stages, ``M`` micro-batches. GPipe: stage ``k`` runs the forward of micro-batch ``m`` at step
``k + m`` (``M + K - 1`` forward steps), then the backward passes in reverse order, the last stage
first (``M + K - 1`` backward steps). Every step lasts as long as the slowest stage, so a stage is idle
for ``(K - 1) / (M + K - 1)`` of the step (the bubble) plus whatever it is faster than the slowest stage.

1F1B (PipeDream-flush, Narayanan et al. 2021, Figure 4 top): stage ``k`` runs ``min(K - k - 1, M)``
warm-up forwards, then alternates one forward and one backward, then drains the remaining backwards; a
forward waits for the previous stage's forward of that micro-batch, a backward for the next stage's
backward. Same bubble as GPipe, but stage ``k`` holds at most ``K - k`` micro-batches in flight. The
chart gives forwards and backwards one slot each.

Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021, Figure 4 bottom): each device runs ``V`` chunks of
layers; its ticks (one chunk's forward or backward of one micro-batch) are the executor's tick tables
(:func:`layoutsearch.backend.tick_tables.interleaved`), ``2 (M V + K - 1)`` of them, so the bubble is
``(K - 1) / (M V + K - 1)``.
"""

from __future__ import annotations

from collections.abc import Sequence

Cell = tuple[str, int] | tuple[str, int, int] | None
"""One stage at one step: ``("F", m)`` forward or ``("B", m)`` backward of micro-batch ``m`` (interleaved:
``("F", m, c)``, of chunk ``c``); None idle."""

COMPACT_ABOVE = 20
"""Above this many micro-batches cells show only F/B (no micro-batch numbers)."""


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The idle fraction of a GPipe step with equal stage times: ``(K - 1) / (M + K - 1)``."""
    _check(stages, microbatches)
    return (stages - 1) / (microbatches + stages - 1)


def gpipe_schedule(stages: int, microbatches: int) -> list[list[Cell]]:
    """The schedule as a grid ``[stage][step]`` of ``2 (M + K - 1)`` steps: forwards, then backwards."""
    _check(stages, microbatches)
    steps = microbatches + stages - 1
    grid: list[list[Cell]] = [[None] * (2 * steps) for _ in range(stages)]
    for k in range(stages):
        for m in range(microbatches):
            grid[k][k + m] = ("F", m)
            grid[k][steps + (stages - 1 - k) + m] = ("B", microbatches - 1 - m)
    return grid


def one_f_one_b_schedule(stages: int, microbatches: int) -> list[list[Cell]]:
    """The 1F1B schedule as a grid ``[stage][slot]`` (one slot per forward or backward)."""
    _check(stages, microbatches)
    K, M = stages, microbatches
    order: list[list[tuple[str, int]]] = []
    for k in range(K):
        warm = min(K - k - 1, M)
        seq = [("F", m) for m in range(warm)]
        for m in range(M - warm):
            seq += [("F", warm + m), ("B", m)]
        seq += [("B", m) for m in range(M - warm, M)]
        order.append(seq)
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, micro-batch) -> slot after it ends
    free = [0] * K
    pos = [0] * K
    while any(p < len(o) for p, o in zip(pos, order, strict=True)):
        progressed = False
        for k in range(K):
            if pos[k] == len(order[k]):
                continue
            kind, m = order[k][pos[k]]
            deps = [("F", k - 1, m)] if kind == "F" and k > 0 else []
            if kind == "B":
                deps = [("F", k, m)] + ([("B", k + 1, m)] if k < K - 1 else [])
            if all(d in done for d in deps):
                start = max([free[k], *(done[d] for d in deps)])
                done[(kind, k, m)] = free[k] = start + 1
                pos[k] += 1
                progressed = True
        if not progressed:  # pragma: no cover - the order above never deadlocks
            raise AssertionError("1F1B schedule deadlocked")
    grid: list[list[Cell]] = [[None] * max(free) for _ in range(K)]
    for (kind, k, m), end in done.items():
        grid[k][end - 1] = (kind, m)
    return grid


def interleaved_schedule(stages: int, virtual: int, microbatches: int) -> list[list[Cell]]:
    """Megatron-LM's interleaved 1F1B as a grid ``[device][tick]`` of ``2 (M V + K - 1)`` ticks; a cell is
    ``("F", m, c)`` / ``("B", m, c)``: chunk ``c`` of micro-batch ``m`` (the executor's tick tables)."""
    from layoutsearch.backend.tick_tables import FORWARD, interleaved

    _check(stages, microbatches)
    plan = interleaved(stages, virtual, microbatches)
    return [[None if tick[k] is None else ("F" if tick[k][0] == FORWARD else "B", tick[k][1], tick[k][2])
             for tick in plan.ops] for k in range(stages)]


def render_gantt(stages: int, microbatches: int, *, labels: Sequence[str] | None = None,
                 times: Sequence[float] | None = None, schedule: str = "gpipe", virtual: int = 1) -> str:
    """The schedule as text, one row per stage: ``F3`` forward / ``B3`` backward of micro-batch 3, ``.``
    idle. ``schedule``: ``"gpipe"`` (a ``|`` separates the forward and backward phases), ``"1f1b"`` (one
    row of slots, forwards and backwards interleaved) or ``"interleaved"`` with ``virtual`` chunks per
    device (``F3b``: chunk 1 of micro-batch 3; one tick per chunk). ``times`` (per-stage seconds per
    micro-batch, all its chunks) adds each stage's busy fraction, ``M t_k / ((M + (K - 1) / V) max t)``."""
    labels = list(labels) if labels is not None else [f"stage {k}" for k in range(stages)]
    if len(labels) != stages or (times is not None and len(times) != stages):
        raise ValueError(f"need one label and one time per stage ({stages})")
    V = virtual if schedule == "interleaved" else 1
    steps = microbatches + stages - 1
    loop = microbatches + (stages - 1) / V  # the loop in micro-batch times of the slowest stage
    compact = microbatches > COMPACT_ABOVE
    width = 1 if compact else len(f"F{microbatches - 1}") + (V > 1)
    sep = "" if compact else " "
    pad = max(map(len, labels))
    legend = " (F forward, B backward, . idle)" if compact else ""
    bubble = f"bubble {stages - 1}/{microbatches * V + stages - 1} = {bubble_fraction(stages, microbatches * V):.1%}"

    def cells(row: Sequence[Cell]) -> str:
        return sep.join(("." if c is None else c[0] if compact else
                         f"{c[0]}{c[1]}" + (chr(ord("a") + c[2]) if V > 1 else "")).ljust(width) for c in row)

    if schedule == "interleaved":
        grid = interleaved_schedule(stages, V, microbatches)
        lines = [f"interleaved 1F1B schedule: {stages} stages x {V} chunks x {microbatches} micro-batches, "
                 f"{len(grid[0])} ticks (one chunk each: a, b, ... the device's first, second, ... chunk), "
                 f"{bubble}{legend}"]
        rows = [cells(row) for row in grid]
    elif schedule == "1f1b":
        grid = one_f_one_b_schedule(stages, microbatches)
        lines = [f"1F1B schedule: {stages} stages x {microbatches} micro-batches, {len(grid[0])} slots, {bubble}, "
                 f"stage k holds at most min(K - k, M) micro-batches{legend}"]
        rows = [cells(row) for row in grid]
    else:
        grid = gpipe_schedule(stages, microbatches)
        lines = [f"GPipe schedule: {stages} stages x {microbatches} micro-batches, {steps} forward + {steps} "
                 f"backward steps, {bubble}{legend}"]
        phase_width = steps * (width + len(sep)) - len(sep)
        lines.append(" " * (pad + 3) + "forward".ljust(phase_width) + " | backward")
        rows = [f"{cells(row[:steps])} | {cells(row[steps:])}" for row in grid]
    worst = max(times) if times else 0.0
    for k, row_text in enumerate(rows):
        line = f"{labels[k].ljust(pad)} | {row_text} |"
        if times is not None:
            busy = microbatches * times[k] / (loop * worst) if worst > 0 else 0.0
            line += f" busy {busy:.0%}"
        lines.append(line)
    return "\n".join(lines)


def _check(stages: int, microbatches: int) -> None:
    if stages < 1 or microbatches < 1:
        raise ValueError(f"need at least one stage and one micro-batch, got K={stages}, M={microbatches}")
