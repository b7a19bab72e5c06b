"""Pictures of a plan (matplotlib, the optional ``plot`` extra): step time vs devices per strategy, and
the pipeline schedule of a pipelined plan.

:func:`plot_plan` writes one PNG: the predicted step time of the chosen layout and of each baseline
(data parallel, FSDP, Megatron, Mesh-TF 2-D) as the plan's data axis grows from 1 to its size (the other
axes fixed; each at the plan's remat policy, priced by the same cost model under the search's memory limit:
hollow markers where it does not fit), and for a pipelined plan its schedule (forward and backward slots of
each stage, the bubble idle, a colour legend).
"""

from __future__ import annotations

import os
from typing import Any

from layoutsearch.errors import LayoutSearchError
from layoutsearch.gantt import gpipe_schedule, interleaved_schedule, one_f_one_b_schedule
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh
from layoutsearch.units import format_bytes


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LayoutSearchError("plots need matplotlib: pip install 'layoutsearch[plot]'") from None
    return plt


def scaling(plan: Any) -> tuple[str, list[int], dict[str, list[float | None]], dict[str, list[bool]]]:
    """(axis, device counts, {strategy: step seconds or None where it does not apply}, {strategy: whether
    each point fits the search's memory limit}) as the plan's data axis (the first axis the chosen layout
    splits the batch over, else the first mesh axis) grows in powers of two up to its size. Each point is
    priced as the search prices a plan, under the search's memory limit."""
    from layoutsearch.solvers.search import price_plan

    c = plan.chosen
    mesh = c.layout.mesh
    batch_axes = c.layout.rules_layout(("batch",)).get("batch", ())
    axis = next((a for a in (*batch_axes, *mesh.names) if a != c.stage_axis), mesh.names[0])
    sizes = [s for s in (2**k for k in range(20)) if s <= mesh.axis_size(axis) and mesh.axis_size(axis) % s == 0]
    strategies = ({"chosen": c} if c.rules is not None else {}) | {  # (a per-op layout has no rules to resize)
        b.name: b.plan for b in plan.baselines if b.plan is not None}
    devices = []
    out: dict[str, list[float | None]] = {name: [] for name in strategies}
    fits: dict[str, list[bool]] = {name: [] for name in strategies}
    for s in sizes:
        m = Mesh(tuple((a, s if a == axis else n) for a, n in mesh.axes))
        devices.append(m.size)
        for name, p in strategies.items():
            try:
                priced = price_plan(plan.model, Layout(m, p.layout.rules).check(plan.model), plan.hardware,
                                    remat=p.remat, microbatches=p.microbatches, stage_axis=p.stage_axis,
                                    schedule=p.schedule, memory_limit=plan.memory_limit, optimizer=plan.optimizer,
                                    precision=plan.precision, attention=plan.attention, overlap=plan.overlap)
                out[name].append(priced.step_s)
                fits[name].append(priced.within(plan.memory_limit))
            except LayoutSearchError:
                out[name].append(None)
                fits[name].append(False)
    return axis, devices, out, fits


def _same_lines(times: dict[str, list[float | None]]) -> list[list[str]]:
    """The strategies grouped by identical step times at every point (drawn as one line, labelled together)."""
    groups: list[list[str]] = []
    for name, ts in times.items():
        for g in groups:
            ref = times[g[0]]
            if all((a is None) == (b is None) and (a is None or abs(a - b) <= 1e-9 * max(abs(a), abs(b)))
                   for a, b in zip(ref, ts, strict=True)):
                g.append(name)
                break
        else:
            groups.append([name])
    return groups


def _title(plan: Any) -> str:
    preset = plan.model.meta.get("preset")
    return f"{plan.model.name}" + (f" ({preset})" if preset else "")


