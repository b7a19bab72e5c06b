"""Dynamic programming over a chain of nodes (layers), exact.

Problem: a :class:`~.problem.Problem` whose interaction graph is a *chain
with a hub*: after removing at most one node (the hub: e.g. everything
outside the repeated layers, which talks to the first and the last layer),
every node interacts only with its predecessor and successor (e.g. layer
``i`` reshards its input from layer ``i-1``).

Algorithm: for each strategy of the hub, Viterbi over the chain (Viterbi
1967; the layer-by-layer DP of Tarnawski et al. 2020, "Efficient algorithms
for device placement of DNN graph operators", NeurIPS, and of Alpa's stage
DP): ``best[i][s] = unary[i][s] + hub(i, s) + min_t (best[i-1][t] +
edge(i-1, i)[t, s])``. Time ``O(K_hub * sum_i K_(i-1) K_i)``. The ``top`` best
plans: each state keeps its ``top`` best partial plans (k-best Viterbi).

With a memory limit, a partial plan also carries the partial sum of every
memory row (each row is a sum of nonnegative per-node and per-edge terms, so
a partial sum over the limit can be dropped), and each state keeps the
partial plans no ``top`` others dominate (lower or equal cost *and* every
row); exact, with more states kept the tighter the rows.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from layoutsearch.errors import LayoutSearchError
from layoutsearch.solvers.problem import OPTIMAL, Problem, Solution, infeasible, solution


def chain_order(problem: Problem) -> tuple[int | None, list[int]] | None:
    """(hub, the other nodes in chain order) when the problem is a chain with at most one hub, else None."""
    nbrs = problem.neighbors()
    n = len(nbrs)
    for hub in [None, *sorted(range(n), key=lambda k: -len(nbrs[k]))]:
        order = _linear(nbrs, hub)
        if order is not None:
            return hub, order
    return None


def _linear(nbrs: list[set[int]], hub: int | None) -> list[int] | None:
    rest = [k for k in range(len(nbrs)) if k != hub]
    adj = {k: nbrs[k] - {hub} for k in rest}
    if any(len(a) > 2 for a in adj.values()):
        return None
    seen: set[int] = set()
    order: list[int] = []
    for start in rest:  # walk each path from an end (isolated nodes are paths of one node)
        if start in seen or len(adj[start]) == 2:
            continue
        prev, cur = None, start
        while cur is not None:
            seen.add(cur)
            order.append(cur)
            nxt = [m for m in adj[cur] if m != prev]
            prev, cur = cur, (nxt[0] if nxt else None)
            if cur in seen:
                return None
    return order if len(seen) == len(rest) else None  # nodes left over lie on cycles


def _edge_matrix(problem: Problem, a: int, b: int) -> np.ndarray:
    """Cost of every strategy pair (rows: node a, columns: node b) summed over their edges."""
    out = np.zeros((len(problem.unary[a]), len(problem.unary[b])))
    for f in problem.factors:
        if f.nodes == (a, b):
            out += f.full()
        elif f.nodes == (b, a):
            out += f.full().T
    return out


def solve(problem: Problem, memory_limit: float | None = None, top: int = 1) -> list[Solution]:
    """The ``top`` best assignments that fit ``memory_limit``; LayoutSearchError if the problem is not a chain
    (see :func:`chain_order`)."""
    t0 = time.perf_counter()
    shape = chain_order(problem) if all(len(f.nodes) == 2 for f in problem.factors) else None
    if shape is None:
        raise LayoutSearchError("the DP solver needs a chain of layers (each interacting with its neighbours and "
                                "at most one other node); use solver 'ilp-ortools' or 'ilp-pulp'")
    hub, order = shape
    rows = problem.mem_rows if memory_limit is not None else []
    if not rows:
        found = _viterbi(problem, hub, order, top)
    else:
        found = _labels(problem, hub, order, top, memory_limit)
    seconds = time.perf_counter() - t0
    if not found:
        from layoutsearch.solvers import ilp

        peak = ilp.solve(problem, memory_limit=-1.0, backend="ortools")[0].min_memory
        return [infeasible("dp", seconds, peak)]
    found.sort(key=lambda ca: ca[0])
    sols = [solution(problem, a, OPTIMAL, "dp", seconds) for _, a in found[:top]]
    return sorted(sols, key=lambda s: s.cost)


def _hub_terms(problem: Problem, hub: int | None, order: list[int], h: int) -> list[np.ndarray]:
    """Unary costs of the chain nodes with the hub fixed to strategy ``h``."""
    out = []
    for k in order:
        u = problem.unary[k].astype(float).copy()
        if hub is not None:
            u += _edge_matrix(problem, hub, k)[h]
        out.append(u)
    return out


def _viterbi(problem: Problem, hub: int | None, order: list[int], top: int) -> list[tuple[float, tuple[int, ...]]]:
    trans = [_edge_matrix(problem, a, b) for a, b in itertools.pairwise(order)]
    found: list[tuple[float, tuple[int, ...]]] = []
    hubs = range(len(problem.unary[hub])) if hub is not None else [None]
    for h in hubs:
        base = problem.const + (float(problem.unary[hub][h]) if hub is not None else 0.0)
        un = _hub_terms(problem, hub, order, h or 0)
        if not order:
            found.append((base, (h,)))
            continue
        # best[s, r]: r-th best cost of a partial plan ending in s; back[i][s, r] = (prev state, prev rank)
        best = np.full((len(un[0]), top), np.inf)
        best[:, 0] = un[0]
        backs = []
        for i in range(1, len(order)):
            K_prev, K = best.shape[0], len(un[i])
            cand = (best[:, :, None] + trans[i - 1][:, None, :]).reshape(K_prev * top, K)
            k = min(top, K_prev * top)
            idx = np.argsort(cand, axis=0, kind="stable")[:k]
            nb = np.full((K, top), np.inf)
            nb[:, :k] = np.take_along_axis(cand, idx, axis=0).T + un[i][:, None]
            backs.append(idx.T)  # [K, k] flat index into (prev state, prev rank)
            best = nb
        flat = np.argsort(best.reshape(-1), kind="stable")[:top]
        for f in flat:
            s, r = divmod(int(f), top)
            c = float(best[s, r])
            if not np.isfinite(c):
                continue
            states = [s]
            for i in range(len(order) - 1, 0, -1):
                ps, pr = divmod(int(backs[i - 1][s, r]), top)
                states.append(ps)
                s, r = ps, pr
            assign = [0] * len(problem.unary)
            for k, st in zip(order, reversed(states), strict=True):
                assign[k] = st
            if hub is not None:
                assign[hub] = h
            found.append((base + c, tuple(assign)))
    return found


def _labels(problem: Problem, hub: int | None, order: list[int], top: int,
            limit: float) -> list[tuple[float, tuple[int, ...]]]:
    """Exact DP under memory rows: Pareto sets of (cost, partial row sums) per state, along the chain
    ``order`` for each strategy of the ``hub`` node (None: a plain chain)."""
    rows = _RowTerms(problem)
    trans = [_edge_matrix(problem, a, b) for a, b in itertools.pairwise(order)]
    chain_pairs = [rows.pair(a, b) for a, b in itertools.pairwise(order)]
    tol = limit * 1e-12
    found: list[tuple[float, tuple[int, ...]]] = []
    for h in (range(len(problem.unary[hub])) if hub is not None else [None]):
        base = problem.const + (float(problem.unary[hub][h]) if hub is not None else 0.0)
        base_rows = rows.consts + (rows.node[hub][h] if hub is not None else 0.0)
        if not order:
            if (base_rows <= limit + tol).all():
                found.append((base, (h,)))
            continue
        un = _hub_terms(problem, hub, order, h or 0)
        add_rows = [rows.with_hub(k, hub, h) for k in order]
        # per state: label costs [L], partial row sums [L, R], back pointers [L, 2] (prev state, prev label)
        first = [(np.array([base + float(un[0][s])]), (base_rows + add_rows[0][s])[None, :],
                  np.full((1, 2), -1, dtype=np.int64)) for s in range(len(un[0]))]
        history = [[_pareto(*lab, limit + tol, top) for lab in first]]
        for i in range(1, len(order)):
            history.append(_step(history[-1], un[i], trans[i - 1], add_rows[i], chain_pairs[i - 1], len(rows.consts),
                                 limit + tol, top))
        finals = sorted((float(c), s, j) for s, (cs, _, _) in enumerate(history[-1]) for j, c in enumerate(cs))[:top]
        for c, s, j in finals:
            assign = _backtrack(history, order, s, j, len(problem.unary))
            if hub is not None:
                assign[hub] = h
            found.append((c, tuple(assign)))
    return found


class _RowTerms:
    """What each node's and each pair's strategies add to every memory row (bytes times the item's count)."""

    def __init__(self, problem: Problem) -> None:
        R = len(problem.mem_rows)
        counts = np.zeros((len(problem.mem_items), R))
        for r, row in enumerate(problem.mem_rows):
            for i, c in row.items:
                counts[i, r] += c
        self.consts = np.array([row.const for row in problem.mem_rows])
        self.node = [np.zeros((len(u), R)) for u in problem.unary]
        self.pairs: list[tuple[int, int, np.ndarray]] = []  # (a, b, [K_a, K_b, R])
        for i, it in enumerate(problem.mem_items):
            if not counts[i].any():
                continue
            if it.factor is None:
                self.node[it.node] += it.bytes[:, None] * counts[i][None, :]
            else:
                f = problem.factors[it.factor]
                self.pairs.append((*f.nodes, f.full(it.bytes)[:, :, None] * counts[i][None, None, :]))

    def pair(self, a: int, b: int) -> np.ndarray | None:
        """The rows of the factors over nodes ``a`` and ``b``, as ``[K_a, K_b, R]`` (None: there are none)."""
        out = None
        for u, v, arr in self.pairs:
            if (u, v) == (a, b):
                out = arr if out is None else out + arr
            elif (u, v) == (b, a):
                out = arr.transpose(1, 0, 2) if out is None else out + arr.transpose(1, 0, 2)
        return out

    def with_hub(self, k: int, hub: int | None, h: int | None) -> np.ndarray:
        """Node ``k``'s rows per strategy, with those of its factor with the hub at strategy ``h``."""
        extra = self.node[k].copy()
        if hub is not None:
            pr = self.pair(hub, k)
            if pr is not None:
                extra += pr[h]
        return extra


_Label = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A state's Pareto labels: costs [L], partial row sums [L, R], back pointers [L, 2]."""


def _step(labels: list[_Label], un: np.ndarray, trans: np.ndarray, add_rows: np.ndarray, pairs: np.ndarray | None,
          R: int, limit: float, top: int) -> list[_Label]:
    """The labels of the next node's states from the current node's ``labels``."""
    new = []
    for s in range(len(un)):
        cs, rs, bs = [], [], []
        for t, (c, rw, _) in enumerate(labels):
            if not len(c):
                continue
            extra = add_rows[s] + (pairs[t, s] if pairs is not None else 0.0)
            cs.append(c + float(trans[t, s]) + float(un[s]))
            rs.append(rw + extra)
            bs.append(np.stack([np.full(len(c), t), np.arange(len(c))], axis=1))
        if cs:
            new.append(_pareto(np.concatenate(cs), np.concatenate(rs), np.concatenate(bs), limit, top))
        else:
            new.append((np.zeros(0), np.zeros((0, R)), np.zeros((0, 2), dtype=np.int64)))
    return new


def _backtrack(history: list[list[_Label]], order: list[int], s: int, j: int, n_nodes: int) -> list[int]:
    """The assignment of the chain ``order`` whose last node's label ``j`` in state ``s`` ends."""
    states = []
    for i in range(len(order) - 1, -1, -1):
        states.append(s)
        t, k = history[i][s][2][j]
        s, j = int(t), int(k)
    assign = [0] * n_nodes
    for k, st in zip(order, reversed(states), strict=True):
        assign[k] = st
    return assign


def _pareto(cost: np.ndarray, rows: np.ndarray, back: np.ndarray, limit: float,
            top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The labels within the limit that fewer than ``top`` others dominate (cost and every row no larger),
    cheapest first."""
    ok = (rows <= limit).all(axis=1)
    cost, rows, back = cost[ok], rows[ok], back[ok]
    order = np.lexsort((rows.sum(axis=1), cost))
    cost, rows, back = cost[order], rows[order], back[order]
    keep: list[int] = []
    for k in range(len(cost)):
        if keep:
            dom = (rows[keep] <= rows[k]).all(axis=1).sum()
            if dom >= top:
                continue
        keep.append(k)
    return cost[keep], rows[keep], back[keep]
