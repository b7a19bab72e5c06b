"""The strategy-selection problem every solver works on (a pairwise cost network with memory rows).

Problem
-------
Nodes ``n = 0..N-1`` each pick one strategy ``s_n`` from ``0..K_n-1``. Costs:

* a unary cost ``unary[n][s_n]`` (seconds);
* costs of *factors* over two nodes (edges) or more: each node's strategies
  map to *keys* (the projection of the strategy the interaction depends on,
  e.g. the layout of the tensor crossing the edge) and the factor costs
  ``cost[key_0(s_0), key_1(s_1), ...]``. A factor over more than two nodes
  prices a collective that several consumers of one tensor share (XLA
  computes the same reshard once).

The objective is ``const + sum unary + sum factor costs``. The memory per device
is the maximum over *memory rows* (one per point of the schedule, after
dropping rows that another row dominates): a row is ``const`` plus, for each
memory item it counts, ``count * bytes`` where an item's bytes depend on one
node's strategy (``bytes[s_n]``) or on a factor's keys.
With a memory limit ``L`` every row must be ``<= L``.

This is the formulation of Alpa's intra-operator pass (Zheng et al. 2022,
"Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed Deep
Learning", OSDI, section 4.2: one-hot strategies, resharding costs on edges)
with the memory limit as hard constraints over the tensors live at each point
of the schedule. It is NP-hard in general (it contains MAX-CUT); exact solvers:
:mod:`enumerate` (the oracle, ``prod K_n`` assignments), :mod:`ilp` (one MILP,
PuLP/CBC or OR-tools) and :mod:`dp` (Viterbi when the nodes form a chain).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

INFEASIBLE = "infeasible"
OPTIMAL = "optimal"
FEASIBLE = "feasible"
"""Solution statuses: proven optimal, feasible (time ran out first), or no assignment fits."""


@dataclass(frozen=True)
class Factor:
    """A cost shared by several nodes: ``cost[keys[0][s_0], keys[1][s_1], ...]`` for the strategies
    ``s_j`` of ``nodes[j]`` (distinct, increasing); two nodes make an edge."""

    nodes: tuple[int, ...]
    keys: tuple[np.ndarray, ...]
    cost: np.ndarray

    def index(self, assign: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(k[assign[n]]) for n, k in zip(self.nodes, self.keys, strict=True))

    def value(self, assign: Sequence[int]) -> float:
        return float(self.cost[self.index(assign)])

    def full(self, arr: np.ndarray | None = None) -> np.ndarray:
        """``arr`` (default: the cost) indexed by strategies instead of keys: shape ``(K_n for n in nodes)``."""
        a = self.cost if arr is None else arr
        return a[np.ix_(*self.keys)]


@dataclass(frozen=True)
class MemItem:
    """Bytes per device that depend on one node's strategy (``factor is None``:
    ``bytes[s_node]``) or on a factor's keys (``bytes[key_0, key_1, ...]``)."""

    node: int | None
    factor: int | None
    bytes: np.ndarray


@dataclass(frozen=True)
class MemRow:
    """Memory at one point of the schedule: ``const + sum count * item bytes``."""

    const: float
    items: tuple[tuple[int, int], ...]  # (item index, count)
    point: str = ""


@dataclass
class Problem:
    """Nodes with strategies, unary and factor costs, memory rows (see the module docstring)."""

    names: list[str]
    unary: list[np.ndarray]
    factors: list[Factor] = field(default_factory=list)
    mem_items: list[MemItem] = field(default_factory=list)
    mem_rows: list[MemRow] = field(default_factory=list)
    const: float = 0.0

    @property
    def sizes(self) -> list[int]:
        return [len(u) for u in self.unary]

    @property
    def num_assignments(self) -> int:
        return math.prod(self.sizes)

    def cost(self, assign: Sequence[int]) -> float:
        """The objective of a full assignment (one strategy index per node)."""
        total = self.const + sum(float(u[s]) for u, s in zip(self.unary, assign, strict=True))
        return total + sum(f.value(assign) for f in self.factors)

    def item_bytes(self, i: int, assign: Sequence[int]) -> float:
        it = self.mem_items[i]
        if it.factor is None:
            return float(it.bytes[assign[it.node]])
        return float(it.bytes[self.factors[it.factor].index(assign)])

    def rows(self, assign: Sequence[int]) -> np.ndarray:
        """Memory of every row under ``assign``."""
        vals = [self.item_bytes(i, assign) for i in range(len(self.mem_items))]
        return np.array([r.const + sum(c * vals[i] for i, c in r.items) for r in self.mem_rows], dtype=float)

    def memory(self, assign: Sequence[int]) -> float:
        """Peak memory per device (bytes) under ``assign``; 0 without rows."""
        rows = self.rows(assign)
        return float(rows.max()) if len(rows) else 0.0

    def fits(self, assign: Sequence[int], limit: float | None) -> bool:
        return limit is None or self.memory(assign) <= limit * (1 + 1e-12)

    def neighbors(self) -> list[set[int]]:
        """Nodes sharing a factor with each node."""
        out: list[set[int]] = [set() for _ in self.unary]
        for f in self.factors:
            for n in f.nodes:
                out[n].update(m for m in f.nodes if m != n)
        return out


