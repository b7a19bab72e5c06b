"""Cost model: time of collectives, per-op compute and communication, memory
per device over the step's schedule, gathered into a cost report.

``collectives``: alpha-beta time of ring / hierarchical collectives over mesh axes.
``ops``: per-op FLOPs, HBM bytes and the collectives each op causes under a layout (``flops``: FLOPs as
XLA counts them; ``comms``: reshards and partial sums; ``reshape``: reshape layouts).
``step``: the training step of a graph and the cost of each op (repeated layers priced once).
``memory``: live-set simulation of per-device memory, with rematerialization policies.
``report``: :func:`estimate` -> :class:`CostReport` (``costreport``: totals and per-op breakdown, JSON;
``render``: tables).
"""

from layoutsearch.costmodel.collectives import CollectiveCost, collective_time
from layoutsearch.costmodel.memory import REMAT_POLICIES, MemoryReport, memory_profile
from layoutsearch.costmodel.report import CollectiveRecord, CostReport, OpReport, estimate, render_report

__all__ = [
    "REMAT_POLICIES", "CollectiveCost", "CollectiveRecord", "CostReport", "MemoryReport", "OpReport",
    "collective_time", "estimate", "memory_profile", "render_report",
]
