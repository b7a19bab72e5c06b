"""Pictures of a plan (matplotlib, the optional ``plot`` extra): step time vs devices per strategy, and
the pipeline schedule of a pipelined plan.

:func:`plot_plan` writes one PNG: the predicted step time of the chosen layout and of each baseline
(data parallel, FSDP, Megatron, Mesh-TF 2-D) as the plan's data axis grows from 1 to its size (the other
axes fixed; each at the plan's remat policy, priced by the same cost model), and for a pipelined plan its
schedule (forward and backward slots of each stage, the bubble idle).
"""

from __future__ import annotations

import os
from typing import Any

from layoutsearch.errors import LayoutSearchError
from layoutsearch.gantt import gpipe_schedule, one_f_one_b_schedule
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LayoutSearchError("plots need matplotlib: pip install 'layoutsearch[plot]'") from None
    return plt


def scaling(plan: Any) -> tuple[str, list[int], dict[str, list[float | None]]]:
    """(axis, device counts, {strategy: step seconds or None where it does not apply}) as the plan's data
    axis (the first axis the chosen layout splits the batch over, else the first mesh axis) grows in
    powers of two up to its size."""
    from layoutsearch.solvers.search import price_plan

    c = plan.chosen
    mesh = c.layout.mesh
    batch_axes = c.layout.rules_layout(("batch",)).get("batch", ())
    axis = next((a for a in (*batch_axes, *mesh.names) if a != c.stage_axis), mesh.names[0])
    sizes = [s for s in (2**k for k in range(20)) if s <= mesh.axis_size(axis) and mesh.axis_size(axis) % s == 0]
    strategies = ({"chosen": c} if c.rules is not None else {}) | {  # (a per-op layout has no rules to resize)
        b.name: b.plan for b in plan.baselines if b.plan is not None}
    devices, out = [], {name: [] for name in strategies}
    for s in sizes:
        m = Mesh(tuple((a, s if a == axis else n) for a, n in mesh.axes))
        devices.append(m.size)
        for name, p in strategies.items():
            try:
                priced = price_plan(plan.model, Layout(m, p.layout.rules).check(plan.model), plan.hardware,
                                    remat=p.remat, microbatches=p.microbatches, stage_axis=p.stage_axis,
                                    schedule=p.schedule, memory_limit=None, optimizer=plan.optimizer,
                                    precision=plan.precision, attention=plan.attention, overlap=plan.overlap)
                out[name].append(priced.step_s)
            except LayoutSearchError:
                out[name].append(None)
    return axis, devices, out


def plot_plan(plan: Any, path: str | os.PathLike[str]) -> None:
    """Write the plan's pictures to ``path`` (PNG): scaling per strategy, and the pipeline schedule."""
    if plan.model is None:
        raise LayoutSearchError("this plan has no forward graph to plot (build it with search())")
    plt = _pyplot()
    pipelined = plan.chosen.pipelined and plan.report is not None
    fig, axes = plt.subplots(1, 2 if pipelined else 1, figsize=(13 if pipelined else 7, 4.5), squeeze=False)
    axis, devices, times = scaling(plan)
    ax = axes[0][0]
    for name, ts in times.items():
        pts = [(d, t) for d, t in zip(devices, ts, strict=True) if t is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", lw=2.5 if name == "chosen" else 1.2, label=name)
    ax.set(xscale="log", yscale="log", xlabel=f"devices ({axis} axis grown)", ylabel="predicted step time (s)",
           title=f"{plan.model.name} on {plan.hardware.name}: step time vs devices")
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


def _schedule(ax: Any, report: Any) -> None:
    """The pipeline's slots per stage: forward (blue) and backward (orange) of each micro-batch."""
    K, M = report.num_stages, report.microbatches
    grid = gpipe_schedule(K, M) if report.schedule.kind == "gpipe" else one_f_one_b_schedule(K, M)
    for k, row in enumerate(grid):
        for t, cell in enumerate(row):
            if cell is not None:
                ax.broken_barh([(t, 1)], (K - 1 - k, 0.8), facecolor="tab:blue" if cell[0] == "F" else "tab:orange",
                               edgecolor="white")
                if M <= 16:
                    ax.text(t + 0.5, K - 0.6 - k, f"{cell[0]}{cell[1]}", ha="center", va="center", fontsize=7,
                            color="white")
    ax.set(xlabel="slot", yticks=[K - 1 - k + 0.4 for k in range(K)], yticklabels=[f"stage {k}" for k in range(K)],
           title=f"{report.schedule} schedule: {K} stages x {M} micro-batches, bubble {report.bubble_fraction:.1%}")


__all__ = ["plot_plan", "scaling"]
