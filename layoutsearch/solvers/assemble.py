"""Assembling cost and memory items into a :class:`~.problem.Problem`.

:mod:`.build` walks a graph and says, per op, tensor and buffer, which *items*
it contributes: an :class:`Item` is a value (seconds, or bytes) that depends on
the strategies of a few nodes. This module collects them (:class:`Items`: items
of tied ops merge under one key, counting their instances), evaluates each once
per distinct combination of its nodes' keys (:func:`evaluate`), sums the items
over the same nodes into one factor, merges memory items of equal value (the
pieces of one shared copy's life, say: one item live wherever any of them is),
and keeps, of the schedule's points, only the memory rows that can be the peak
(:func:`memory_rows`).
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from layoutsearch.solvers.clock import Deadline
from layoutsearch.solvers.problem import Factor, MemItem, MemRow, Problem

Roles = list[tuple[int, np.ndarray]]
"""An item's dependence: (node, the axis map each of its strategies gives the item) per role."""

ValueFn = Callable[[list[np.ndarray]], float]
"""An item's value given, per role, the axis map of the chosen strategy."""

Span = tuple[int, int]
"""Schedule points ``(first, last)`` (inclusive) where a memory item is live."""


@dataclass(frozen=True)
class Item:
    """A cost or memory item: its kind (a label), the nodes it depends on and its value."""
    kind: str
    roles: Roles
    fn: ValueFn


@dataclass(frozen=True)
class Excess:
    """A value function over a few terms, each a function of its own run of roles: the largest of the later
    terms' values above the first's (zero when none is above). :func:`evaluate` computes each term once per
    combination of its own nodes' keys and the table by broadcasting, not once per combination of every node's
    (a recomputation's buffers over a block's ops: ~10^5 combinations where each term has a few)."""

    terms: tuple[tuple[int, ValueFn], ...]
    """(how many roles, the function of their keys), in role order."""

    def __call__(self, a: list[np.ndarray]) -> float:
        vals, k = [], 0
        for n, fn in self.terms:
            vals.append(fn(a[k:k + n]))
            k += n
        return float(max(0.0, max(vals[1:]) - vals[0]))


@dataclass(frozen=True)
class Unary:
    """An evaluated item over one node: its value per strategy of the node."""
    node: int
    values: np.ndarray

    def any(self) -> bool:
        return bool(np.any(self.values))


@dataclass(frozen=True)
class Table:
    """An evaluated item over several nodes: per node, the key index of each strategy, and the values over
    the nodes' distinct keys."""
    nodes: tuple[int, ...]
    keys: list[np.ndarray]
    table: np.ndarray

    def any(self) -> bool:
        return bool(np.any(self.table))


@dataclass
class Pending:
    """Items merged under one key (the instances of one op of tied blocks): how to make the item (once),
    how many instances there are, and where each instance is live (memory items)."""
    make: Callable[[], Item]
    count: int = 0
    spans: list[Span] = field(default_factory=list)


@dataclass
class Items:
    """The cost and memory items of a space, by merge key."""
    cost: dict[tuple, Pending] = field(default_factory=dict)
    memory: dict[tuple, Pending] = field(default_factory=dict)

    def add_cost(self, key: tuple, make: Callable[[], Item]) -> None:
        self._add(self.cost, key, make).count += 1

    def add_memory(self, key: tuple, make: Callable[[], Item], span: Span) -> None:
        pending = self._add(self.memory, key, make)
        pending.count += 1
        pending.spans.append(span)

    @staticmethod
    def _add(store: dict[tuple, Pending], key: tuple, make: Callable[[], Item]) -> Pending:
        if key not in store:
            store[key] = Pending(make)
        return store[key]


