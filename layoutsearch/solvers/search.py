"""Search: the optimal plan of a training step on a mesh, proven, with its decisions and baselines.

Problem: given a model, a mesh, hardware and a per-device memory limit (by
default the device's usable memory), find the plan minimizing the predicted
step time of the cost model (:func:`~layoutsearch.costmodel.estimate`,
overlap included in the rules space) whose peak memory per device fits the
limit: a layout of one of the spaces of :mod:`.space`, a remat policy, and
optionally gradient accumulation or a pipeline (:func:`search`).

Method. The rules space is solved first, exactly, per remat policy, by
bound-and-evaluate: the candidates whose live-set memory bound exceeds the
limit are dropped; a lower bound of every other one (the einsums' roofline
compute alone, which the step can only exceed) orders them; they are priced
in that order, in batches, until the ``top``-th best plan that fits costs
less than the bound of every candidate left (Land & Doig 1960's branch and
bound with one level). The priced candidates form a one-node problem, which
the chosen solver solves (enumeration, ILP or DP: the same answer); its
serial optimum is then refined under overlap (:func:`_overlapped_top`). The
``layers`` and ``ops`` spaces then start from the rules optimum: it is a
plan of theirs (their candidates include its projections), so its cost is an
upper bound and :func:`~.problem.prune` drops every strategy whose lower
bound exceeds it before the solver runs. Their plans are priced again by the
cost model's op rules (:func:`~.space.evaluate`), without overlap; the
better of the two is returned, so a plan is never worse than the rules
optimum, nor than any baseline (every baseline is a rule set of the space).

Baselines: data parallelism (batch over every axis), FSDP (data parallelism
with parameters, gradients and optimizer state split over the same axes),
Megatron-style tensor parallelism (the heads / feed-forward / vocabulary dims
over the minor axis, batch over the others; Shoeybi et al. 2019) and the
Mesh-TensorFlow 2-D layout (batch over the major axis, the model dims over
the others; Shazeer et al. 2018).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from layoutsearch.costmodel.compute import fastest_matmul_rate
from layoutsearch.costmodel.memory import REMAT_POLICIES, lifetimes, remat_plan
from layoutsearch.costmodel.ops import is_matmul, op_flops
from layoutsearch.costmodel.pipeline import unit_of_ops
from layoutsearch.costmodel.report import estimate
from layoutsearch.costmodel.step import training_step
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.layout import Layout, format_rules
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.mesh import hardware as _hardware
from layoutsearch.solvers import dp, ilp
from layoutsearch.solvers import enumerate as enum
from layoutsearch.solvers.build import build_space
from layoutsearch.solvers.plan import Baseline, Costed, Decision, Plan
from layoutsearch.solvers.problem import MemItem, MemRow, Problem, Solution, prune
from layoutsearch.solvers.space import (
    NONE,
    SPACES,
    Pricer,
    RuleSets,
    Space,
    evaluate,
    model_groups,
    rule_set,
    rule_sets,
    rules_of,
)
from layoutsearch.units import parse_bytes

SOLVERS = ("auto", "enumerate", "ilp-pulp", "ilp-ortools", "dp")
"""Solver names: ``auto`` picks enumeration for one node, the DP for chains, CBC (``ilp-pulp``) otherwise."""

Progress = Callable[[str], None]


class InfeasibleError(LayoutSearchError):
    """No layout of the space fits the memory limit; ``min_memory`` is the smallest peak any layout needs;
    ``options``: arguments of :func:`search`, not tried, that could make a plan fit (e.g. ``{"pipeline":
    "auto"}``)."""

    def __init__(self, message: str, min_memory: float | None, options: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.min_memory = min_memory
        self.options = dict(options or {})


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


@contextmanager
def _reporting(progress: Progress | None, what: str, every: float = 5.0) -> Iterator[None]:
    """Report ``what`` on entry and then every ``every`` seconds, or a fifth of the time spent when longer,
    until the block ends: the phases with no steps of their own to report (building a space, a solver's run)."""
    if progress is None:
        yield
        return
    progress(what)
    t0 = time.perf_counter()
    done = threading.Event()

    def beat() -> None:
        wait = every
        while not done.wait(wait):
            spent = time.perf_counter() - t0
            progress(f"{what}, {spent:.0f} s so far")
            wait = max(every, spent / 5)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# -- baselines ------------------------------------------------------------------------------------------------------

_MODEL_DIMS = ("heads", "kv_heads", "q_per_kv", "d_ff", "hidden", "vocab", "experts")


def _dividing(axes: list[tuple[str, int]], size: int) -> list[str]:
    """The longest prefix of ``axes`` whose product divides ``size``."""
    out, prod = [], 1
    for a, s in axes:
        if size % (prod * s):
            break
        out.append(a)
        prod *= s
    return out


def baseline_rules(graph: Graph, mesh: Mesh) -> dict[str, tuple[RuleSets | None, str]]:
    """The baselines as one-candidate rule sets (None, with the reason, when one does not apply)."""
    dims = list(graph.dims)
    big = [(a, s) for a, s in mesh.axes if s > 1]
    batch = "batch" if "batch" in dims else (graph.inputs[0].dim_names[0] if graph.inputs else dims[0])
    out: dict[str, tuple[RuleSets | None, str]] = {}
    data = _dividing(big, graph.dims[batch])
    choice: dict[str, Any] = {a: batch for a in data}
    pick = lambda ch: [ch.get(a) for a in mesh.names]
    out["data-parallel"] = (rule_set(pick(choice), dims, mesh), "") if data else (None, f"{batch} is not divisible")
    pbytes: dict[str, int] = {}
    for t in graph.parameters:
        for d in t.dim_names:
            pbytes[d] = pbytes.get(d, 0) + t.nbytes
    group = math.prod(s for a, s in big if a in data)
    fsdp_dim = next((d for d in sorted(pbytes, key=lambda d: -pbytes[d]) if graph.dims[d] % group == 0), None)
    if data and fsdp_dim is not None:
        out["fsdp"] = (rule_set(pick(choice), dims, mesh, fsdp_dim, data), "")
    else:
        out["fsdp"] = (None, "no parameter dim divisible by the data-parallel axes")
    groups = model_groups(graph)
    named = [d for d in _MODEL_DIMS if d in dims]
    ranked = sorted(groups, key=lambda g: -sum(d in named for d in g))
    model: tuple[str, ...] | None = ranked[0] if ranked and any(d in named for d in ranked[0]) else None
    if model is None:
        model = (named[0],) if named else (max(pbytes, key=lambda d: (pbytes[d], d)),) if pbytes else None
    if len(big) < 2 or model is None:
        why = "needs at least two mesh axes" if len(big) < 2 else "no model dims"
        out["megatron"] = (None, why)
        out["mesh-tf-2d"] = (None, why)
        return out

    def tensor_parallel(data_axes: list[tuple[str, int]], model_axes: list[tuple[str, int]]) -> RuleSets | None:
        size = math.prod(s for _, s in model_axes)
        members = tuple(d for d in model if graph.dims[d] % size == 0)
        d_axes = _dividing(data_axes, graph.dims[batch])
        if not members:
            return None
        ch: dict[str, Any] = {a: batch for a in d_axes}
        ch.update({a: members if len(members) > 1 else members[0] for a, _ in model_axes})
        return rule_set(pick(ch), dims, mesh)

    mega = tensor_parallel(big[:-1], big[-1:])
    out["megatron"] = (mega, "") if mega is not None else (None, "no model dim divisible by the minor axis")
    two_d = tensor_parallel(big[:1], big[1:])
    out["mesh-tf-2d"] = (two_d, "") if two_d is not None else (None, "no model dim divisible by the minor axes")
    return out


# -- the rules space ------------------------------------------------------------------------------------------------

SEARCH_OVERLAP = 0.0
"""The spaces price a step as the sum of its ops' compute and communication (the overlap schedule is not a
sum over ops): the objective of the solvers, refined under overlap for the rules space
(:func:`_overlapped_top`); the layers and ops spaces report their plans on these terms."""


def _compute_bounds(g: Graph, mesh: Mesh, hw: Hardware, cands: RuleSets, dims: list[str],
                    on_chip: frozenset[str] = frozenset()) -> np.ndarray:
    """A lower bound of each candidate's step time: the einsums' roofline compute (FLOPs, and the HBM bytes
    of their inputs not ``on_chip``), which communication and the other ops only add to."""
    axis = np.array([s for _, s in mesh.axes], dtype=float)
    total = np.zeros(len(cands))
    seen: dict[tuple, int] = {}
    reps: dict[tuple, O.Op] = {}
    for op in g.ops:
        if is_matmul(op, g.tensors):  # (vector einsums run at another rate: left out of the bound)
            key = tuple((g.tensors[x].dims, g.tensors[x].dtype, x in on_chip) for x in (*op.inputs, op.output))
            seen[key] = seen.get(key, 0) + 1
            reps.setdefault(key, op)

    def mask(names: tuple[str, ...]) -> np.ndarray:
        m = np.zeros(len(dims) + 1, bool)
        m[[dims.index(d) for d in names]] = True
        return m

    for key, op in reps.items():
        proj = cands.project(mask(op.iteration_dims(g.tensors)))
        split = np.where(proj >= 0, axis[None, :], 1.0).prod(axis=1)
        flops = op_flops(g, op) / split / fastest_matmul_rate(hw)
        hbm = np.zeros(len(cands))
        for x in op.inputs:
            if x in on_chip:
                continue
            t = g.tensors[x]
            px = cands.project(mask(t.dim_names))
            hbm += t.nbytes / np.where(px >= 0, axis[None, :], 1.0).prod(axis=1)
        total += seen[key] * np.maximum(flops, hbm / (hw.hbm_bandwidth * hw.memory_efficiency))
    return total


def _memory_bounds(g: Graph, mesh: Mesh, hw: Hardware, cands: RuleSets, dims: list[str], remat: str,
                   on_chip: frozenset[str], points: int = 16) -> np.ndarray:
    """A lower bound of each candidate's peak memory: the bytes the memory model holds live at a few points of
    the schedule (the tensors whose lifetime, under ``remat``, spans the point, at their per-device size: fed
    tensors, saved activations, gradients), the largest over the points. Candidates whose bound exceeds the
    limit are never priced."""
    life = lifetimes(g, remat_plan(g, remat))
    n = len(g.ops)
    axis = np.array([s for _, s in mesh.axes], dtype=float)
    skip = set(life.deferrable.values()) if hw.combined_gradient_all_reduce else set()
    at = sorted({int(x) for x in np.linspace(0, n - 1, points)} | {int(life.last_backward)} - {-1})
    split: dict[tuple[str, ...], np.ndarray] = {}
    best = np.zeros(len(cands))
    for p in at:
        live: dict[tuple[str, ...], float] = defaultdict(float)
        for row in np.nonzero((life.start <= p) & (life.end >= p))[0]:
            t = life.tensors[int(life.tensor[row])]
            if row not in skip and t.name not in on_chip:
                live[t.dim_names] += t.nbytes
        total = np.zeros(len(cands))
        for names, nbytes in live.items():
            if names not in split:
                m = np.zeros(len(dims) + 1, bool)
                m[[dims.index(d) for d in names]] = True
                proj = cands.project(m)
                split[names] = np.where(proj >= 0, axis[None, :], 1.0).prod(axis=1)
            total += nbytes / split[names]
        best = np.maximum(best, total)
    return best


def _values(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
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


def _candidates(g: Graph, mesh: Mesh, hw: Hardware, pricer: Pricer, extra: RuleSets | None
                ) -> tuple[RuleSets, np.ndarray]:
    """The rules space's candidates (``extra`` appended) and their roofline bounds: the same for every remat
    policy."""
    cands = rule_sets(g, mesh)
    cands = cands.concat(extra) if extra is not None else cands
    return cands, _compute_bounds(g, mesh, hw, cands, list(g.dims), pricer.fusion.on_chip)


class _RulesSearch:
    """The rules space of one graph, priced lazily in bound order."""

    def __init__(self, g: Graph, mesh: Mesh, hw: Hardware, pricer: Pricer,
                 candidates: tuple[RuleSets, np.ndarray], remat: str = "none") -> None:
        self.g, self.mesh, self.hw, self.pricer, self.remat = g, mesh, hw, pricer, remat
        self.dims = list(g.dims)
        self.cands, self.lb = candidates
        self.mem_lb = _memory_bounds(g, mesh, hw, self.cands, self.dims, remat, pricer.fusion.on_chip)
        self.cost = np.full(len(self.cands), np.nan)
        self.mem = np.full(len(self.cands), np.nan)
        self.rows = 0

    def price(self, idx: np.ndarray) -> None:
        idx = np.array([i for i in idx if np.isnan(self.cost[i])], dtype=np.int64)
        if len(idx):
            space = build_space(self.g, self.mesh, self.hw, "rules", rules=self.cands.take(idx), pricer=self.pricer,
                                remat=self.remat)
            self.cost[idx], self.mem[idx] = _values(space.problem)
            self.rows = max(self.rows, len(space.problem.mem_rows))

    def problem(self, idx: np.ndarray) -> Problem:
        """The one-node problem of the priced candidates ``idx``: their costs, and their peak memory as one
        item on one row (the peak of a one-node problem is a number per strategy)."""
        return Problem(["rules"], [self.cost[idx].copy()], [], [MemItem(0, None, self.mem[idx].copy())],
                       [MemRow(0.0, ((0, 1),), "peak")])

    def bound_and_price(self, limit: float | None, top: int, progress: Progress | None) -> np.ndarray:
        """Price candidates in bound order until the ``top`` best that fit are proven; returns the priced."""
        order = np.argsort(self.lb, kind="stable")
        if limit is not None:  # a candidate whose live bytes exceed the limit somewhere cannot fit
            order = order[self.mem_lb[order] <= limit * (1 + 1e-9)]
        batch, start = 32, 0
        while start < len(order):
            self.price(order[start:start + batch])
            start += batch
            done = ~np.isnan(self.cost)
            ok = done & (self.mem <= limit * (1 + 1e-12) if limit is not None else done)
            if ok.sum() >= top:
                kth = np.sort(self.cost[ok])[top - 1]
                if start >= len(order) or self.lb[order[start]] > kth * (1 + 1e-9):
                    break
            if progress is not None:
                progress(f"rules space: priced {int(done.sum())} of {len(order)} candidates")
            batch = min(batch * 2, 512)
        return np.nonzero(~np.isnan(self.cost))[0]

    def price_below(self, cut: float, limit: float | None) -> None:
        """Price every candidate that may fit and whose roofline bound is at most ``cut``."""
        want = (self.lb <= cut * (1 + 1e-9)) & np.isnan(self.cost)
        if limit is not None:
            want &= self.mem_lb <= limit * (1 + 1e-9)
        idx = np.nonzero(want)[0]
        for start in range(0, len(idx), 512):
            self.price(idx[start:start + 512])

    def min_memory(self) -> tuple[float, int]:
        """The smallest peak memory of any candidate (priced in resident-bytes bound order) and its index."""
        order = np.argsort(self.mem_lb, kind="stable")
        batch, start = 64, 0
        while start < len(order):
            self.price(order[start:start + batch])
            start += batch
            done = ~np.isnan(self.mem)
            best = float(np.min(self.mem[done]))
            if start >= len(order) or self.mem_lb[order[start]] > best:
                break
            batch = min(batch * 2, 512)
        done = np.nonzero(~np.isnan(self.mem))[0]
        k = done[int(np.argmin(self.mem[done]))]
        return float(self.mem[k]), int(k)


# -- solving --------------------------------------------------------------------------------------------------------

def _solver_for(problem: Problem, solver: str, limit: float | None) -> str:
    """``solver``, or for ``auto``: enumeration for tiny problems, the DP for chains (without a memory limit,
    or small enough for its labels), CBC otherwise. The LP relaxation of the formulation is tight on trees,
    which CBC's LP-based branch and cut exploits: on the ops space of a 4-layer GPT (d_model 1024) CBC proves
    the 3 best plans in 22 s (122k variables, 2 axes) and the best in about 6 min (2.2M variables, 3 axes)
    where CP-SAT, on 2 cores, runs past 10 min on the first and past 20 GiB of memory on the second."""
    if solver != "auto":
        return solver
    if len(problem.unary) == 1 or problem.num_assignments <= 4096:
        return "enumerate"
    shape = dp.chain_order(problem) if all(len(f.nodes) == 2 for f in problem.factors) else None
    if shape is not None:
        hub, order = shape
        sizes = problem.sizes
        work = (sizes[hub] if hub is not None else 1) * sum(sizes[a] * sizes[b] for a, b in itertools.pairwise(order))
        if limit is None or work * max(1, len(problem.mem_rows)) <= 2e5:
            return "dp"
    return "ilp-pulp"


def _solve(problem: Problem, solver: str, limit: float | None, top: int, time_limit: float | None,
           hint: tuple[int, ...] | None = None) -> list[Solution]:
    if solver == "enumerate":
        return enum.solve(problem, limit, top)
    if solver == "dp":
        return dp.solve(problem, limit, top)
    if solver in ("ilp-pulp", "ilp-ortools"):
        return ilp.solve(problem, limit, backend=solver[4:], top=top, time_limit=time_limit, hint=hint)
    raise LayoutSearchError(f"unknown solver {solver!r} (known: {', '.join(SOLVERS)})")


def _costed(name: str, g: Graph, mesh: Mesh, hw: Hardware, space: Space, assign: tuple[int, ...],
            limit: float | None, optimizer: str, remat: str = "none", attention: str = "auto") -> Costed:
    """A plan of ``space`` priced as the space prices it (no overlap): by the cost model's report when rules
    describe it, else op by op."""
    rules = space.rules(assign)
    if rules is not None:
        return _costed_rules(name, g, mesh, hw, rules, limit, optimizer, remat, attention, SEARCH_OVERLAP)
    fit = limit if limit is not None else hw.usable_bytes
    iteration = space.op_layouts(assign)
    storage = {t: space.storage(assign, t) for t in g.tensors}
    comp, comm, mem = evaluate(g, mesh, hw, iteration, storage, remat)
    return Costed(name, space.layout(assign), None, comp + comm, comp, comm, mem, mem <= fit, iteration, None,
                  remat=remat)


def _costed_rules(name: str, g: Graph, mesh: Mesh, hw: Hardware, rules: tuple, limit: float | None,
                  optimizer: str, remat: str = "none", attention: str = "auto",
                  overlap: float | str = "auto") -> Costed:
    """Rules priced by the cost model (:func:`~layoutsearch.costmodel.estimate`)."""
    layout = Layout(mesh, rules).check(g)
    rep = estimate(g, layout, hw, optimizer=optimizer, remat=remat, attention=attention, overlap=overlap)
    fit = limit if limit is not None else hw.usable_bytes
    return Costed(name, layout, tuple(rules), rep.step_s, rep.compute_s, rep.comm_s, rep.memory_bytes,
                  rep.memory_bytes <= fit, None, rep, remat=remat)


def _stats(problem: Problem) -> dict[str, Any]:
    return {"nodes": len(problem.unary), "strategies": int(sum(problem.sizes)), "factors": len(problem.factors),
            "memory_rows": len(problem.mem_rows),
            "variables": int(sum(problem.sizes) + sum(f.cost.size for f in problem.factors))}


def memory_limit_bytes(memory_limit: float | str | None, hw: Hardware) -> float | None:
    """The per-device limit a search enforces: ``"auto"`` -> the device's usable memory
    (:attr:`~layoutsearch.mesh.Hardware.usable_bytes`: HBM less the runtime's reserve); None or ``"none"`` ->
    no limit; else bytes (a number, or a string like ``16GiB``)."""
    if memory_limit is None or (isinstance(memory_limit, str) and memory_limit.strip().lower() == "none"):
        return None
    if isinstance(memory_limit, str) and memory_limit.strip().lower() == "auto":
        return float(hw.usable_bytes)
    limit = float(parse_bytes(memory_limit))
    if limit <= 0:
        raise LayoutSearchError(f"memory limit must be positive, got {memory_limit!r}")
    return limit


MAX_REFINED = 256
"""At most this many plans of one remat policy are priced with overlap (:func:`_overlapped_top`); past it the
search stops with its best plan (proven when no plan left can beat it; else labelled not proven, with the gap
to the smallest lower bound left) and runner-ups that are the best priced, not proven."""


def _overlapped_top(rs: _RulesSearch, limit: float | None, top: int, solver: str, time_limit: float | None,
                    overlap: float | str, attention: str, optimizer: str, progress: Progress | None
                    ) -> tuple[list[Costed], bool, float | None, str]:
    """The ``top`` fastest fitting rule sets of ``rs`` under the full cost model (overlap included); the
    fastest proven.

    The space prices a step as the sum of its ops (``C``: the step without overlap) and, with
    :meth:`~.space.Pricer.bound`, its compute plus the collectives the step always waits for (``A``, a lower
    bound of the overlapped step ``S``; ``S`` is usually below ``C``, but may exceed it when prefetched
    gathers hold a communicator a critical collective then waits for). The solver proves the ``top``
    smallest ``C`` that fit; their ``k``-th is the first cut. Every fitting candidate whose roofline bound is
    below the cut is priced, its ``A`` computed, and they are priced by the cost model in order of ``A``
    until the ``top``-th best ``S`` is below the next ``A``; if that ``S`` is above the cut, the cut rises
    to it and the candidates below the new cut join. Returns (plans fastest first, proven, gap, solver)."""
    g, mesh, hw, dims = rs.g, rs.mesh, rs.hw, rs.dims
    priced = rs.bound_and_price(limit, top, progress)
    if not len(priced):
        return [], True, None, "enumerate"
    problem = rs.problem(priced)
    name = _solver_for(problem, solver, limit)
    sols = _solve(problem, name, limit, top, time_limit)
    if not sols[0].assign:
        return [], True, None, name
    exact = overlap == SEARCH_OVERLAP or (not hw.async_collectives and overlap == "auto")  # S = C
    cut = max(float(rs.cost[priced[s.assign[0]]]) for s in sols)
    proven, gap = all(s.optimal for s in sols), None
    lower: dict[int, float] = {}
    plans: dict[int, Costed] = {}
    while True:
        done = np.nonzero(~np.isnan(rs.cost))[0]
        ok = rs.mem[done] <= limit * (1 + 1e-12) if limit is not None else np.ones(len(done), bool)
        new = [int(k) for k in done[ok & (rs.lb[done] <= cut * (1 + 1e-9))] if int(k) not in lower]
        if new and exact:
            lower.update({k: float(rs.cost[k]) for k in new})
        elif new:
            space = build_space(g, mesh, hw, "rules", rules=rs.cands.take(new), pricer=rs.pricer.bound(),
                                remat=rs.remat)
            lower.update(zip(new, map(float, _values(space.problem)[0]), strict=True))
        for low, k in sorted((v, k) for k, v in lower.items() if k not in plans):
            steps = sorted(p.step_s for p in plans.values())
            if len(steps) >= top and steps[top - 1] <= low * (1 + 1e-9):
                break
            if len(plans) >= MAX_REFINED:  # the best is proven if no plan left can beat it (the runner-ups not)
                if steps[0] > low * (1 + 1e-9):
                    proven, gap = False, (steps[0] - low) / steps[0]
                break
            if progress is not None and plans and len(plans) % 8 == 0:
                progress(f"remat {rs.remat}: priced {len(plans)} plans with overlap")
            plans[k] = _costed_rules("", g, mesh, hw, rules_of(rs.cands, k, dims, mesh), limit, optimizer, rs.remat,
                                     attention, overlap)
        steps = sorted(p.step_s for p in plans.values())
        reach = steps[min(top, len(steps)) - 1]
        if reach <= cut * (1 + 1e-9) or len(plans) >= MAX_REFINED:
            break
        cut = reach  # an overlapped step above the cut: candidates up to it may still beat it
        rs.price_below(cut, limit)
    return sorted(plans.values(), key=lambda c: c.step_s)[:top], proven, gap, name


def _first_fitting(g: Graph, mesh: Mesh, hw: Hardware, rules: RuleSets, policies: tuple[str, ...],
                   searches: list[_RulesSearch], limit: float | None, optimizer: str, attention: str,
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
            peak = rs.mem[i] if not np.isnan(rs.mem[i]) else rs.mem_lb[i]
            if peak > limit * (1 + 1e-9):
                continue
        plan = _costed_rules(name, g, mesh, hw, rules_of(rules, 0, list(g.dims), mesh), limit, optimizer, policy,
                             attention, overlap)
        if plan.fits:
            break
    return plan


def _pipelined(graph: Graph, mesh: Mesh, hw: Hardware, limit: float | None, pipeline: str | int,
               microbatches: int | str, schedule: str, optimizer: str, precision: Precision | str, attention: str,
               overlap: float | str, upper: float | None, progress: Progress | None) -> tuple[list[Costed], str]:
    """The best pipelined plan (:func:`~.pipeline_search.search_pipeline`; for ``pipeline="auto"`` only
    those that can beat ``upper``) as a Costed, or the reason none fits or applies."""
    from layoutsearch.solvers.pipeline_search import search_pipeline

    try:
        pp = search_pipeline(graph, mesh, limit, hardware=hw, stages=None if pipeline == "auto" else int(pipeline),
                             microbatches=None if microbatches == "auto" else int(microbatches),
                             optimizer=optimizer, precision=precision, schedule=schedule, attention=attention,
                             overlap=overlap, upper=upper if pipeline == "auto" else None, progress=progress)
    except LayoutSearchError as e:
        return [], str(e)
    return [_costed_microbatched("pipelined", Layout.from_rules(mesh, pp.report.inner_layout), pp.report, limit,
                                 hw)], ""


def _costed_microbatched(name: str, layout: Layout, rep: Any, limit: float | None, hw: Hardware) -> Costed:
    """A micro-batched step's :class:`~layoutsearch.costmodel.pipeline.PipelineReport` as a Costed (compute
    and communication: the micro-batch's, times the micro-batches)."""
    fit = limit if limit is not None else hw.usable_bytes
    M = rep.microbatches
    return Costed(name, layout, layout.rules, rep.step_s, rep.inner.compute_s * M, rep.inner.comm_s * M,
                  rep.memory_bytes, rep.memory_bytes <= fit, None, rep, remat=rep.remat, microbatches=M,
                  stage_axis=rep.stage_axis, schedule=str(rep.schedule) if rep.stage_axis is not None else None)


def _accumulated(graph: Graph, mesh: Mesh, hw: Hardware, M: int, policies: tuple[str, ...], limit: float | None,
                 top: int, solver: str, optimizer: str, precision: Precision | str, attention: str,
                 overlap: float | str, progress: Progress | None) -> list[Costed]:
    """The fastest plans with ``M`` gradient-accumulation micro-batches: the layouts searched on one
    micro-batch (whose peak can only be below the accumulated step's: the step adds the gradient
    accumulators), then priced as the accumulated step
    (:func:`~layoutsearch.costmodel.pipeline.estimate_pipeline` without a stage axis)."""
    from layoutsearch.costmodel.pipeline import estimate_pipeline

    B = graph.dims["batch"]
    micro = training_step(graph.with_sizes({"batch": B // M}), optimizer, precision)
    pricer = Pricer(micro, mesh, hw, attention)
    candidates = _candidates(micro, mesh, hw, pricer, _baseline_sets(baseline_rules(micro, mesh)))
    out: list[Costed] = []
    for policy in policies:
        if progress is not None:
            progress(f"{M} micro-batches, remat {policy}: searching the layout of one micro-batch")
        rs = _RulesSearch(micro, mesh, hw, pricer, candidates, policy)
        plans, _, _, _ = _overlapped_top(rs, limit, top, solver, None, overlap, attention, optimizer, None)
        for p in plans:
            layout = Layout(mesh, p.rules)
            try:
                rep = estimate_pipeline(graph, layout, hw, stage_axis=None, microbatches=M, remat=policy,
                                        optimizer=optimizer, precision=precision, attention=attention,
                                        overlap=overlap if overlap == "auto" else 0)
            except LayoutSearchError:
                continue
            out.append(_costed_microbatched("", layout, rep, limit, hw))
    return out


def _baseline_sets(base: dict[str, tuple[RuleSets | None, str]]) -> RuleSets | None:
    """The baselines' rule sets (:func:`baseline_rules`), as extra candidates of the rules space."""
    extra = None
    for rs, _ in base.values():
        if rs is not None:
            extra = rs if extra is None else extra.concat(rs)
    return extra


def _microbatch_options(batch: int, microbatches: int | str) -> list[int]:
    """Gradient-accumulation micro-batch counts to try beyond 1: the one given, or powers of two dividing
    the batch up to 64."""
    if microbatches != "auto":
        return [int(microbatches)] if int(microbatches) > 1 else []
    return [m for m in (2, 4, 8, 16, 32, 64) if batch % m == 0]


def search(graph: Graph, mesh: Mesh | str, memory_limit: float | str | None = "auto", solver: str = "auto", *,
           hardware: Hardware | str = "cpu-sim", space: str = "rules", optimizer: str = "adam",
           precision: Precision | str = DEFAULT_PRECISION, attention: str = "auto", overlap: float | str = "auto",
           remat: str = "auto", microbatches: int | str = "auto", pipeline: str | int = "off",
           schedule: str = "1f1b", top: int = 3, time_limit: float | None = None, tie: bool = True,
           baselines: bool = True, progress: Progress | None = None) -> Plan:
    """The plan of ``graph``'s training step on ``mesh`` minimizing the predicted step time under
    ``memory_limit`` per device, searched jointly over what practitioners decide:

    * the layout, in ``space`` (``rules``, ``layers`` or ``ops``, see :mod:`.space`), by ``solver``
      (:data:`SOLVERS`);
    * ``remat``: ``auto`` (each of ``none``, ``selective``, ``full``; ``none`` in the ops space) or one
      policy;
    * ``microbatches``: gradient accumulation, ``auto`` (tried when the memory limit binds: powers of two
      dividing the batch) or a number;
    * ``pipeline``: ``off``, ``auto`` (a pipeline over any mesh axis, chosen when faster) or ``K`` (stages
      over an axis of size K, forced), with ``schedule`` (``gpipe``, ``1f1b``, ``interleaved:V``).

    ``memory_limit``: ``"auto"`` (default: the device's usable memory, HBM less the runtime's reserve), None
    or ``"none"`` (no limit), bytes or a string like ``16GiB``. ``precision`` and ``attention`` are held
    fixed (``mixed``/``bf16``/``fp32``; ``auto``/``standard``/``flash``); ``overlap`` is the cost model's
    (``auto`` or a number in [0, 1]). Plans of the rules space are priced by the full cost model
    (overlap included) and proven optimal under it; the layers and ops spaces price a step without overlap.

    Returns a :class:`Plan`: the chosen plan, ``top - 1`` runner-ups, the baselines (priced unless
    ``baselines`` is False), and ``decisions``
    (the best plan per remat policy, micro-batch count and pipeline choice). ``optimal`` is the proof over
    unaccumulated, unpipelined plans (layouts x remat policies); a chosen accumulated or pipelined plan is
    labelled not proven (its layout comes from the best layouts of one micro-batch). Raises :class:`InfeasibleError`
    naming the smallest peak memory and what would help when nothing fits, LayoutSearchError for a bad
    argument.
    """
    t0 = time.perf_counter()
    if space not in SPACES:
        raise LayoutSearchError(f"unknown search space {space!r} (known: {', '.join(SPACES)})")
    if solver not in SOLVERS:
        raise LayoutSearchError(f"unknown solver {solver!r} (known: {', '.join(SOLVERS)})")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise LayoutSearchError(f"top must be a positive integer, got {top!r}")
    if remat != "auto" and remat not in REMAT_POLICIES:
        raise LayoutSearchError(f"unknown remat policy {remat!r} (known: auto, {', '.join(REMAT_POLICIES)})")
    if microbatches != "auto" and (isinstance(microbatches, bool) or not isinstance(microbatches, int)
                                   or microbatches < 1):
        raise LayoutSearchError(f"microbatches must be 'auto' or a positive integer, got {microbatches!r}")
    if pipeline not in ("off", "auto") and (isinstance(pipeline, bool) or not isinstance(pipeline, int)
                                            or pipeline < 2):
        raise LayoutSearchError(f"pipeline must be 'off', 'auto' or a number of stages >= 2, got {pipeline!r}")
    if time_limit is not None and not (isinstance(time_limit, int | float) and math.isfinite(time_limit)
                                       and time_limit > 0):
        raise LayoutSearchError(f"time limit must be a positive number of seconds, got {time_limit!r}")
    if isinstance(microbatches, int) and microbatches > 1 and graph.dims.get("batch", 1) % microbatches:
        raise LayoutSearchError(f"{microbatches} micro-batches do not divide batch={graph.dims.get('batch', 1)}")
    mesh = Mesh.of(mesh)
    hw = _hardware(hardware)
    limit = memory_limit_bytes(memory_limit, hw)
    policies = (REMAT_POLICIES if space != "ops" else ("none",)) if remat == "auto" else (remat,)
    g = training_step(graph, optimizer, precision)
    pricer = Pricer(g, mesh, hw, attention)
    base = baseline_rules(g, mesh)
    candidates = None
    if pipeline in ("off", "auto"):
        with _reporting(progress, "rules space: enumerating rule sets"):
            candidates = _candidates(g, mesh, hw, pricer, _baseline_sets(base))
    options: list[Costed] = []
    decisions: list[Decision] = []
    optimal, gap, used, stats = True, 0.0, "", {}
    searches: list[_RulesSearch] = []
    for policy in policies if pipeline in ("off", "auto") else ():
        rs = _RulesSearch(g, mesh, hw, pricer, candidates, policy)
        searches.append(rs)
        if progress is not None:
            progress(f"remat {policy}: searching the {space} space")
        if space == "rules":
            plans, proven, pgap, used = _overlapped_top(rs, limit, top, solver, time_limit, overlap, attention,
                                                        optimizer, progress)
            stats = {"candidates": len(rs.cands), "priced": int((~np.isnan(rs.cost)).sum()), "memory_rows": rs.rows,
                     "nodes": 1, "strategies": len(rs.cands), "factors": 0, "variables": len(rs.cands)}
        else:
            priced = rs.bound_and_price(limit, top, progress)
            sols = _solve(rs.problem(priced), "enumerate", limit, top, None) if len(priced) else []
            if not sols or not sols[0].assign:
                plans, proven, pgap = [], True, None
            else:
                chosen, more, used, proven, pgap, stats = _finer(
                    g, mesh, hw, space, solver, limit, top, time_limit, tie, pricer, rs, rs.cands.take(priced),
                    sols[0], optimizer, progress, policy, attention)
                plans = [p for p in (chosen, *more) if _within(p, limit)]
        for p in plans:
            options.append(p)
        if plans:
            optimal = optimal and proven
            gap = (gap or 0.0) if proven else max(pgap or 0.0, gap or 0.0)
        decisions.append(_decision("remat", policy, plans[0] if plans else None, rs.min_memory()[0] if not plans
                                   else None))
    best = min((p.step_s for p in options), default=math.inf)
    binds = limit is not None and any(
        bool(np.any((rs.mem > limit * (1 + 1e-12)) & (rs.lb < best))) for rs in searches)
    if "batch" in g.dims and (binds or microbatches != "auto") and pipeline in ("off", "auto"):
        fitted = 0
        for M in _microbatch_options(graph.dims["batch"], microbatches):
            plans = _accumulated(graph, mesh, hw, M, policies, limit, top, solver, optimizer, precision, attention,
                                 overlap, progress)
            plans = sorted((p for p in plans if _within(p, limit)), key=lambda c: c.step_s)
            options += plans[:top]
            decisions.append(_decision("microbatches", str(M), plans[0] if plans else None, None))
            fitted += bool(plans)
            if fitted >= 2:  # the first count that fits and one more: more micro-batches only add overhead
                break
    why_not_piped = ""
    if pipeline != "off":
        upper = min((p.step_s for p in options if _within(p, limit)), default=None)
        plans, why_not_piped = _pipelined(graph, mesh, hw, limit, pipeline, microbatches, schedule, optimizer,
                                          precision, attention, overlap, upper, progress)
        options += [p for p in plans if _within(p, limit)]
        label = "any axis" if pipeline == "auto" else f"{pipeline} stages"
        if plans:
            p = plans[0]
            label = (f"{mesh.axis_size(p.stage_axis)} stages over {p.stage_axis}, {p.microbatches} micro-batches, "
                     f"{p.schedule}")
        decisions.append(_decision("pipeline", label, plans[0] if plans else None, None, why_not_piped))
    options = [p for p in options if _within(p, limit)]
    if not options:
        with _reporting(progress, "nothing fits: finding the smallest peak memory"):
            error = _infeasible(g, mesh, limit, searches, why_not_piped, microbatches, pipeline)
        raise error
    options.sort(key=lambda c: c.step_s)
    ranked = [dataclasses.replace(p, name="chosen" if i == 0 else f"#{i + 1}") for i, p in enumerate(options[:top])]
    chosen, runner_ups = ranked[0], tuple(ranked[1:])
    if chosen.microbatches > 1 or chosen.pipelined:  # found by the heuristics of _accumulated / search_pipeline
        optimal, gap = False, None
    priced_baselines = []
    if baselines and progress is not None:
        progress("pricing the baselines")
    for bname, (brs, why) in base.items() if baselines else ():
        if brs is None:
            priced_baselines.append(Baseline(bname, None, why))
        else:
            priced_baselines.append(Baseline(bname, _first_fitting(g, mesh, hw, brs, policies, searches, limit,
                                                                   optimizer, attention, overlap, bname)))
    decisions = [dataclasses.replace(d, chosen=_same_choice(d, chosen)) for d in decisions]
    return Plan(g, hw, space, used or "enumerate", chosen, optimal, gap, limit, time.perf_counter() - t0,
                runner_ups, tuple(priced_baselines), stats, tuple(decisions), model=graph,
                precision=Precision.of(precision).name, optimizer=optimizer, attention=attention, overlap=overlap)


def price_plan(graph: Graph, layout: Layout, hardware: Hardware | str = "cpu-sim", *, remat: str = "none",
               microbatches: int = 1, stage_axis: str | None = None, schedule: str | None = None,
               memory_limit: float | str | None = "auto", optimizer: str = "adam",
               precision: Precision | str = DEFAULT_PRECISION, attention: str = "auto",
               overlap: float | str = "auto") -> Costed:
    """One plan of ``graph`` (a forward graph) priced as :func:`search` prices it: ``layout`` with the
    decisions (remat policy, gradient-accumulation or pipeline micro-batches, stage axis and schedule)."""
    hw = _hardware(hardware)
    limit = memory_limit_bytes(memory_limit, hw)
    if microbatches == 1 and stage_axis is None:
        return _costed_rules("", training_step(graph, optimizer, precision), layout.mesh, hw, layout.rules, limit,
                             optimizer, remat, attention, overlap)
    from layoutsearch.costmodel.pipeline import estimate_pipeline

    rep = estimate_pipeline(graph, layout, hw, stage_axis=stage_axis, microbatches=microbatches,
                            schedule=schedule or "1f1b", remat=remat, optimizer=optimizer, precision=precision,
                            attention=attention, overlap=overlap if overlap == "auto" else 0,
                            memory_limit=limit if stage_axis is not None else None)
    return _costed_microbatched("", layout, rep, limit, hw)


def _within(plan: Costed, limit: float | None) -> bool:
    return limit is None or plan.memory_bytes <= limit * (1 + 1e-12)


def _decision(kind: str, option: str, plan: Costed | None, min_memory: float | None, why: str = "") -> Decision:
    if plan is None:
        return Decision(kind, option, None, min_memory, False, why or "nothing fits the memory limit")
    return Decision(kind, option, plan.step_s, plan.memory_bytes, True, why)


def _same_choice(d: Decision, chosen: Costed) -> bool:
    if d.kind == "remat":
        return chosen.stage_axis is None and chosen.microbatches == 1 and chosen.remat == d.option
    if d.kind == "microbatches":
        return chosen.stage_axis is None and str(chosen.microbatches) == d.option
    return chosen.stage_axis is not None


def _infeasible(g: Graph, mesh: Mesh, limit: float | None, searches: list[_RulesSearch], why_not_piped: str,
                microbatches: int | str, pipeline: str | int) -> InfeasibleError:
    """The error of a search where nothing fits: the smallest peak any layout needs, and what could help,
    naming the options of :func:`search` not tried: remat full when not searched, gradient accumulation when
    ``microbatches`` was fixed, a pipeline when ``pipeline`` was off and a mesh axis could carry stages
    (2 <= size <= the graph's pipeline units)."""
    if not searches:
        return InfeasibleError(why_not_piped, None)
    peaks = [rs.min_memory() + (rs,) for rs in searches]
    peak, k, rs = min(peaks, key=lambda p: p[0])
    lay = format_rules(rules_of(rs.cands, k, rs.dims, mesh)) or "replicated"
    helps = ["a larger memory limit or more devices"]
    options: dict[str, Any] = {}
    if all(r.remat != "full" for r in searches):
        helps.append("remat full")
        options["remat"] = "full"
    if "batch" in g.dims and microbatches != "auto":
        helps.append("gradient accumulation (microbatches='auto')")
        options["microbatches"] = "auto"
    if pipeline == "off" and "batch" in g.dims:
        units = len(set(unit_of_ops(g).values()))
        if any(2 <= size <= units for _, size in mesh.axes):
            helps.append("a pipeline (pipeline='auto')")
            options["pipeline"] = "auto"
    return InfeasibleError(
        f"no plan of {g.name!r} on mesh {mesh} fits {_gib(limit)} per device: the smallest peak memory any "
        f"layout needs is {_gib(peak)} ({lay}, remat {rs.remat}); what could help: {', '.join(helps)}"
        + (f"; pipelines: {why_not_piped}" if why_not_piped else ""), peak, options)


def _finer(g: Graph, mesh: Mesh, hw: Hardware, kind: str, solver: str, limit: float | None, top: int,
           time_limit: float | None, tie: bool, pricer: Pricer, rs: _RulesSearch, sub: RuleSets,
           best: Solution, optimizer: str, progress: Progress | None, remat: str = "none",
           attention: str = "auto") -> tuple:
    """Solve the layers or ops space, starting from the rules optimum ``best`` (an upper bound)."""
    dims = list(g.dims)
    start = sub.take([best.assign[0]])
    with _reporting(progress, f"{kind} space: building"):
        if kind == "layers":
            # per block: the rule sets the rules search priced (whole-graph roofline bound below its k-th best)
            cands = rs.cands.take(np.nonzero(~np.isnan(rs.cost))[0])
            space = build_space(g, mesh, hw, "layers", tie=tie, rules=cands, pricer=pricer, remat=remat)
            r = cands.index(start)
            assign = tuple(r for _ in space.nodes)
        else:
            space = build_space(g, mesh, hw, "ops", tie=tie, include=start, pricer=pricer, remat=remat)
            assign = _locate(space, start)
        problem = space.problem
        feasible = problem.fits(assign, limit)
        reduced, keep = prune(problem, problem.cost(assign) if feasible else None, limit)
    hint = None
    if feasible:
        hint = tuple(int(np.nonzero(k == s)[0][0]) for k, s in zip(keep, assign, strict=True))
    name = _solver_for(reduced, solver, limit)
    plans = f"the best {top} plans" if top > 1 else "the best plan"
    with _reporting(progress, f"{kind} space: solving for {plans} with {name} "
                              f"({_stats(reduced)['variables']} variables)"):
        sols = _solve(reduced, name, limit, top, time_limit, hint)
    stats = _stats(reduced) | {"unpruned": _stats(problem)}
    rules_plan = _costed_rules("rules optimum", g, mesh, hw, rules_of(sub, best.assign[0], dims, mesh), limit,
                               optimizer, remat, attention, SEARCH_OVERLAP)
    if not sols[0].assign:
        return rules_plan, (), name, False, None, stats
    full = [tuple(int(k[s]) for k, s in zip(keep, sol.assign, strict=True)) for sol in sols]
    costed = [_costed(f"#{i + 1}", g, mesh, hw, space, a, limit, optimizer, remat, attention)
              for i, a in enumerate(full)]
    chosen = costed[0]
    optimal, gap = sols[0].optimal, sols[0].gap
    if (rules_plan.fits or not chosen.fits) and rules_plan.step_s < chosen.step_s * (1 - 1e-12):
        # priced by the cost model itself, the rules optimum is better: keep it (see the module docstring)
        costed.insert(0, rules_plan)
        chosen = rules_plan
    return chosen, tuple(costed[1:top]), name, optimal, gap, stats


def _locate(space: Space, rules: RuleSets) -> tuple[int, ...]:
    """The assignment of the ops space that lays out every op and tensor as ``rules`` does."""
    out = []
    for node in space.nodes:
        if node.kind == "source":
            m = np.zeros(len(space.dims) + 1, bool)
            m[[space.dims.index(d) for d in node.tensor.dim_names]] = True
            want = rules.project(m)[0]
            hit = np.nonzero((node.storage == want).all(axis=1))[0]
        else:
            op = node.op
            t = space.graph.tensors
            mi = np.zeros(len(space.dims) + 1, bool)
            mi[[space.dims.index(d) for d in op.iteration_dims(t)]] = True
            mo = np.zeros(len(space.dims) + 1, bool)
            mo[[space.dims.index(d) for d in t[op.output].dim_names]] = True
            it = rules.project(mi)[0]
            if isinstance(op, O.Reshape):
                it = np.full_like(it, NONE)
            owns = t[op.output].updates is None
            ot = rules.project(mo)[0] if owns else np.where(mo[it], it, NONE)
            hit = np.nonzero((node.iteration == it).all(axis=1) & (node.output == ot).all(axis=1))[0]
        if not len(hit):
            raise AssertionError(f"node {node.name} lacks the projection of the rules plan")  # pragma: no cover
        out.append(int(hit[0]))
    return tuple(out)
