"""Time of collectives over mesh axes (alpha-beta model, ring and hierarchical).

Model
-----
A message of ``b`` bytes over a link costs ``alpha + b / bw`` (Hockney 1994,
"The communication challenge for MPP", Parallel Computing 20(3)): ``alpha`` is
``Link.latency`` and ``bw = Link.bandwidth * Link.efficiency``, the achieved
bytes/s per device per direction. The link of each mesh axis comes from
``Hardware.links_for(mesh)`` (fast links inside a node or slice, slow ones
across).

Payload conventions (``B``, bytes per device; the same as the reader of
compiled programs, so predicted and compiled collectives compare directly):

* all-reduce: the operand (= result) bytes;
* all-gather: the OUTPUT bytes (each device starts with ``B / n``);
* reduce-scatter: the INPUT bytes (each device ends with ``B / n``);
* all-to-all: the operand (= result) bytes;
* collective-permute: the bytes each device sends.

One axis of ``n`` devices (ring algorithms; Patarasuk & Yuan 2009, "Bandwidth
optimal all-reduce algorithms for clusters of workstations", JPDC 69(2);
Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication
operations in MPICH", IJHPCA 19(1))::

    all-reduce          2 (n-1)/n * B / bw  +  2 (n-1) * alpha
    all-gather            (n-1)/n * B / bw  +    (n-1) * alpha
    reduce-scatter        (n-1)/n * B / bw  +    (n-1) * alpha
    all-to-all            (n-1)/n * B / bw  +    (n-1) * alpha
    collective-permute              B / bw  +            alpha

All-to-all is modelled as the pairwise exchange (Thakur et al. 2005, the
MPICH choice for long messages): ``n - 1`` steps, each sending the ``B / n``
block meant for one peer. It is bandwidth-optimal for large messages, which
dominate training steps; Bruck's ``log n``-step algorithm would only pay off
for tiny messages. It assumes the axis can carry every pair's traffic at full
link rate (true of NVSwitch, optimistic for a long torus ring, whose bisection
limits all-to-all).

Several axes ``(a1, ..., ak)`` -- hierarchical decomposition, as NCCL and TPU
runtimes do for multi-dimensional groups (2-D torus all-reduce: Mikami et al.
2018, arXiv:1811.05233; Ying et al. 2018, arXiv:1811.06992; hierarchical
all-reduce: Jia et al. 2018, arXiv:1807.11205). Axes of size 1 are dropped;
the others are ordered fastest link first (highest ``bw``; ties: minor mesh
axis first), sizes ``n1..nk``, prefix products ``P_i = n1 * ... * n(i-1)``::

    reduce-scatter(B)   = reduce-scatter over a1 of B, then over a2 of B/n1, ...
                          stage i: (n_i-1)/n_i * B/P_i / bw_i + (n_i-1) alpha_i
    all-gather(B)       = the mirror image: all-gather over ak first (output
                          B/P_k), ..., a1 last (output B); same stage costs
    all-reduce(B)       = reduce-scatter over a1, all-reduce of the B/n1 shard
                          over (a2..ak) recursively, all-gather over a1;
                        = reduce-scatter(B) over a1..a(k-1), all-reduce of
                          B/P_k over ak, all-gather(B) over a(k-1)..a1
    all-to-all(B)       = one all-to-all per axis, each moving the whole B
                          (data is re-routed, not reduced):
                          stage i: (n_i-1)/n_i * B / bw_i + (n_i-1) alpha_i
                          (hierarchical all-to-all: DeepSpeed-MoE, Rajbhandari
                          et al. 2022; Tutel, Hwang et al. 2023)
    collective-permute  = B / bw + alpha over the slowest link of the group
                          (a point-to-point message is as fast as its
                          bottleneck; ties: the major mesh axis)

So slow links carry only ``B / n_fast``. Fastest-first is the best order: swapping
two adjacent stages ``a`` then ``b`` changes the bandwidth term by
``(1-1/n_a)(1-1/n_b)(1/bw_a - 1/bw_b) * B/P``, negative exactly when ``bw_a > bw_b``;
the latency term does not depend on the order. On one axis, and also on several,
``all-reduce = reduce-scatter + all-gather``.

A group whose size is 1 (no axes, or axes of size 1) costs 0 s, and so does the
kind ``"none"`` (a collective that a trivial group needs not run).

``link_bytes`` / :func:`bytes_on_links`: the bytes each device sends over the
links of each axis of the group (an all-reduce sends ``2 (n-1)/n * B`` on one
axis), for the "bytes moved per mesh axis" line of a cost report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real

from layoutsearch.errors import CostModelError
from layoutsearch.mesh import Hardware, Link, Mesh, hardware

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
"""The collectives the model prices (names as in XLA's HLO)."""

NONE = "none"
"""The kind of a collective over a trivial group: always 0 s."""


@dataclass(frozen=True)
class CollectiveStage:
    """One single-axis step of a (possibly hierarchical) collective.

    ``bytes``: the stage's payload per device (same conventions as the whole
    collective); ``sent``: bytes each device sends over ``axis``'s links;
    ``transfer_seconds`` = ``sent / bw``, ``latency_seconds`` = steps * alpha.
    """

    kind: str
    axis: str
    group_size: int
    bytes: float
    sent: float
    transfer_seconds: float
    latency_seconds: float

    @property
    def seconds(self) -> float:
        return self.transfer_seconds + self.latency_seconds


@dataclass(frozen=True)
class CollectiveCost:
    """Predicted time of one collective.

    ``bytes``: payload per device (module conventions), rounded to an int;
    ``link_bytes``: bytes sent per device over each axis of the group (mesh
    order; axes of size 1 send 0); ``stages``: the single-axis steps, in the
    order they run.
    """

    kind: str
    axes: tuple[str, ...]
    group_size: int
    bytes: int
    seconds: float
    link_bytes: dict[str, float] = field(hash=False)
    stages: tuple[CollectiveStage, ...] = field(default=(), hash=False)

    @property
    def transfer_seconds(self) -> float:
        """The bandwidth (beta) part of ``seconds``."""
        return sum(s.transfer_seconds for s in self.stages)

    @property
    def latency_seconds(self) -> float:
        """The latency (alpha) part of ``seconds``."""
        return sum(s.latency_seconds for s in self.stages)


def _ring(kind: str, n: int, b: float) -> tuple[float, int]:
    """(bytes sent per device, number of latency steps) of one single-axis collective."""
    if kind == "all-reduce":
        return 2 * (n - 1) / n * b, 2 * (n - 1)
    if kind == "collective-permute":
        return b, 1
    return (n - 1) / n * b, n - 1  # all-gather, reduce-scatter, all-to-all


def _stage(kind: str, axis: str, n: int, b: float, link: Link) -> CollectiveStage:
    sent, steps = _ring(kind, n, b)
    return CollectiveStage(kind, axis, n, b, sent, sent / link.effective_bandwidth if sent else 0.0,
                           steps * link.latency)


def _normalize_kind(kind: str) -> str:
    if not isinstance(kind, str):
        raise CostModelError(f"collective kind must be a string, got {kind!r}")
    k = kind.strip().lower().replace("_", "-")
    if k not in COLLECTIVE_KINDS and k != NONE:
        raise CostModelError(f"unknown collective kind {kind!r} (known: {', '.join(COLLECTIVE_KINDS)}, {NONE})")
    return k


def _check_bytes(nbytes: float) -> float:
    if isinstance(nbytes, bool) or not isinstance(nbytes, Real):
        raise CostModelError(f"collective payload must be a number of bytes, got {nbytes!r}")
    b = float(nbytes)
    if not math.isfinite(b) or b < 0:
        raise CostModelError(f"collective payload must be a finite, non-negative number of bytes, got {nbytes!r}")
    return b


def _group(axes: tuple[str, ...] | list[str] | str, mesh: Mesh) -> tuple[str, ...]:
    """The group's axes in mesh order (validated: known, not repeated)."""
    if isinstance(axes, str):
        axes = (axes,)
    axes = tuple(axes)
    for a in axes:
        if not isinstance(a, str):
            raise CostModelError(f"mesh axis names must be strings, got {a!r} in {axes!r}")
        mesh.axis_size(a)  # MeshError for an unknown axis
    if len(set(axes)) != len(axes):
        raise CostModelError(f"collective group repeats a mesh axis: {axes!r}")
    return tuple(a for a in mesh.names if a in axes)


def collective_time(kind: str, nbytes: float, axes: tuple[str, ...], mesh: Mesh | str,
                    hw: Hardware | str) -> CollectiveCost:
    """Time of collective ``kind`` moving ``nbytes`` per device over the group of ``axes``.

    ``nbytes`` follows the module's payload conventions (all-gather: output
    bytes, reduce-scatter: input bytes, all-reduce / all-to-all: operand bytes,
    collective-permute: bytes sent). ``mesh`` may be a mesh string and ``hw`` a
    preset name. Raises ``CostModelError`` for an unknown kind, a negative or
    non-finite payload, a repeated axis or a link without bandwidth, and
    ``MeshError`` for an axis not in the mesh.
    """
    k = _normalize_kind(kind)
    b = _check_bytes(nbytes)
    mesh = Mesh.of(mesh)
    hw = hardware(hw)
    group = _group(axes, mesh)
    size = mesh.group_size(group)
    link_bytes = {a: 0.0 for a in group}
    if k == NONE or size == 1:
        return CollectiveCost(k, group, size, round(b), 0.0, link_bytes, ())

    links = hw.links_for(mesh)
    active = [a for a in group if mesh.axis_size(a) > 1]
    for a in active:
        link = links[a]
        if not (link.effective_bandwidth > 0 and math.isfinite(link.effective_bandwidth)):
            raise CostModelError(f"mesh axis {a!r} uses a link with bandwidth {link.bandwidth!r} and efficiency "
                                 f"{link.efficiency!r} on {hw.name!r}: both must be positive")
        if not (link.latency >= 0 and math.isfinite(link.latency)):
            raise CostModelError(f"mesh axis {a!r} uses a link with invalid latency {link.latency!r} on {hw.name!r}")
    index = {a: i for i, a in enumerate(mesh.names)}
    # Fastest link first; equal links: minor (later) mesh axis first.
    order = sorted(active, key=lambda a: (-links[a].effective_bandwidth, -index[a]))
    n = [mesh.axis_size(a) for a in order]
    prefix = [math.prod(n[:i]) for i in range(len(n))]  # P_i

    stages: list[CollectiveStage] = []
    if k == "reduce-scatter":
        stages = [_stage(k, a, n[i], b / prefix[i], links[a]) for i, a in enumerate(order)]
    elif k == "all-gather":
        stages = [_stage(k, a, n[i], b / prefix[i], links[a]) for i, a in reversed(list(enumerate(order)))]
    elif k == "all-reduce":
        last = len(order) - 1
        down = [_stage("reduce-scatter", a, n[i], b / prefix[i], links[a]) for i, a in enumerate(order[:last])]
        middle = _stage("all-reduce", order[last], n[last], b / prefix[last], links[order[last]])
        up = [_stage("all-gather", a, n[i], b / prefix[i], links[a]) for i, a in enumerate(order[:last])]
        stages = [*down, middle, *reversed(up)]
    elif k == "all-to-all":
        stages = [_stage(k, a, n[i], b, links[a]) for i, a in enumerate(order)]
    else:  # collective-permute: one message over the bottleneck link (ties: major axis)
        slowest = min(active, key=lambda a: (links[a].effective_bandwidth, index[a]))
        stages = [_stage(k, slowest, size, b, links[slowest])]

    for s in stages:
        link_bytes[s.axis] += s.sent
    seconds = sum(s.seconds for s in stages)
    return CollectiveCost(k, group, size, round(b), seconds, link_bytes, tuple(stages))


def bytes_on_links(kind: str, nbytes: float, axes: tuple[str, ...], mesh: Mesh | str,
                   hw: Hardware | str) -> dict[str, float]:
    """Bytes each device sends over the links of each axis of the group (mesh order).

    The same decomposition as :func:`collective_time` (whose ``link_bytes`` this
    is); ``hw`` matters because the stage order follows link speed."""
    return collective_time(kind, nbytes, axes, mesh, hw).link_bytes