@dataclass(frozen=True)
class _Part:
    """One item of a factor: its nodes' key indices, its table, and its memory item (None: a cost)."""
    keys: list[np.ndarray]
    table: np.ndarray
    mem: int | None


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows, index of each row's distinct row); rows of small integers (>= -1). The distinct rows
    come in lexicographic order (``np.unique(rows, axis=0)``'s)."""
    rows = rows.reshape(len(rows), -1)
    if rows.shape[1] == 0 or len(rows) == 0:
        return rows[:1], np.zeros(len(rows), dtype=np.int64)
    base = int(rows.max()) + 2
    if base ** rows.shape[1] < 2**62:
        code = np.zeros(len(rows), dtype=np.int64)
        for col in rows.T:
            code = code * base + (col.astype(np.int64) + 1)
        _, first, inv = np.unique(code, return_index=True, return_inverse=True)
        return rows[first], inv.reshape(-1)
    # Wide rows (an item over many dims): hashing each row's bytes is linear, where np.unique's sort of
    # structured rows cost ~10 ms a call on a 1,500 x 243 table (most of a large search's time).
    packed = np.ascontiguousarray(rows, dtype=np.int16 if base < 2**15 else np.int64)
    index: dict[bytes, int] = {}
    inv = np.fromiter((index.setdefault(r, len(index)) for r in map(bytes, packed)), dtype=np.int64,
                      count=len(rows))
    first = np.empty(len(index), dtype=np.int64)
    first[inv[::-1]] = np.arange(len(rows) - 1, -1, -1)
    distinct = rows[first]
    order = np.lexsort(distinct.T[::-1])
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return distinct[order], rank[inv]


def _zeros(v: float, width: int) -> np.ndarray:
    """A scalar among bound vectors: only a zero (an empty sum) may be one."""
    if v != 0:
        raise ValueError(f"an item mixes seconds ({v}) with bound vectors")
    return np.zeros(width)


def evaluate(item: Item, deadline: Deadline | None = None,
             found: dict[tuple, tuple[np.ndarray, np.ndarray]] | None = None,
             known: dict[bytes, Any] | None = None) -> Unary | Table:
    """An item's values, computed once per distinct combination of the keys its nodes give it (a table over
    several nodes may take long: ``deadline`` is checked as it fills). ``found``: the :func:`unique_rows` of
    the keys met before, by their bytes (the items of one space ask for a few distinct keys many times).
    ``known``: an item over one node, its values met before by its key's bytes (filled in as computed; the
    spaces one pricer builds for several sets of candidates ask again for most of the same keys)."""
    roles, fn = item.roles, item.fn
    found = {} if found is None else found
    nodes = sorted({n for n, _ in roles})
    uniq, inv = [], []
    for n in nodes:
        keys = np.concatenate([rows for m, rows in roles if m == n], axis=1)
        at = (keys.shape, keys.dtype.str, keys.tobytes())
        if at not in found:
            found[at] = unique_rows(keys)
        u, i = found[at]
        uniq.append(u)
        inv.append(i)
    cols: list[tuple[int, int, int]] = []  # per role: (node position, first column in its keys, width)
    offset = [0] * len(nodes)
    for n, rows in roles:
        j = nodes.index(n)
        cols.append((j, offset[j], rows.shape[1]))
        offset[j] += rows.shape[1]

    def call(picked: Sequence[np.ndarray]) -> float:
        return fn([picked[j][c:c + w] for j, c, w in cols])

    if len(nodes) == 1:  # (values may be vectors: bounds, see Pricer.bound; a zero may be a scalar)
        if known is None:
            got = [call([row]) for row in uniq[0]]
        else:
            got = []
            for row in uniq[0]:
                at = row.tobytes()
                if at not in known:
                    known[at] = call([row])
                got.append(known[at])
        vectors = [v for v in got if isinstance(v, np.ndarray)]
        if vectors:
            got = [v if isinstance(v, np.ndarray) else _zeros(v, len(vectors[0])) for v in got]
        vals = np.array(got, dtype=float)
        return Unary(nodes[0], vals[inv[0]])
    if isinstance(fn, Excess):
        return Table(tuple(nodes), inv, _excess_table(fn, cols, uniq, deadline))
    table = np.empty([len(u) for u in uniq])
    for n, idx in enumerate(itertools.product(*(range(len(u)) for u in uniq))):
        if deadline is not None and n % 4096 == 4095:
            deadline.check()
        table[idx] = call([u[i] for u, i in zip(uniq, idx, strict=True)])
    return Table(tuple(nodes), inv, table)


def _excess_table(fn: Excess, cols: list[tuple[int, int, int]], uniq: list[np.ndarray],
                  deadline: Deadline | None) -> np.ndarray:
    """The table of an :class:`Excess` over the nodes whose distinct keys are ``uniq`` (``cols``: per role, its
    node's position, first column and width), each term evaluated over its own nodes and broadcast."""
    shape = [len(u) for u in uniq]
    tables, k = [], 0
    for count, term in fn.terms:
        mine = cols[k:k + count]
        k += count
        own = sorted({j for j, _, _ in mine})
        t = np.empty([shape[j] for j in own])
        for idx in itertools.product(*(range(shape[j]) for j in own)):
            pick = dict(zip(own, idx, strict=True))
            t[idx] = term([uniq[j][pick[j]][c:c + w] for j, c, w in mine])
        if deadline is not None:
            deadline.check()
        tables.append(t.reshape([shape[j] if j in own else 1 for j in range(len(shape))]))
    return np.maximum(0.0, functools.reduce(np.maximum, tables[1:]) - tables[0])


def assemble(names: list[str], sizes: list[int], items: Items, points: list[str], classes: list[Any],
             deadline: Deadline, known: dict[str, dict[tuple, dict[bytes, Any]]] | None = None) -> Problem:
    """The :class:`Problem` over nodes ``names`` (``sizes`` strategies each) of ``items``: unary costs per
    node, one factor per set of nodes, memory items and the memory rows over the schedule ``points``
    (``classes``: see :func:`memory_rows`). ``known``: for ``"cost"`` and ``"memory"``, per item's merge key,
    its values met before (:func:`evaluate`): items of equal key must have equal values in every space built
    with it (see :meth:`.build._Builder.known`)."""
    unary = [np.zeros(size) for size in sizes]
    groups: dict[tuple[int, ...], list[_Part]] = defaultdict(list)
    found: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # (the keys' distinct rows, shared by the items)
    def values(section: str, key: tuple, pending: Pending) -> Unary | Table:
        mine = None if known is None else known[section].setdefault(key, {})
        return evaluate(pending.make(), deadline, found, mine)

    for k, (key, pending) in enumerate(items.cost.items()):
        if k % 64 == 0:
            deadline.check()
        value = values("cost", key, pending)
        if isinstance(value, Unary):
            add, u = pending.count * value.values, unary[value.node]
            if add.ndim != u.ndim:  # bound vectors (Pricer.bound) beside scalars
                add, u = add.reshape(len(add), -1), u.reshape(len(u), -1)
            unary[value.node] = u + add
        else:
            groups[value.nodes].append(_Part(value.keys, value.table * pending.count, None))
    mems: list[MemItem | None] = []
    spans: list[list[Span]] = []
    same: dict[tuple, int] = {}  # items of equal value are one item live wherever either is
    for k, (key, pending) in enumerate(items.memory.items()):
        if k % 64 == 0:
            deadline.check()
        value = values("memory", key, pending)
        if not value.any():
            continue
        sig = _signature(value)
        if sig in same:
            spans[same[sig]] = spans[same[sig]] + pending.spans
            continue
        same[sig] = len(spans)
        spans.append(pending.spans)
        if isinstance(value, Unary):
            mems.append(MemItem(value.node, None, value.values))
        else:
            mems.append(None)
            groups[value.nodes].append(_Part(value.keys, value.table, len(mems) - 1))
    factors = _factors(groups, mems)
    rows = memory_rows(spans, len(points), points, classes)
    return Problem(names, unary, factors, mems, rows)


def undominated(points: np.ndarray, chunk: int = 256, budget: int = 1 << 24) -> np.ndarray:
    """Indices, in decreasing order of row sum, of the rows of ``points`` (distinct rows of nonnegative
    numbers) that no other row is at least in every column: with nonnegative weights, the largest weighted
    sum is always on one of them.

    A row can only be dominated by a row of larger sum (distinct rows of equal sum do not dominate each
    other), and a row dominated by any earlier row is dominated by a kept one (dominance is transitive); so,
    in order of decreasing sum, a chunk at a time, a row is kept unless a kept row or an earlier row of its
    chunk dominates it. Comparisons run on at most about ``budget`` elements at once."""
    order = np.argsort(-points.sum(axis=1), kind="stable")
    width = max(points.shape[1], 1)
    chunk = max(1, min(chunk, int(budget ** 0.5 / width ** 0.5)))
    kept = np.zeros(0, dtype=np.int64)
    earlier = np.tri(chunk, k=-1, dtype=bool).T  # earlier[j, i]: row j comes before row i in the chunk
    for c in range(0, len(order), chunk):
        idx = order[c:c + chunk]
        block = points[idx]
        alive = np.ones(len(idx), bool)
        step = max(1, budget // (len(idx) * width))
        for k in range(0, len(kept), step):
            over = points[kept[k:k + step]]
            alive &= ~np.any(np.all(over[:, None, :] >= block[None, :, :], axis=2), axis=0)
        idx, block = idx[alive], block[alive]
        n = len(idx)
        above = np.all(block[:, None, :] >= block[None, :, :], axis=2) & earlier[:n, :n]
        kept = np.concatenate([kept, idx[~above.any(axis=0)]])
    return kept


def _signature(value: Unary | Table) -> tuple:
    """What an evaluated memory item contributes, as a key: equal keys, equal bytes under every plan."""
    if isinstance(value, Unary):
        return ("unary", value.node, value.values.shape, value.values.tobytes())
    return ("table", value.nodes, tuple(k.tobytes() for k in value.keys), value.table.shape, value.table.tobytes())


def _factors(groups: dict[tuple[int, ...], list[_Part]], mems: list[MemItem | None]) -> list[Factor]:
    """One factor per set of nodes, over the distinct combinations of its items' keys: the summed costs, and
    each memory item over it (placed into ``mems``)."""
    factors: list[Factor] = []
    for nodes, parts in sorted(groups.items(), key=lambda kv: kv[0]):
        comp = [unique_rows(np.stack([p.keys[j] for p in parts], axis=1)) for j in range(len(nodes))]
        cost = np.zeros([len(c) for c, _ in comp])
        on_factor = []
        for k, part in enumerate(parts):
            sub = part.table[np.ix_(*(c[:, k] for c, _ in comp))]
            if part.mem is None:
                cost += sub
            else:
                on_factor.append((part.mem, sub))
        if not on_factor and not cost.any():
            continue
        for mem, sub in on_factor:
            mems[mem] = MemItem(None, len(factors), sub)
        factors.append(Factor(nodes, tuple(inv.astype(np.int64) for _, inv in comp), cost))
    return factors


def memory_rows(spans: list[list[Span]], n_points: int, points: list[str], classes: list[Any]) -> list[MemRow]:
    """The memory rows: per schedule point, the live instances of each item; only the rows that can be the
    peak are kept.

    Exact reductions: identical rows once; of the points of one class (``classes``: any grouping, e.g. the
    instances of one op in repeated blocks; taken in schedule order), in each run of points whose rows grow
    by the same vector from one to the next, only the first and the last (memory there is affine in the
    position in the run, so its maximum is at an end); rows another row dominates (counts no smaller
    everywhere) dropped."""
    if not spans or n_points == 0:
        return []
    diff = np.zeros((n_points + 1, len(spans)), dtype=np.int32)
    for c, sp in enumerate(spans):
        a = np.array(sp, dtype=np.int64).reshape(-1, 2)
        np.add.at(diff[:, c], a[:, 0], 1)
        np.add.at(diff[:, c], a[:, 1] + 1, -1)
    counts = np.cumsum(diff[:-1], axis=0, dtype=np.int32)
    by_class: dict[Any, list[int]] = defaultdict(list)
    for p, c in enumerate(classes):
        by_class[c].append(p)
    candidates: list[int] = []
    for ps in by_class.values():
        if len(ps) <= 2:
            candidates += ps
            continue
        steps = np.diff(counts[ps], axis=0)
        start = 0  # runs of equal steps: affine, so only their ends can be the peak
        for k in range(1, len(steps) + 1):
            if k == len(steps) or not np.array_equal(steps[k], steps[start]):
                candidates += [ps[start], ps[k]]
                start = k
    seen: dict[bytes, int] = {}
    for p in sorted(candidates):
        seen.setdefault(counts[p].tobytes(), p)
    cand = np.array(sorted(seen.values()), dtype=np.int64)
    out = []
    for p in sorted(cand[undominated(counts[cand])].tolist()):
        row = counts[p]
        out.append(MemRow(0.0, tuple((int(c), int(row[c])) for c in np.nonzero(row)[0]), points[p]))
    return out


__all__ = ["Item", "Items", "Pending", "Roles", "Span", "Table", "Unary", "ValueFn", "assemble", "evaluate",
           "memory_rows", "undominated", "unique_rows"]
