"""The rules space searched by bound-and-price: its plans priced by the full cost model, the best proven.

The candidates whose live-set memory bound exceeds the limit are dropped; a lower bound of every other one
(the einsums' roofline compute alone, which the step can only exceed) orders them; they are priced in that
order, in batches, until the ``top``-th best plan that fits costs less than the bound of every candidate left
(Land & Doig 1960's branch and bound with one level). The priced candidates form a one-node problem, which
the chosen solver solves (enumeration, ILP or DP: the same answer); its serial optimum is then refined under
overlap (:func:`overlapped_top`).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar

import numpy as np

from layoutsearch.costmodel.compute import fastest_matmul_rate, hbm_seconds
from layoutsearch.costmodel.memory import lifetimes, remat_plan
from layoutsearch.costmodel.ops import is_matmul, op_flops
from layoutsearch.costmodel.report import estimate
from layoutsearch.costmodel.step import checked
from layoutsearch.ir import ops as O
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Axes, Layout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.solvers.assemble import undominated
from layoutsearch.solvers.build import build_space
from layoutsearch.solvers.clock import Deadline, Progress
from layoutsearch.solvers.dispatch import solve, solver_for
from layoutsearch.solvers.forked import split
from layoutsearch.solvers.plan import Costed
from layoutsearch.solvers.pricer import Pricer
from layoutsearch.solvers.problem import MemItem, MemRow, Problem
from layoutsearch.solvers.rulesets import (
    RuleSets,
    divisible,
    interchangeable_axes,
    remembered_rule_sets,
    rule_sets,
    rules_of,
)

SEARCH_OVERLAP = 0.0
"""The spaces price a step as the sum of its ops' compute and communication (the overlap schedule is not a
sum over ops): the objective of the solvers, refined under overlap for the rules space
(:func:`overlapped_top`); the layers and ops spaces report their plans on these terms."""


def dims_mask(dims: list[str], names: tuple[str, ...]) -> np.ndarray:
    """The boolean mask over ``dims`` (one slot more: NONE) of the dims ``names``."""
    m = np.zeros(len(dims) + 1, bool)
    m[[dims.index(d) for d in names]] = True
    return m


def _compute_bounds(g: Graph, mesh: Mesh, hw: Hardware, cands: RuleSets, dims: list[str],
                    on_chip: frozenset[str] = frozenset(), ops: Iterable[O.Op] | None = None) -> np.ndarray:
    """A lower bound of each candidate's step time: the einsums' roofline compute (FLOPs, and the HBM bytes
    of their inputs not ``on_chip``), which communication and the other ops only add to. ``ops``: those
    einsums among these ops only (default: all of ``g``'s)."""
    sizes = tuple(s for _, s in mesh.axes)
    total = np.zeros(len(cands))
    seen: dict[tuple, int] = {}
    reps: dict[tuple, O.Op] = {}
    for op in g.ops if ops is None else ops:
        if is_matmul(op, g.tensors):  # (vector einsums run at another rate: left out of the bound)
            key = tuple((g.tensors[x].dims, g.tensors[x].dtype, x in on_chip) for x in (*op.inputs, op.output))
            seen[key] = seen.get(key, 0) + 1
            reps.setdefault(key, op)

    for key, op in reps.items():
        split = cands.split(dims_mask(dims, op.iteration_dims(g.tensors)), sizes)
        flops = op_flops(g, op) / split / fastest_matmul_rate(hw)
        hbm = np.zeros(len(cands))
        for x in op.inputs:
            if x in on_chip:
                continue
            t = g.tensors[x]
            hbm += t.nbytes / cands.split(dims_mask(dims, t.dim_names), sizes)
        total += seen[key] * np.maximum(flops, hbm_seconds(hbm, hw))
    return total


class LiveBound:
    """A lower bound of each candidate's peak memory (:func:`_memory_bounds`): the largest, over some points of
    the schedule, of the bytes live there; ``live`` (points x groups, the points in decreasing order of their
    live bytes) @ ``inv`` (groups x distinct columns: 1 / each group's split), maximized over the points, is
    the bound of each column, and ``of`` gives each candidate's column."""

    SEEDS = 8
    """:meth:`over` bounds each column from below by the points of most live bytes, this many."""

    def __init__(self, live: np.ndarray, inv: np.ndarray, of: np.ndarray, block: int = 1 << 22) -> None:
        self.live, self.inv, self.of, self.block = live, inv, of, block
        self._over: dict[float, np.ndarray] = {}

    def _columns(self, cols: np.ndarray | slice) -> np.ndarray:
        """The bound of columns ``cols``: the products a block of columns at a time (about ``block`` entries, 32
        MB: 256 points by every column took 400 MB for GPT-3 on 8192 devices over 4 axes, at memory speed;
        blocks large enough that the BLAS threads' start-up, slow on a busy machine, stays small)."""
        inv = self.inv[:, cols]
        best = np.zeros(inv.shape[1])
        width = max(1, self.block // len(self.live))
        out = np.empty((len(self.live), min(width, inv.shape[1])))  # (one buffer: fresh pages per block cost page faults)
        for c in range(0, inv.shape[1], width):
            part = inv[:, c:c + width]
            np.maximum(best[c:c + width], np.matmul(self.live, part, out=out[:, :part.shape[1]]).max(axis=0),
                       out=best[c:c + width])
        return best

    @functools.cached_property
    def _all(self) -> np.ndarray:
        return self._columns(slice(None))

    def values(self, idx: np.ndarray | list[int] | None = None) -> np.ndarray:
        """The bound of every candidate, or of candidates ``idx`` (their columns only, unless all are known)."""
        if idx is None or "_all" in self.__dict__:
            return self._all[self.of] if idx is None else self._all[self.of[np.asarray(idx, dtype=np.int64)]]
        cols, at = np.unique(self.of[np.asarray(idx, dtype=np.int64)], return_inverse=True)
        return self._columns(cols)[at.reshape(-1)]

    def over(self, threshold: float) -> np.ndarray:
        """Per candidate, whether its bound exceeds ``threshold`` (remembered per threshold). Most columns are
        decided without their bound: from below by the live bytes at the :data:`SEEDS` points of most live
        bytes, from above by the largest live bytes of each group (at any point) together; the bound is
        computed for the columns those leave open (with a margin far above rounding)."""
        if threshold not in self._over:
            if "_all" in self.__dict__ or len(self.live) <= self.SEEDS:
                col_over = self._all > threshold
            else:
                low = (self.live[:self.SEEDS] @ self.inv).max(axis=0)
                high = self.live.max(axis=0) @ self.inv
                col_over = low > threshold * (1 + 1e-12)
                open_ = np.flatnonzero(~col_over & (high >= threshold * (1 - 1e-12)))
                col_over[open_] = self._columns(open_) > threshold
            self._over[threshold] = col_over[self.of]
        return self._over[threshold]


def _memory_bounds(g: Graph, mesh: Mesh, hw: Hardware, cands: RuleSets, dims: list[str], remat: str,
                   on_chip: frozenset[str], at: int | None = None) -> LiveBound:
    """A lower bound of each candidate's peak memory: the largest, over the points of the schedule, of the
    bytes the memory model holds live there (the tensors whose lifetime, under ``remat``, spans the point, at
    their per-device size: fed tensors, saved activations, gradients). Candidates whose bound exceeds the
    limit are never priced.

    Every point counts: the live bytes of each group of tensors with the same dims (split alike by any
    candidate) at every point come from a running sum over the lifetimes' starts and ends; the live set only
    grows where a lifetime starts, so those points suffice, and of those only the points no other point
    exceeds in every group (:func:`~.assemble.undominated`; GPT-3's 96 layers with full remat: 3,757 distinct points,
    584 undominated). A candidate's bound is then a product (points x groups) @ (groups x candidates: 1 / the
    group's split), maximized over the points (:class:`LiveBound`); candidates that split every group alike
    share one column (GPT-3 on 1024 devices: 9,570 distinct of 32,985). ``at`` (an op's index in the
    schedule): the live bytes there only, a weaker bound, computed faster."""
    life = lifetimes(g, remat_plan(g, remat))
    sizes = tuple(s for _, s in mesh.axes)
    skip = set(life.deferrable.values()) if hw.combined_gradient_all_reduce else set()
    groups: dict[tuple[str, ...], int] = {}
    tensor_group = np.array([groups.setdefault(t.dim_names, len(groups)) for t in life.tensors], dtype=np.int64)
    tensor_bytes = np.array([0.0 if t.name in on_chip else float(t.nbytes) for t in life.tensors])
    keep = (tensor_bytes[life.tensor] > 0) & (life.start <= life.end)
    keep[list(skip)] = False
    rows = np.nonzero(keep)[0]
    if not len(rows):
        return LiveBound(np.zeros((1, 0)), np.zeros((0, 1)), np.zeros(len(cands), dtype=np.int64))
    group, nbytes = tensor_group[life.tensor[rows]], tensor_bytes[life.tensor[rows]]
    start, end = life.start[rows].astype(np.int64), life.end[rows].astype(np.int64)
    lo = int(start.min())
    span = int(end.max()) - lo + 2
    delta = np.zeros((len(groups), span))
    np.add.at(delta, (group, start - lo), nbytes)
    np.add.at(delta, (group, end - lo + 1), -nbytes)
    if at is None:
        live = np.cumsum(delta, axis=1)[:, np.unique(start - lo)].T  # points x groups
        live = np.unique(np.maximum(live, 0.0), axis=0)
        live = live[undominated(live)]
    else:
        live = np.maximum(np.cumsum(delta, axis=1)[:, [min(max(at - lo, 0), span - 1)]].T, 0.0)
    inv, of = _group_columns(cands, tuple(groups), dims, sizes)
    return LiveBound(live, inv, of)


def _group_columns(cands: RuleSets, groups: tuple[tuple[str, ...], ...], dims: list[str], sizes: tuple[int, ...]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(groups x distinct columns: 1 / each group's split, per candidate its column) for :func:`_memory_bounds`:
    candidates splitting every group alike share one column (remembered per candidates: the bounds of every
    remat policy, the full one and the one at the backward pass, ask for the same groups)."""
    def compute() -> tuple[np.ndarray, np.ndarray]:
        split = np.empty((len(groups), len(cands)))
        for k, names in enumerate(groups):
            split[k] = cands.split(dims_mask(dims, names), sizes)
        # each split is a product of some axes' sizes: its rank among those products (looked up by the product),
        # the ranks of a candidate's groups one integer (mixed radix, re-ranked before it could overflow), the
        # columns that integer's distinct values (sorting integers: faster than rows)
        products = sorted({math.prod(c) for r in range(len(sizes) + 1) for c in itertools.combinations(sizes, r)})
        rank = np.zeros(products[-1] + 1, dtype=np.int64)
        rank[products] = np.arange(len(products))
        code = np.zeros(len(cands), dtype=np.int64)
        for row in split:
            if len(code) and int(code.max()) >= (2**62) // len(products):
                code = np.unique(code, return_inverse=True)[1].reshape(-1)
            code = code * len(products) + rank[row.astype(np.int64)]
        _, first, of = np.unique(code, return_index=True, return_inverse=True)
        return 1.0 / split[:, first], of.reshape(-1)

    return cands.remembered(("group columns", groups, tuple(dims), sizes), compute)


def strategy_values(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """(cost, peak memory) of every strategy of a one-node problem."""
    cost = problem.const + problem.unary[0]
    if not problem.mem_rows:
        return cost, np.zeros_like(cost)
    B = np.stack([it.bytes for it in problem.mem_items])  # items x strategies
    R = np.zeros((len(problem.mem_rows), len(problem.mem_items)))
    for r, row in enumerate(problem.mem_rows):
        for i, c in row.items:
            R[r, i] += c
    return cost, (R @ B).max(axis=0)


CANDIDATE_FILTER: ContextVar[Callable[[Sequence[tuple[str, Axes]], Mesh], bool] | None] = ContextVar(
    "CANDIDATE_FILTER", default=None)
"""A predicate on a candidate's rules and the mesh of the space (a pipeline's inner mesh, or the whole one)
that a search sets (``search(target="maxtext")``: what the target framework can express); candidates it
refuses are left out of every rules space of that search."""


def rules_candidates(g: Graph, mesh: Mesh, hw: Hardware, pricer: Pricer, extra: RuleSets | None
                ) -> tuple[RuleSets, np.ndarray]:
    """The rules space's candidates (``extra`` appended; one candidate per distinct layout; only those
    :data:`CANDIDATE_FILTER` keeps, when set; one of each class of twins, layouts that differ only by a
    relabelling of interchangeable mesh axes, :meth:`RuleSets.untwinned`) and their roofline bounds without remat
    (a :class:`RulesSearch` adds those of the einsums its policy runs again)."""
    root, rows = remembered_rule_sets(g, mesh, mapped=True)
    keep = CANDIDATE_FILTER.get()
    classes = interchangeable_axes(mesh, hw)
    key = (id(root.primary), None if extra is None else (extra.choices, *(a.tobytes() for a in (
        extra.primary, extra.fallback, extra.fallback_axes))), keep, tuple(map(tuple, classes)))
    hit = _CANDIDATES.get(key)
    if hit is None or hit[0] is not root.primary:
        cands = _kept(g, mesh, rule_sets(g, mesh, mapped=True), extra, keep, classes)
        if rows is None:  # (the whole enumeration's: remembered; a micro-batch's of one not remembered: not)
            _CANDIDATES[key] = (root.primary, cands)
            while len(_CANDIDATES) > 4:
                _CANDIDATES.pop(next(iter(_CANDIDATES)))
    elif rows is None:
        cands = hit[1]
    else:
        cands = hit[1].take(np.flatnonzero(divisible(hit[1], np.array(list(g.dims.values())),
                                                     [s for _, s in mesh.axes])))
    return cands, _compute_bounds(g, mesh, hw, cands, list(g.dims), pricer.fusion.on_chip)


_CANDIDATES: dict[tuple, tuple[np.ndarray, RuleSets]] = {}
""":func:`rules_candidates`'s last candidates of a whole enumeration (:func:`~.rulesets.remembered_rule_sets`),
by its rows (the array itself, kept against a reuse of its id), the extra rule sets, the filter and the
interchangeable axes. A micro-batch of a graph whose candidates are remembered has those of them that divide
its sizes, which are those found afresh: candidates of one layout (or twins) split every tensor alike, so a
class is kept or ruled out whole, and it keeps the candidate standing for it; when its sizes rule out none,
the same object (and what it remembers: splits, group columns)."""


def _kept(g: Graph, mesh: Mesh, raw: RuleSets, extra: RuleSets | None,
          keep: Callable[[Sequence[tuple[str, Axes]], Mesh], bool] | None, classes: list[list[int]]) -> RuleSets:
    """:func:`rules_candidates`'s candidates among the rule sets ``raw``."""
    cands = raw.concat(extra) if extra is not None else raw
    named = [cands.index(extra, r) for r in range(len(extra))] if extra is not None else []
    cands, named = _taken(cands, cands.distinct(g, keep=[k for k in named if k is not None]), named)
    if keep is not None:
        dims = list(g.dims)
        kept = [r for r in range(len(cands)) if keep(rules_of(cands, r, dims, mesh), mesh)]
        if not kept:
            raise LayoutSearchError("no layout of the rules space can be written for the target framework")
        cands, named = _taken(cands, kept, named)
    return _taken(cands, cands.untwinned(classes, keep=named), named)[0]


def _taken(cands: RuleSets, idx: Sequence[int] | np.ndarray, named: Sequence[int | None]
           ) -> tuple[RuleSets, list[int]]:
    """``cands.take(idx)`` and the places there of the candidates ``named`` (those kept; None: not found)."""
    idx = np.asarray(idx, dtype=np.int64)
    where = np.full(len(cands), -1, dtype=np.int64)
    where[idx] = np.arange(len(idx))
    return cands.take(idx), [int(where[k]) for k in named if k is not None and where[k] >= 0]


FIRST_BATCH, MAX_BATCH = 512, 8192
"""Candidates are priced in batches, each one build of the space (:func:`~.build.build_space`): a walk over
the graph's ops (about 0.7 s for GPT-3's 96 layers) plus about 0.4 ms per candidate. The first batch is
large enough that the walk does not dominate, and each next one four times larger (up to the largest)."""


class RulesSearch:
    """The rules space of one graph under one remat policy, priced lazily in bound order (``lb``: the
    candidates' roofline bounds, recomputed einsums included)."""

    def __init__(self, g: Graph, mesh: Mesh, hw: Hardware, pricer: Pricer,
                 candidates: tuple[RuleSets, np.ndarray], remat: str = "none") -> None:
        self.g, self.mesh, self.hw, self.pricer, self.remat = g, mesh, hw, pricer, remat
        self.dims = list(g.dims)
        self.cands, self.lb = candidates
        again = [g.op(name) for name in remat_plan(g, remat).recomputed]
        if again:  # the einsums the policy runs again add their roofline too
            self.lb = self.lb + _compute_bounds(g, mesh, hw, self.cands, self.dims, pricer.fusion.on_chip, again)
        self.cost = np.full(len(self.cands), np.nan)
        self.mem = np.full(len(self.cands), np.nan)
        self.rows = 0
        self.refined = 0  # plans priced by the cost model with overlap (:func:`overlapped_top`)
        self.plans: dict[int, Costed] = {}  # those plans, by candidate
        self.floor = math.inf  # the smallest lower bound of a plan not priced (:func:`overlapped_top`)
        self.cut_short: list[str] = []  # what a deadline cut short, in words

    @functools.cached_property
    def live_bound(self) -> LiveBound:
        """The live-set bound of the candidates' peak memory (:func:`_memory_bounds`; made when first asked
        for: a search without a memory limit never needs it)."""
        return _memory_bounds(self.g, self.mesh, self.hw, self.cands, self.dims, self.remat,
                              self.pricer.fusion.on_chip)

    @property
    def mem_lb(self) -> np.ndarray:
        """Per candidate, its live-set bound of the peak memory (every candidate's; :meth:`over_limit` tells
        most candidates apart without theirs)."""
        return self.live_bound.values()

    def over_limit(self, limit: float) -> np.ndarray:
        """Per candidate, whether its live-set bound exceeds ``limit`` (beyond rounding): it cannot fit."""
        return self.live_bound.over(limit * (1 + 1e-9))

    def may_fit_among(self, idx: np.ndarray, limit: float | None, any_out: bool = False) -> np.ndarray:
        """Those of candidates ``idx`` that may fit ``limit`` (:meth:`may_fit`). Before the live-set bound is
        computed, the live bytes where the backward pass starts (when the activations it reads are held)
        rule candidates out first: a bound only where the rest need it. ``any_out``: the question is only
        whether some candidate is ruled out; those the first bound leaves are then returned as they are when
        it rules out any."""
        if limit is None or not len(idx):
            return idx
        if "live_bound" not in self.__dict__:
            kept = idx[self.backward_lb[idx] <= limit * (1 + 1e-9)]
            if not len(kept) or (any_out and len(kept) < len(idx)):
                return kept
            idx = kept
        return idx[self.may_fit(limit)[idx]]

    @functools.cached_property
    def backward_lb(self) -> np.ndarray:
        """Per candidate, the live bytes where the backward pass starts (one point of the live-set bound: a
        weaker lower bound of the peak, computed faster); zeros for a graph without a backward pass."""
        start = next((i for i, op in enumerate(self.g.ops) if op.phase == "backward"), None)
        if start is None:
            return np.zeros(len(self.cands))
        return _memory_bounds(self.g, self.mesh, self.hw, self.cands, self.dims, self.remat,
                              self.pricer.fusion.on_chip, at=start).values()

    def price(self, idx: np.ndarray) -> None:
        idx = np.array([i for i in idx if np.isnan(self.cost[i])], dtype=np.int64)
        if len(idx):
            self.cost[idx], self.mem[idx] = self._values(idx, self.pricer)

    def _values(self, idx: np.ndarray, pricer: Pricer) -> tuple[np.ndarray, np.ndarray]:
        """(cost, peak) of candidates ``idx`` priced by ``pricer``: one build of the space over them, or of a
        share of them per process (:func:`.forked.split`)."""
        def work(share: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            space = build_space(self.g, self.mesh, self.hw, "rules", rules=self.cands.take(idx[share]),
                                pricer=pricer, remat=self.remat)
            return (*strategy_values(space.problem), np.array([len(space.problem.mem_rows)]))
        parts = split(len(idx), work)
        self.rows = max(self.rows, *(int(p[2][0]) for p in parts))
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def overlap_bounds(self, idx: np.ndarray | list[int], optimizer: bool = True, serial: bool = False
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Lower bounds of the overlapped steps of candidates ``idx``: the largest entry of their bound
        vectors (:meth:`~.pricer.Pricer.bound`; ``optimizer=False``: one micro-batch's share of an
        accumulated step; ``serial``: the sum of every op's compute and collectives, the step where nothing
        overlaps), and of their peaks (the peak itself with the optimizer, recorded in :attr:`mem`;
        without, the optimizer's operand copies are left out)."""
        idx = np.asarray(idx, dtype=np.int64)
        values, peak = self._values(idx, self.pricer.bound(optimizer, serial))
        if optimizer:
            self.mem[idx] = peak
        return (values.max(axis=1) if values.ndim == 2 else values), peak

    def may_fit(self, limit: float | None) -> np.ndarray:
        """Per candidate, whether it may fit ``limit``: its live-set bound does, and its peak where priced."""
        if limit is None:
            return np.ones(len(self.cands), bool)
        return ~self.over_limit(limit) & ~(self.mem > limit * (1 + 1e-12))

    def peak_floors(self, idx: np.ndarray | None = None) -> np.ndarray:
        """Per candidate (of ``idx``; default all), its peak where priced, else its live-set bound (the live
        bytes where the backward pass starts when that bound was not needed): a lower bound of its peak."""
        idx = np.arange(len(self.cands)) if idx is None else np.asarray(idx, dtype=np.int64)
        floor = self.live_bound.values(idx) if "live_bound" in self.__dict__ else self.backward_lb[idx]
        return np.where(np.isnan(self.mem[idx]), floor, self.mem[idx])

    def pruning(self, limit: float | None) -> dict[str, int | None]:
        """How the space was pruned: its candidates, those the live-set memory bound rules out (None: the bound
        was not needed), those priced (the rest cannot beat the plans found, by their roofline bound) and those
        priced again with overlap."""
        known = limit is not None and "live_bound" in self.__dict__
        over = int(self.over_limit(limit).sum()) if known else None if limit is not None else 0
        return {"candidates": len(self.cands), "memory_bound": over, "priced": int((~np.isnan(self.cost)).sum()),
                "refined": self.refined}

    def problem(self, idx: np.ndarray) -> Problem:
        """The one-node problem of the priced candidates ``idx``: their costs, and their peak memory as one
        item on one row (the peak of a one-node problem is a number per strategy)."""
        return Problem(["rules"], [self.cost[idx].copy()], [], [MemItem(0, None, self.mem[idx].copy())],
                       [MemRow(0.0, ((0, 1),), "peak")])

    def bound_and_price(self, limit: float | None, top: int, progress: Progress | None,
                        deadline: Deadline | None = None, upper: float | None = None,
                        among: np.ndarray | None = None) -> np.ndarray:
        """Price candidates in bound order until the ``top`` best that fit are proven, or ``deadline`` passes
        with at least one that fits (noted in :attr:`cut_short`); returns the priced. With ``upper``, only
        candidates whose bound is below it (the others cannot beat the plans found elsewhere); with
        ``among`` (a mask), only those it marks."""
        order = np.argsort(self.lb, kind="stable")
        if among is not None:
            order = order[among[order]]
        if upper is not None:
            order = order[self.lb[order] < upper * (1 + 1e-9)]
        if limit is not None and len(order):  # a candidate whose live bytes exceed the limit somewhere cannot fit
            order = order[~self.over_limit(limit)[order]]
        batch, start = FIRST_BATCH, 0
        while start < len(order):
            self.price(order[start:start + batch])
            start += batch
            done = ~np.isnan(self.cost)
            ok = done & (self.mem <= limit * (1 + 1e-12) if limit is not None else done)
            if ok.sum() >= top:
                kth = np.sort(self.cost[ok])[top - 1]
                if start >= len(order) or self.lb[order[start]] > kth * (1 + 1e-9):
                    break
            if deadline is not None and ok.any() and start < len(order) and deadline.passed():
                self.cut_short.append(f"remat {self.remat}: the time limit ran out after pricing {int(done.sum())} "
                                      f"of {len(order)} candidates of the rules space (best and runner-ups among "
                                      "those, not proven)")
                break
            if progress is not None:
                progress(f"rules space: priced {int(done.sum())} of {len(order)} candidates")
            batch = min(batch * 4, MAX_BATCH)
        return np.nonzero(~np.isnan(self.cost))[0]

    def price_below(self, cut: float, limit: float | None, among: np.ndarray | None = None) -> None:
        """Price every candidate that may fit and whose roofline bound is at most ``cut`` (of those ``among``
        marks, a mask; default all)."""
        want = (self.lb <= cut * (1 + 1e-9)) & np.isnan(self.cost)
        if among is not None:
            want &= among
        if limit is not None:
            want &= ~self.over_limit(limit)
        idx = np.nonzero(want)[0]
        for start in range(0, len(idx), MAX_BATCH):
            self.price(idx[start:start + MAX_BATCH])

    def min_memory(self) -> tuple[float, int]:
        """The smallest peak memory of any candidate (priced in resident-bytes bound order) and its index."""
        lb = self.mem_lb
        order = np.argsort(lb, kind="stable")
        batch, start = FIRST_BATCH, 0
        while start < len(order):
            self.price(order[start:start + batch])
            start += batch
            done = ~np.isnan(self.mem)
            best = float(np.min(self.mem[done]))
            if start >= len(order) or lb[order[start]] > best:
                break
            batch = min(batch * 4, MAX_BATCH)
        done = np.nonzero(~np.isnan(self.mem))[0]
        k = done[int(np.argmin(self.mem[done]))]
        return float(self.mem[k]), int(k)



def costed_rules(name: str, g: Graph, mesh: Mesh, hw: Hardware, rules: tuple, limit: float | None,
                  optimizer: str, remat: str = "none", attention: str = "auto",
                  overlap: float | str = "auto") -> Costed:
    """Rules priced by the cost model (:func:`~layoutsearch.costmodel.estimate`)."""
    layout = checked(Layout(mesh, rules), g)
    rep = estimate(g, layout, hw, optimizer=optimizer, remat=remat, attention=attention, overlap=overlap)
    fit = limit if limit is not None else hw.usable_bytes
    return Costed(name, layout, tuple(rules), rep.step_s, rep.compute_s, rep.comm_s, rep.memory_bytes,
                  rep.memory_bytes <= fit, None, rep, remat=remat)



MAX_REFINED = 256
"""At most this many plans of one remat policy are priced with overlap (:func:`overlapped_top`); past it the
search stops with its best plan (proven when no plan left can beat it; else labelled not proven, with the gap
to the smallest lower bound left) and runner-ups that are the best priced, not proven."""


def overlapped_top(rs: RulesSearch, limit: float | None, top: int, solver: str, deadline: Deadline,
                   overlap: float | str, attention: str, optimizer: str, progress: Progress | None,
                   upper: float | None = None, dominated: np.ndarray | None = None
                   ) -> tuple[list[Costed], bool, float | None, str]:
    """The ``top`` fastest fitting rule sets of ``rs`` under the full cost model (overlap included); the
    fastest proven. With ``upper`` (the ``top``-th best plan found elsewhere, e.g. under another remat
    policy), only those faster than it: a plan no faster cannot make the top.

    The space prices a step as the sum of its ops (``C``: the step without overlap) and, with
    :meth:`~.pricer.Pricer.bound`, the larger of its compute plus the collectives the step always waits
    for and the busiest communicator's collectives (``A``, a lower bound of the overlapped step ``S``;
    ``S`` is usually below ``C``, but may exceed it when prefetched
    gathers hold a communicator a critical collective then waits for). With the default solver (``auto`` or
    ``enumerate``), or when at most :data:`FIRST_BATCH` candidates may fit (and, with ``upper``, beat it by
    their roofline bound), no ``C`` is summed: :func:`_in_bound_order`. Else the named solver proves the ``top``
    smallest ``C`` that fit; their ``k``-th (at most ``upper``) is the first cut. Every fitting candidate
    whose roofline bound is below the cut is priced, its ``A`` computed, and they are priced by the cost
    model in order of ``A`` until the ``top``-th best ``S`` is below the next ``A`` (or the next ``A``
    reaches ``upper``); if that ``S`` is above the cut, the cut rises to it (at most to ``upper``) and the
    candidates below the new cut join. When none may fit, nothing is built (the live bytes where the backward
    pass starts rule candidates out before the live-set bound is computed). ``dominated`` (a mask): candidates whose plan under a policy recomputing less
    (:func:`~layoutsearch.ir.remat.recomputes_within`) fits, so that their plan here is no faster: left out
    (not runner-ups either). Returns (plans fastest first, proven, gap, solver); the smallest
    lower bound of the plans not priced is left in ``rs.floor``. When ``deadline`` passes, the plans priced
    so far, not proven (what was cut short: ``rs.cut_short``)."""
    g, mesh, hw, dims = rs.g, rs.mesh, rs.hw, rs.dims
    exact = overlap == SEARCH_OVERLAP or (not hw.async_collectives and overlap == "auto")  # S = C
    ceiling = math.inf if upper is None else upper * (1 + 1e-9)
    lower: dict[int, float] = {}
    among = ~dominated if dominated is not None else None
    near = np.zeros(0, np.int64)
    if not exact:
        below = (rs.lb < ceiling) & (among if among is not None else True)
        near = rs.may_fit_among(np.nonzero(below)[0], limit)
        if not len(near):  # nothing may fit (and beat upper)
            rs.floor = _floor(rs, limit, lower, set(), dominated, ceiling)
            return [], True, None, "enumerate"
    if len(near) and (solver in ("auto", "enumerate") or len(near) <= FIRST_BATCH):
        # A in roofline order, plans in A order, no sum over ops (few candidates: their A in one build)
        return _in_bound_order(rs, near, limit, top, ceiling, deadline, overlap, attention, optimizer, progress,
                               dominated)
    priced = rs.bound_and_price(limit, top, progress, deadline, upper, among)
    if not len(priced):
        rs.floor = _floor(rs, limit, lower, set(), dominated, ceiling)
        return [], True, None, "enumerate"
    problem = rs.problem(priced)
    name = solver_for(problem, solver, limit)
    sols = solve(problem, name, limit, top, deadline.left())
    if not sols[0].assign:
        rs.floor = _floor(rs, limit, lower, set(), dominated, ceiling)
        return [], True, None, name
    cut = min(max(float(rs.cost[priced[s.assign[0]]]) for s in sols), ceiling)
    proven, gap = all(s.optimal for s in sols) and not rs.cut_short, None
    plans: dict[int, Costed] = {}
    while True:
        done = np.nonzero(~np.isnan(rs.cost) & (among if among is not None else True))[0]
        ok = rs.mem[done] <= limit * (1 + 1e-12) if limit is not None else np.ones(len(done), bool)
        new = [int(k) for k in done[ok & (rs.lb[done] <= cut * (1 + 1e-9))] if int(k) not in lower]
        if new and exact:
            lower.update({k: float(rs.cost[k]) for k in new})
        elif new:
            lower.update(zip(new, rs.overlap_bounds(new)[0].tolist(), strict=True))
        for low, k in sorted((v, k) for k, v in lower.items() if k not in plans):
            steps = sorted(p.step_s for p in plans.values())
            if low >= ceiling or (len(steps) >= top and steps[top - 1] <= low * (1 + 1e-9)):
                break
            if len(plans) >= MAX_REFINED:  # the best is proven if no plan left can beat it (the runner-ups not)
                if steps[0] > low * (1 + 1e-9):
                    proven, gap = False, (steps[0] - low) / steps[0]
                break
            if (plans or upper is not None) and deadline.passed():
                proven = False
                rs.cut_short.append(_out_of_time(rs, len(plans)))
                break
            if progress is not None and plans and len(plans) % 8 == 0:
                progress(f"remat {rs.remat}: priced {len(plans)} plans with overlap")
            plans[k] = deadline.timed(costed_rules, "", g, mesh, hw, rules_of(rs.cands, k, dims, mesh), limit,
                                      optimizer, rs.remat, attention, overlap)
        steps = sorted(p.step_s for p in plans.values())
        reach = min(steps[top - 1] if len(steps) >= top else math.inf, ceiling)
        if reach <= cut * (1 + 1e-9) or len(plans) >= MAX_REFINED or (deadline.passed() and not proven):
            break
        cut = reach  # an overlapped step above the cut: candidates up to it may still beat it
        rs.price_below(cut, limit, among)
    rs.refined, rs.plans = len(plans), plans
    rs.floor = _floor(rs, limit, lower, set(plans), dominated, ceiling)
    return sorted(plans.values(), key=lambda c: c.step_s)[:top], proven, gap, name


def _out_of_time(rs: RulesSearch, priced: int) -> str:
    """What a time limit cut short in the rules search ``rs`` after ``priced`` plans priced with overlap."""
    return (f"remat {rs.remat}: the time limit ran out after pricing {priced} plan{'s' if priced != 1 else ''} "
            "with overlap (best and runner-ups among those, not proven)")


def _in_bound_order(rs: RulesSearch, near: np.ndarray, limit: float | None, top: int, ceiling: float,
                    deadline: Deadline, overlap: float | str, attention: str, optimizer: str,
                    progress: Progress | None, dominated: np.ndarray | None
                    ) -> tuple[list[Costed], bool, float | None, str]:
    """:func:`overlapped_top` without the sum over ops: the candidates ``near`` (those that may fit and whose
    roofline bound is below ``ceiling``) get their ``A`` (:meth:`RulesSearch.overlap_bounds`) a batch at a time
    in roofline-bound order, and are priced with overlap in order of ``A``, whichever of the next roofline
    bound and the next ``A`` is smaller coming first, until neither can beat the ``top``-th best plan (or
    ``ceiling``). Every candidate left then has a lower bound (its ``A``, or its roofline bound, no larger)
    at least that plan's step: the plans are proven. The ``A`` of a candidate needs no more work than its sum
    over ops, and a cut from the ``top``-th best sum over ops (``C >= S``) takes more candidates than one from
    the ``top``-th best step: when the bounds are tight (the overlap schedule's compute stream and communicators,
    a matmul held by its ring steps), far fewer candidates are built."""
    g, mesh, hw, dims = rs.g, rs.mesh, rs.hw, rs.dims
    order = near[np.argsort(rs.lb[near], kind="stable")]
    lower: dict[int, float] = {}
    pending: list[tuple[float, int]] = []  # (A, candidate) of the fitting ones not priced with overlap: a heap
    plans: dict[int, Costed] = {}
    proven, gap, start, batch = not rs.cut_short, None, 0, FIRST_BATCH
    while True:
        steps = sorted(p.step_s for p in plans.values())
        frontier = float(rs.lb[order[start]]) if start < len(order) else math.inf
        low = min(frontier, pending[0][0] if pending else math.inf)
        if low >= ceiling or (len(steps) >= top and steps[top - 1] <= low * (1 + 1e-9)):
            break
        if (plans or ceiling < math.inf) and deadline.passed():
            proven = False
            rs.cut_short.append(_out_of_time(rs, len(plans)))
            break
        if frontier <= low:  # the next roofline bound first: the next batch's A
            if progress is not None and start:
                progress(f"remat {rs.remat}: bounded {start} of {len(order)} candidates")
            idx = order[start:start + batch]
            start += len(idx)
            batch = min(batch * 4, MAX_BATCH)
            bounds, _ = rs.overlap_bounds(idx)  # (their peaks recorded: may_fit is exact for them now)
            fit = rs.may_fit(limit)[idx]
            for k, v in zip(idx[fit].tolist(), bounds[fit].tolist(), strict=True):
                lower[k] = v
                heapq.heappush(pending, (v, k))
            continue
        if len(plans) >= MAX_REFINED:  # the best is proven if no plan left can beat it (the runner-ups not)
            if steps[0] > low * (1 + 1e-9):
                proven, gap = False, (steps[0] - low) / steps[0]
            break
        _, k = heapq.heappop(pending)
        if progress is not None and plans and len(plans) % 8 == 0:
            progress(f"remat {rs.remat}: priced {len(plans)} plans with overlap")
        plans[k] = deadline.timed(costed_rules, "", g, mesh, hw, rules_of(rs.cands, k, dims, mesh), limit,
                                  optimizer, rs.remat, attention, overlap)
    rs.refined, rs.plans = len(plans), plans
    rs.floor = _floor(rs, limit, lower, set(plans), dominated, ceiling)
    return sorted(plans.values(), key=lambda c: c.step_s)[:top], proven, gap, "enumerate"


def _floor(rs: RulesSearch, limit: float | None, lower: dict[int, float], priced: set[int],
           dominated: np.ndarray | None = None, ceiling: float = math.inf) -> float:
    """A lower bound of the steps of ``rs`` not priced with overlap and not ``dominated``: the smallest ``A``
    where computed (``lower``), else roofline bound, of those that may fit (those whose roofline bound is at
    least ``ceiling`` count whether or not they fit: their bound is high enough, and the live-set bound of
    the memory is left uncomputed when no other is left)."""
    rest = np.ones(len(rs.lb), bool) if dominated is None else ~dominated
    rest[list(lower)] = False
    rest[list(priced)] = False
    found = [v for k, v in lower.items() if k not in priced]
    low = rs.may_fit_among(np.nonzero(rest & (rs.lb < ceiling))[0], limit)
    return min([*found, *rs.lb[low].tolist(), *rs.lb[rest & (rs.lb >= ceiling)].tolist()], default=math.inf)


def accumulated_top(rs: RulesSearch, microbatches: int, price: Callable[[int], Costed | None],
                    limit: float | None, top: int, upper: float | None, deadline: Deadline,
                    progress: Progress | None, floors: dict[str, dict[int, float]] | None = None,
                    later: Sequence[RulesSearch] = (), serial: bool = False) -> tuple[list[Costed], bool]:
    """The ``top`` fastest fitting plans of a gradient-accumulation step over ``microbatches`` micro-batches
    whose layout is a rules candidate of ``rs`` (the rules space of ONE micro-batch's step), priced by
    ``price(k)`` (candidate ``k`` as the accumulated step: None when it cannot be); with ``upper``, only
    those faster than it (the plans found without accumulation: a slower one cannot make the top).

    Bounds, for ``M`` micro-batches: the accumulated step runs each micro-batch's forward and backward
    passes ``M`` times (compute on one stream, a critical collective holding it, each communicator running
    its collectives one at a time) and the optimizer and gradient all-reduces once, so ``M`` times the
    micro-batch's roofline bound (:func:`_compute_bounds`) and ``M`` times the largest entry of its bound
    vector without those (:meth:`~.pricer.Pricer.bound` with ``optimizer=False``) are lower bounds of it
    (``serial``, where no collective overlaps compute: the step itself instead, ``M - 1`` times the sum of
    the micro-batch's ops without those plus the sum with them);
    and its peak holds the micro-batch's peak (computed with the second bound) plus the gradient
    accumulators, so a candidate whose micro-batch does not fit cannot. Candidates whose first bound is
    below the cut get the second, and are priced in the order of the second bound
    until the ``top``-th best step is below the next bound (or the next bound reaches ``upper``). Without
    ``upper``, the first cut is the ``top``-th best accumulated step that fits among the micro-batch's plans
    taken in the order of their step without overlap. Returns (plans fastest first, proven).

    ``floors`` (remat policy -> candidate -> a lower bound of its accumulated step under that policy) skips
    candidates that cannot beat the cut; the second bounds computed here are added to it, for this policy
    and the ``later`` searches' (the same micro-batch under policies recomputing all this one does and more:
    recomputation only adds to every entry of a bound vector), also for the later searches' candidates in
    the same build, so a later policy needs no build of its own when they rule out all its candidates."""
    M = microbatches
    plans: dict[int, Costed | None] = {}
    cut = upper
    if cut is None:
        priced = rs.bound_and_price(limit, top, progress, deadline)
        fit = priced[rs.mem[priced] <= limit * (1 + 1e-12)] if limit is not None else priced
        seeds: list[float] = []
        for k in fit[np.argsort(rs.cost[fit], kind="stable")].tolist():
            if len(seeds) >= top or len(plans) >= MAX_REFINED or (seeds and deadline.passed()):
                break
            plans[k] = plan = deadline.timed(price, k)
            if plan is not None and plan.fits:
                seeds.append(plan.step_s)
        if not seeds:
            return [], not rs.cut_short and len(plans) == len(fit)
        cut = max(seeds)
    mine = floors.get(rs.remat, {}) if floors is not None else {}
    near = rs.may_fit_among(np.nonzero(M * rs.lb < cut * (1 + 1e-9))[0], limit)
    if mine:
        near = near[np.array([mine.get(k, 0.0) < cut * (1 + 1e-9) for k in near.tolist()], bool)]
    if not len(near):
        return [], not rs.cut_short
    ahead = np.zeros(len(rs.lb), bool)
    for other in later:
        theirs = floors.get(other.remat, {}) if floors is not None else {}
        wanted = M * other.lb < cut * (1 + 1e-9)
        wanted[list(theirs)] = False
        ahead[other.may_fit_among(np.nonzero(wanted)[0], limit)] = True
    ahead[near] = False
    idx = np.concatenate([near, np.nonzero(ahead)[0]])
    bounds, peaks = rs.overlap_bounds(idx, optimizer=False, serial=serial)
    if serial:  # the step itself: M - 1 micro-batches without the once-per-step work, the last with it
        lows = rs.overlap_bounds(idx, serial=True)[0] + (M - 1) * bounds
    else:
        lows = M * bounds
    if floors is not None:
        for policy in {rs.remat, *(other.remat for other in later)}:
            floors.setdefault(policy, {}).update(zip(idx.tolist(), lows.tolist(), strict=True))
    lows, peaks = lows[:len(near)], peaks[:len(near)]
    fit = peaks <= limit * (1 + 1e-12) if limit is not None else np.ones(len(near), bool)
    lower = sorted(zip(lows[fit].tolist(), near[fit].tolist(), strict=True))
    proven = not rs.cut_short
    for low, k in lower:
        if k in plans:
            continue
        steps = sorted(p.step_s for p in plans.values() if p is not None and p.fits)
        if low >= cut * (1 + 1e-9) or (len(steps) >= top and steps[top - 1] <= low * (1 + 1e-9)):
            break
        if len(plans) >= MAX_REFINED or (steps and deadline.passed()):
            proven = False
            rs.cut_short.append(f"{M} micro-batches, remat {rs.remat}: stopped after pricing {len(plans)} "
                                "accumulated steps (best and runner-ups among those, not proven)")
            break
        plans[k] = deadline.timed(price, k)
    rs.refined = len(plans)
    return sorted((p for p in plans.values() if p is not None and p.fits), key=lambda c: c.step_s)[:top], proven


def first_fitting(g: Graph, mesh: Mesh, hw: Hardware, rules: RuleSets, policies: tuple[str, ...],
                   searches: list[RulesSearch], limit: float | None, optimizer: str, attention: str,
                   overlap: float | str, name: str) -> Costed:
    """Rule set ``rules`` priced with the first of ``policies`` (least recomputation first) under which it
    fits: the fastest of them, as remat only adds work; the last policy when none fits. A policy whose rules
    search (in ``searches``) already knows the set's peak memory, or a bound of it, above the limit is
    skipped."""
    known = {rs.remat: rs for rs in searches}
    plan = None
    for k, policy in enumerate(policies):
        rs = known.get(policy)
        i = rs.cands.index(rules) if rs is not None else None
        if i is not None and limit is not None and k < len(policies) - 1:
            if rs.peak_floors([i])[0] > limit * (1 + 1e-9):
                continue
        if i is not None and i in rs.plans:  # priced by the search already
            plan = dataclasses.replace(rs.plans[i], name=name)
        else:
            plan = costed_rules(name, g, mesh, hw, rules_of(rules, 0, list(g.dims), mesh), limit, optimizer,
                                policy, attention, overlap)
        if plan.fits:
            break
    return plan



__all__ = ["MAX_REFINED", "SEARCH_OVERLAP", "RulesSearch", "accumulated_top", "costed_rules", "dims_mask",
           "first_fitting", "overlapped_top", "rules_candidates", "strategy_values"]
