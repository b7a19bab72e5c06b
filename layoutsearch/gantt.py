"""Text Gantt charts of the GPipe schedule (Huang et al. 2019, Figure 2c).

``K`` stages, ``M`` micro-batches: stage ``k`` runs the forward of micro-batch ``m`` at step ``k + m``
(``M + K - 1`` forward steps), then the backward passes in reverse order, the last stage first
(``M + K - 1`` backward steps). Every step lasts as long as the slowest stage, so a stage is idle for
``(K - 1) / (M + K - 1)`` of the step (the bubble) plus whatever it is faster than the slowest stage.
"""

from __future__ import annotations

from collections.abc import Sequence

Cell = tuple[str, int] | None
"""One stage at one step: ``("F", m)`` forward or ``("B", m)`` backward of micro-batch ``m``; None idle."""

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


def render_gantt(stages: int, microbatches: int, *, labels: Sequence[str] | None = None,
                 times: Sequence[float] | None = None) -> str:
    """The GPipe schedule as text, one row per stage: ``F3`` forward / ``B3`` backward of micro-batch 3,
    ``.`` idle; a ``|`` separates the forward and backward phases. ``times`` (per-stage seconds per
    micro-batch) adds each stage's busy fraction, ``M t_k / ((M + K - 1) max t)``."""
    grid = gpipe_schedule(stages, microbatches)
    labels = list(labels) if labels is not None else [f"stage {k}" for k in range(stages)]
    if len(labels) != stages or (times is not None and len(times) != stages):
        raise ValueError(f"need one label and one time per stage ({stages})")
    steps = microbatches + stages - 1
    compact = microbatches > COMPACT_ABOVE
    width = 1 if compact else len(f"F{microbatches - 1}")

    def cell(c: Cell) -> str:
        text = "." if c is None else c[0] if compact else f"{c[0]}{c[1]}"
        return text.ljust(width)

    sep = "" if compact else " "
    pad = max(map(len, labels))
    frac = bubble_fraction(stages, microbatches)
    lines = [f"GPipe schedule: {stages} stages x {microbatches} micro-batches, {steps} forward + {steps} backward "
             f"steps, bubble {stages - 1}/{steps} = {frac:.1%}"
             + (" (F forward, B backward, . idle)" if compact else "")]
    phase_width = steps * (width + len(sep)) - len(sep)
    lines.append(" " * (pad + 3) + "forward".ljust(phase_width) + " | backward")
    worst = max(times) if times else 0.0
    for k, row in enumerate(grid):
        fwd = sep.join(cell(c) for c in row[:steps])
        bwd = sep.join(cell(c) for c in row[steps:])
        line = f"{labels[k].ljust(pad)} | {fwd} | {bwd} |"
        if times is not None:
            busy = microbatches * times[k] / (steps * worst) if worst > 0 else 0.0
            line += f" busy {busy:.0%}"
        lines.append(line)
    return "\n".join(lines)


def _check(stages: int, microbatches: int) -> None:
    if stages < 1 or microbatches < 1:
        raise ValueError(f"need at least one stage and one micro-batch, got K={stages}, M={microbatches}")