@dataclass(frozen=True)
class Solution:
    """One assignment found by a solver.

    ``status``: :data:`OPTIMAL` (proven), :data:`FEASIBLE` (a time limit ran
    out first; ``bound`` is the best proven lower bound and ``gap`` the
    relative gap ``(cost - bound) / cost``) or :data:`INFEASIBLE` (no
    assignment fits the memory limit; ``assign`` is empty and ``min_memory``
    holds the smallest peak memory of any assignment, when known).
    """

    assign: tuple[int, ...]
    cost: float
    memory: float
    status: str
    solver: str
    seconds: float = 0.0
    bound: float | None = None
    min_memory: float | None = None

    @property
    def optimal(self) -> bool:
        return self.status == OPTIMAL

    @property
    def gap(self) -> float | None:
        if self.status == OPTIMAL:
            return 0.0
        if self.bound is None or self.status == INFEASIBLE:
            return None
        return max(0.0, (self.cost - self.bound) / self.cost) if self.cost > 0 else 0.0


def solution(problem: Problem, assign: Sequence[int], status: str, solver: str, seconds: float = 0.0,
             bound: float | None = None) -> Solution:
    """A :class:`Solution` with its cost and memory evaluated exactly on ``problem``."""
    a = tuple(int(s) for s in assign)
    return Solution(a, problem.cost(a), problem.memory(a), status, solver, seconds, bound)


def infeasible(solver: str, seconds: float, min_memory: float | None) -> Solution:
    return Solution((), math.inf, math.inf, INFEASIBLE, solver, seconds, None, min_memory)


def restrict(problem: Problem, keep: Sequence[np.ndarray]) -> Problem:
    """The problem with node ``n`` limited to strategies ``keep[n]`` (indices into its strategies); unused
    keys are dropped, and factors whose cost depends on one node only are folded into it."""
    unary = [u[k] for u, k in zip(problem.unary, keep, strict=True)]
    items: list[MemItem | None] = [MemItem(it.node, None, it.bytes[keep[it.node]]) if it.factor is None else None
                                   for it in problem.mem_items]
    on: dict[int, list[int]] = {}
    for i, it in enumerate(problem.mem_items):
        if it.factor is not None:
            on.setdefault(it.factor, []).append(i)
    factors: list[Factor] = []
    for fi, f in enumerate(problem.factors):
        used, inv = [], []
        for n, k in zip(f.nodes, f.keys, strict=True):
            a, i = np.unique(k[keep[n]], return_inverse=True)
            used.append(a)
            inv.append(i.reshape(-1))
        cost = f.cost[np.ix_(*used)]
        live = [j for j, a in enumerate(used) if len(a) > 1]
        if len(live) <= 1:  # depends on one node (or none): fold into it
            j = live[0] if live else 0
            n, idx = f.nodes[j], inv[j]
            unary[n] = unary[n] + cost.reshape(-1)[idx]
            for i in on.get(fi, []):
                items[i] = MemItem(n, None, problem.mem_items[i].bytes[np.ix_(*used)].reshape(-1)[idx])
            continue
        if len(live) < len(used):  # drop nodes with one key left
            sq = tuple(j for j in range(len(used)) if j not in live)
            cost = cost.squeeze(axis=sq)
        nodes = tuple(f.nodes[j] for j in live)
        for i in on.get(fi, []):
            b = problem.mem_items[i].bytes[np.ix_(*used)]
            if len(live) < len(used):
                b = b.squeeze(axis=tuple(j for j in range(len(used)) if j not in live))
            items[i] = MemItem(None, len(factors), b)
        factors.append(Factor(nodes, tuple(inv[j] for j in live), cost))
    return Problem(list(problem.names), unary, factors, items, list(problem.mem_rows), problem.const)


