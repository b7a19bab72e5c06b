"""A cost report in plain words: what each split of the layout costs, and where the memory goes.

:func:`explain` turns a :class:`~layoutsearch.costmodel.report.CostReport` into sentences, one per kind of
communication the layout causes (grouped by the overlap class of :mod:`~layoutsearch.costmodel.overlap`:
parameter gathers, gradient reductions, collectives on the critical path), each naming the dims whose
split causes it, how many collectives of how many bytes a step runs, their time and how much of it the
schedule hides behind compute; then the compute, the kernel launches and the peak memory by category.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from layoutsearch.costmodel.overlap import classify, collective_classes
from layoutsearch.costmodel.render import launches
from layoutsearch.costmodel.step import training_step
from layoutsearch.ir.graph import Graph
from layoutsearch.units import format_bytes, format_seconds

_SPLIT = re.compile(r"(\w+) (?:un)?split over ([\w+]+)|\((\w+) over ([\w+]+)\)")

_WHY = {
    "weight": "parameters are stored split over {axes} (FSDP / ZeRO-3) and gathered where an op needs them whole; "
              "prefetched one layer ahead",
    "gradient": "each {axes} shard computes the gradients of its own examples; they are summed across {axes} "
                "(data parallelism), deferred behind the backward pass",
    "decomposed": "a collective matmul: the transfer is split into steps that overlap the matmul",
    "critical": "dims split over {axes} are contracted or regathered inside a layer (tensor / sequence "
                "parallelism): the next op waits for the result",
    "loss": "the loss, combined over the {axes} shards of the tokens it averages",
}
_WHAT = {"weight": "parameter", "gradient": "gradient", "decomposed": "overlapped", "critical": "critical-path",
         "loss": "loss"}


def _dims(causes: list[str]) -> list[str]:
    """The dims named as split (or unsplit) in the causes, in first-seen order."""
    out: dict[str, None] = {}
    for cause in causes:
        for m in _SPLIT.finditer(cause):
            out[m.group(1) or m.group(3)] = None
    return list(out)


def explain(report: Any, graph: Graph) -> list[str]:
    """Plain-words sentences about ``report`` (a CostReport of ``graph``, its forward or training graph):
    communication by cause, compute, memory."""
    trained = training_step(graph, report.optimizer, report.precision)
    classes = collective_classes(trained)
    groups: dict[tuple[str, str, tuple[str, ...]], list[Any]] = defaultdict(list)
    for c in report.collectives:
        cls = "loss" if c.tensor == trained.loss else classify(c, classes)
        groups[(cls, c.kind, c.axes)].append(c)
    lines = []
    by_class = report.exposure.to_dict()["by_class"] if report.exposure else {}  # None: no overlap asked for
    exposed = {k: v["exposed_s"] / v["seconds"] if v["seconds"] else 0.0 for k, v in by_class.items()}
    for (cls, kind, axes), cs in sorted(groups.items(), key=lambda kv: -sum(c.seconds for c in kv[1])):
        seconds = sum(c.seconds for c in cs)
        dims = _dims([c.cause for c in cs])
        ax = "+".join(axes)
        hidden = 1.0 - min(1.0, exposed.get(cls, 1.0))  # the loss's reduction is critical
        lines.append(f"{_WHAT[cls]} {kind} over {ax}"
                     f"{' (' + ', '.join(dims) + ')' if dims else ''}: {len(cs)} per step, "
                     f"{format_bytes(sum(c.bytes for c in cs))}, {format_seconds(seconds)}"
                     f"{f', {hidden:.0%} hidden' if hidden > 0.005 else ''} — {_WHY[cls].format(axes=ax)}.")
    if not groups:
        lines.append("no communication: every op runs on local data.")
    mfu = f", {report.mfu:.0%} MFU" if report.mfu else ""
    lines.append(f"compute {format_seconds(report.compute_s)}{mfu}; communication {format_seconds(report.comm_s)}, "
                 f"{format_seconds(report.comm_exposed_s)} of it exposed; step {format_seconds(report.step_s)}.")
    lines.append(f"kernel launches {format_seconds(report.launch_s)}: "
                 f"{launches(report.kernels, report.hardware.kernel_latency)}.")
    mem = report.memory.to_dict()
    parts = sorted(((k.replace("_", " "), v) for k, v in mem["breakdown"].items() if v), key=lambda kv: -kv[1])
    lines.append(f"peak memory {format_bytes(mem['peak_bytes'])} at {mem['peak_op']} ({mem['peak_phase']}): "
                 + ", ".join(f"{k} {format_bytes(v)}" for k, v in parts[:4]) + ".")
    return lines


__all__ = ["explain"]