def plot_plan(plan: Any, path: str | os.PathLike[str]) -> None:
    """Write the plan's pictures to ``path`` (PNG): scaling per strategy (filled markers: fits the search's
    memory limit, hollow: does not; strategies with the same times on one line, labelled together), and the
    pipeline schedule of a pipelined plan."""
    if plan.model is None:
        raise LayoutSearchError("this plan has no forward graph to plot (build it with search())")
    plt = _pyplot()
    pipelined = plan.chosen.pipelined and plan.report is not None
    slots = 2 * (plan.report.microbatches + plan.report.num_stages) if pipelined else 0
    width = max(6.5, min(22.0, 2.5 + 0.28 * slots)) if pipelined else 0
    fig, axes = plt.subplots(1, 2 if pipelined else 1, figsize=(7 + width, 4.8), squeeze=False,
                             gridspec_kw={"width_ratios": [7, width]} if pipelined else None)
    axis, devices, times, fits = scaling(plan)
    ax = axes[0][0]
    for group in sorted(_same_lines(times), key=lambda g: "chosen" in g):  # (the chosen plan drawn on top)
        name = group[0]
        pts = [(d, t, f) for d, t, f in zip(devices, times[name], fits[name], strict=True) if t is not None]
        if not pts:
            continue
        chosen = "chosen" in group
        (line,) = ax.plot([d for d, _, _ in pts], [t for _, t, _ in pts], lw=2.5 if chosen else 1.2,
                          label=" = ".join(group), zorder=3 if chosen else 2, color="black" if chosen else None)
        for d, t, f in pts:
            ax.plot([d], [t], marker="o", ms=8 if chosen else 5, color=line.get_color(),
                    markerfacecolor=line.get_color() if f else "white", zorder=5 if chosen else 4)
    if any(not f for fs in fits.values() for f in fs):
        ax.plot([], [], marker="o", ls="", color="gray", markerfacecolor="white", label="hollow: over the memory limit")
    limit = "no memory limit" if plan.memory_limit is None else f"memory limit {format_bytes(plan.memory_limit)}"
    ax.set(xscale="log", yscale="log", xlabel=f"devices ({axis} axis grown)", ylabel="predicted step time (s)",
           title=f"{_title(plan)} on {plan.hardware.name}: step time vs devices\n({limit} per device)")
    ax.set_xticks(devices, [str(d) for d in devices])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.legend(fontsize=8)
    if pipelined:
        _schedule(axes[0][1], plan.report)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise LayoutSearchError(f"cannot write plot {str(path)!r}: {e}") from None
    finally:
        plt.close(fig)


_COLOURS = {"F": "tab:blue", "B": "tab:orange"}


def _schedule(ax: Any, report: Any) -> None:
    """The pipeline's slots per stage: forward (blue) and backward (orange) of each micro-batch, idle white
    (the bubble); micro-batch numbers in the cells while they are legible."""
    from matplotlib.patches import Patch

    K, M = report.num_stages, report.microbatches
    kind = report.schedule.kind
    grid = (gpipe_schedule(K, M) if kind == "gpipe" else
            interleaved_schedule(K, report.schedule.virtual, M) if kind == "interleaved" else
            one_f_one_b_schedule(K, M))
    steps = max(len(row) for row in grid)
    labelled = steps <= 80
    for k, row in enumerate(grid):
        for t, cell in enumerate(row):
            if cell is not None:
                ax.broken_barh([(t, 1)], (K - 1 - k, 0.8), facecolor=_COLOURS[cell[0]], edgecolor="white", lw=0.5)
                if labelled:
                    ax.text(t + 0.5, K - 0.6 - k, str(cell[1]), ha="center", va="center",
                            fontsize=7 if steps <= 40 else 5, color="white")
    ax.set(xlabel="slot (one forward or backward of one micro-batch" + (", numbered)" if labelled else ")"),
           xlim=(0, steps), yticks=[K - 1 - k + 0.4 for k in range(K)], yticklabels=[f"stage {k}" for k in range(K)],
           title=f"{report.schedule} schedule: {K} stages x {M} micro-batches, bubble {report.bubble_fraction:.1%}")
    ax.legend(handles=[Patch(color=_COLOURS["F"], label="forward"), Patch(color=_COLOURS["B"], label="backward"),
                       Patch(facecolor="white", edgecolor="gray", label="idle (bubble)")],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=8, frameon=False)


__all__ = ["plot_plan", "scaling"]