def lower_bound_terms(problem: Problem) -> tuple[float, list[np.ndarray]]:
    """A lower bound of the objective, and per node the bound when that node takes each strategy
    (every other term at its minimum; factor terms of the node at their minimum over the other nodes)."""
    base = problem.const + sum(float(u.min()) for u in problem.unary)
    per = [u - u.min() for u in problem.unary]
    for f in problem.factors:
        lo = float(f.cost.min())
        base += lo
        for j, (n, k) in enumerate(zip(f.nodes, f.keys, strict=True)):
            other = tuple(a for a in range(f.cost.ndim) if a != j)
            per[n] = per[n] + (f.cost.min(axis=other)[k] - lo)
    return base, [base + p for p in per]


def prune(problem: Problem, upper: float | None, limit: float | None = None,
          rel: float = 1e-9) -> tuple[Problem, list[np.ndarray]]:
    """Drop strategies that cannot be in any assignment costing at most ``upper`` (the cost of a known
    assignment within ``limit``; None: no cost bound) or fitting ``limit``: bound-based fixing, exact.
    Returns the reduced problem and, per node, the original indices of the strategies kept."""
    keep = [np.arange(len(u)) for u in problem.unary]
    cur = problem
    tol = abs(upper or 0.0) * rel + 1e-300
    for _ in range(8):
        _, per = lower_bound_terms(cur)
        sel = [np.nonzero(p <= upper + tol)[0] if upper is not None else np.arange(len(p)) for p in per]
        if limit is not None:
            fits = prune_memory(cur, limit)
            sel = [np.intersect1d(a, b) for a, b in zip(sel, fits, strict=True)]
        if all(len(s) == len(p) for s, p in zip(sel, per, strict=True)) or any(len(s) == 0 for s in sel):
            break
        keep = [k[s] for k, s in zip(keep, sel, strict=True)]
        cur = restrict(cur, sel)
    return cur, keep


def _item_projections(problem: Problem) -> list[tuple[float, list[tuple[int, np.ndarray]]]]:
    """Per memory item: its smallest bytes, and for each node it depends on, the smallest bytes with that node
    at each strategy minus the smallest overall."""
    out = []
    for it in problem.mem_items:
        if it.factor is None:
            lo = float(it.bytes.min())
            out.append((lo, [(it.node, it.bytes - lo)]))
            continue
        f = problem.factors[it.factor]
        lo = float(it.bytes.min())
        per = []
        for j, (n, k) in enumerate(zip(f.nodes, f.keys, strict=True)):
            other = tuple(a for a in range(it.bytes.ndim) if a != j)
            per.append((n, it.bytes.min(axis=other)[k] - lo))
        out.append((lo, per))
    return out


def prune_memory(problem: Problem, limit: float) -> list[np.ndarray]:
    """Per node, the strategies that some assignment within ``limit`` may take: a strategy is dropped when a
    memory row exceeds the limit even with every other term at its smallest (exact)."""
    keep = [np.ones(k, bool) for k in problem.sizes]
    if not problem.mem_rows:
        return [np.nonzero(k)[0] for k in keep]
    proj = _item_projections(problem)
    counts = np.zeros((len(problem.mem_rows), len(problem.mem_items)))
    for r, row in enumerate(problem.mem_rows):
        for i, c in row.items:
            counts[r, i] += c
    lows = np.array([lo for lo, _ in proj])
    row_min = np.array([r.const for r in problem.mem_rows]) + counts @ lows
    touching: dict[int, list[tuple[int, np.ndarray]]] = {}
    for i, (_, per) in enumerate(proj):
        for n, d in per:
            touching.setdefault(n, []).append((i, d))
    for n, items in touching.items():
        idx = [i for i, _ in items]
        D = np.stack([d for _, d in items])  # items x strategies
        lb = row_min[:, None] + counts[:, idx] @ D
        keep[n] &= (lb <= limit * (1 + 1e-12)).all(axis=0)
    return [np.nonzero(k)[0] for k in keep]
