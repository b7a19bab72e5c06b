"""The candidates of the global-rules space: rule sets as arrays (:class:`RuleSets`).

A rule set gives each mesh axis a *primary* choice (a dim, a group of dims no
op or tensor has two of, or nothing) and up to two *fallbacks* (Flax rule
precedence): a parameter dim on axes that split activations (ZeRO/FSDP,
hybrid FSDP) and an activation dim on the axes of a parameter choice
(sequence parallelism). :func:`rule_sets` enumerates every divisible
candidate of a graph on a mesh (the ``rules`` space of :mod:`.space`),
:func:`rule_set` makes one, :func:`rules_of` turns one into ``(dim, axes)``
rules and :func:`model_groups` finds the groups of dims that may share an axis.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from layoutsearch.costmodel.step import graph_cached
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Axes
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.solvers.assemble import unique_rows
from layoutsearch.solvers.axismaps import NONE, choice_maps


@dataclass(frozen=True)
class _Maps:
    """Candidates' axis maps for several sets of dims (``masks``, masks x dims) side by side: ``maps`` (rows x
    (masks x axes)), ``cols`` (a mask's dims' indices, as bytes -> its first column), ``rows`` (which rows of
    ``maps`` are the candidates': None for all)."""

    cols: dict[bytes, int]
    maps: np.ndarray
    rows: np.ndarray | None
    masks: np.ndarray

    @staticmethod
    def of(masks: np.ndarray, packed: np.ndarray, axes: int) -> _Maps:
        return _Maps({np.flatnonzero(m).tobytes(): k * axes for k, m in enumerate(masks)}, packed, None, masks)


def _space_masks(graph: Graph) -> np.ndarray:
    """The sets of dims (masks x dims) of ``graph``'s tensors and ops' iterations: what tells layouts apart."""
    def compute() -> np.ndarray:
        dims = list(graph.dims)
        spaces = {frozenset(t.dim_names) for t in graph.tensors.values()}
        spaces |= {frozenset(op.iteration_dims(graph.tensors)) for op in graph.ops}
        masks = [np.isin(np.arange(len(dims)), [dims.index(d) for d in sp]) for sp in spaces]
        return np.array(masks, dtype=bool).reshape(len(masks), len(dims))
    return graph_cached(graph, "space masks", compute)


@dataclass(frozen=True)
class RuleSets:
    """Candidates of the global-rules space, as arrays.

    ``primary[r, a]``: the *choice* of mesh axis ``a`` (NONE: splits
    nothing); choice ``c`` splits the dims ``choices[c]``: one dim, or a
    *group* of dims no op or tensor has two of (``heads``, ``d_ff`` and
    ``vocab`` on one ``model`` axis, as Megatron does). Then, in order, the
    fallbacks (slots ``s`` = 0, 1): ``fallback[r, s]`` is a dim taking the
    axes ``fallback_axes[r, s]`` wherever none of them is used yet (NONE: no
    fallback). Slot 0 is a parameter dim on axes that split activations
    (FSDP/ZeRO), slot 1 an activation dim on the axes of a parameter choice
    (sequence parallelism: ``seq`` over the tensor-parallel axis between its
    matmuls, Korthikanti et al. 2022; MaxText's ``activation_embed``)."""

    choices: tuple[tuple[int, ...], ...]
    primary: np.ndarray
    fallback: np.ndarray
    fallback_axes: np.ndarray
    _memo: dict[tuple, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    """What :meth:`remembered` computed for these candidates, by key."""
    _maps: _Maps | None = field(default=None, init=False, repr=False, compare=False)
    """The axis maps :meth:`distinct` (or :meth:`mapped`) computed, for :meth:`project` to look up. A
    candidate's maps depend on its own row only, so :meth:`take` passes them on as rows of the same table."""

    def __len__(self) -> int:
        return len(self.primary)

    def split(self, mask: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
        """Per candidate, how many ways it splits a tensor or op whose dims are ``mask``: the product of the
        ``sizes`` of the mesh axes :meth:`project` gives it (remembered: the bounds of every remat policy
        and micro-batch ask for the same dims)."""
        return self.remembered(("split", np.asarray(mask, bool).tobytes(), sizes), lambda: np.where(
            self.project(mask) >= 0, np.array(sizes, float)[None, :], 1.0).prod(axis=1))

    def remembered(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per ``key`` for these candidates (the bounds of every remat policy and
        micro-batch count ask for the same figures of the same candidates)."""
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = compute()
        return hit

    def project(self, mask: np.ndarray) -> np.ndarray:
        """The axis maps the rules give a tensor or op whose dims are ``mask`` (Flax precedence; read from
        those :meth:`distinct` computed where it saw ``mask``'s dims)."""
        if self._maps is not None:
            m = self._maps
            c = m.cols.get(np.flatnonzero(np.asarray(mask, bool)).tobytes())
            if c is not None:
                a = self.primary.shape[1]
                return (m.maps[:, c:c + a] if m.rows is None else m.maps[m.rows, c:c + a]).astype(np.int32)
        return self._project(np.asarray(mask, bool)[None])[:, 0].astype(np.int32)

    def _project(self, masks: np.ndarray) -> np.ndarray:
        """:meth:`project` of every mask of ``masks`` (masks x dims) at once, candidates x masks x axes (small
        integers: int8 where the dims' indices fit)."""
        dt = np.int8 if len(masks[0]) < 127 else np.int32
        table = np.full((len(masks), len(self.choices) + 1), NONE, dtype=dt)  # per mask, each choice's first dim in it
        for c, members in enumerate(self.choices):
            for d in reversed(members):
                table[masks[:, d], c] = d
        proj = table[:, self.primary.T]  # masks x axes x candidates (reductions over the few axes: slices)
        for s in range(self.fallback.shape[1]):
            fb = self.fallback[:, s]
            if not (fb >= 0).any():
                continue
            fa, f = np.ascontiguousarray(self.fallback_axes[:, s].T), fb.astype(dt)
            # where the mask has the fallback's dim, neither there already nor its axes used
            apply = (fb >= 0) & masks[:, fb] & ~(proj == f).any(axis=1) & ~((proj >= 0) & fa).any(axis=1)
            np.copyto(proj, np.broadcast_to(f, proj.shape), where=apply[:, None] & fa)
        return proj.transpose(2, 0, 1)

    def distinct(self, graph: Graph, keep: Sequence[int] = ()) -> np.ndarray:
        """One candidate per distinct layout of ``graph``, in the order of each layout's first candidate:
        candidates giving every tensor and every op the same axis maps (:meth:`project`) are one layout (e.g.
        a fallback on axes that split nothing else, and that dim's primary choice on them), priced alike. The
        first of them stands for the layout, or the one in ``keep`` (candidates found later by their encoding,
        :meth:`index`: the baselines' rule sets), in the first one's place."""
        masks = _space_masks(graph)
        if not len(masks) or not len(self):
            return np.arange(len(self))
        packed = self._packed(masks)
        object.__setattr__(self, "_maps", _Maps.of(masks, packed, self.primary.shape[1]))
        # (rows as byte strings, sorted stably: np.unique(axis=0)'s sort of wide rows took seconds)
        _, first, of = np.unique(packed.view(np.dtype((np.void, packed.shape[1] * packed.itemsize))).ravel(),
                                 return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # the layouts in the order of their first candidates
        of = of.reshape(-1)
        for r in keep:
            first[of[r]] = r  # (in the first one's place)
        return first[order]

    def mapped(self, graph: Graph) -> RuleSets:
        """These candidates, their axis maps for every tensor and op of ``graph`` computed (kept: what
        :meth:`distinct` and :meth:`project` of these, and of the candidates taken from these, read)."""
        masks = _space_masks(graph)
        if len(masks) and len(self) and self._maps is None:
            object.__setattr__(self, "_maps", _Maps.of(masks, self._packed(masks), self.primary.shape[1]))
        return self

    def _packed(self, masks: np.ndarray) -> np.ndarray:
        """Every candidate's axis maps for each of ``masks`` (masks x dims), side by side (candidates x (masks x
        axes)): read from those kept where they hold every mask, else computed (:meth:`_project`)."""
        a = self.primary.shape[1]
        if self._maps is not None:
            m = self._maps
            at = [m.cols.get(np.flatnonzero(mask).tobytes()) for mask in masks]
            if None not in at:
                idx = np.concatenate([np.arange(c, c + a) for c in at])
                same = len(idx) == m.maps.shape[1] and bool((idx == np.arange(len(idx))).all())
                got = m.maps if m.rows is None else m.maps[m.rows]
                return np.ascontiguousarray(got if same else got[:, idx])
        return np.ascontiguousarray(self._project(np.asarray(masks)).reshape(len(self), -1))

    def untwinned(self, classes: Sequence[Sequence[int]], keep: Sequence[int] = ()) -> np.ndarray:
        """One candidate per class of *twins*, in the order of each class's first candidate: candidates whose
        layouts (the axis maps :meth:`distinct` found, which it must have run first) differ only by a
        relabelling of mesh axes within ``classes`` (lists of axis indices: axes the cost model cannot tell
        apart, :func:`interchangeable_axes`) that keeps the order of the axes splitting each dim (a dim split
        over ``data+fsdp`` is another layout than over ``fsdp+data``: the rules list a dim's axes in mesh order,
        so relabelling ``data`` and ``fsdp`` there gives no candidate's layout). The first stands for its
        class, or those of it in ``keep`` (the baselines' rule sets, each of them kept) in the first one's
        place. Twins cost the same (up to floating-point rounding: a hierarchical collective orders equal links
        by their place in the mesh), so a search prices one of them; the others would only be the same plan
        with its axes renamed. At most :data:`MAX_RELABELLINGS` relabellings are tried (none beyond)."""
        perms = _relabellings(classes, self.primary.shape[1])
        if not perms or not len(self) or self._maps is None:  # (None: no tensor to tell layouts apart)
            return np.arange(len(self))
        m = self._maps
        a = self.primary.shape[1]
        own = (m.maps if m.rows is None else m.maps[m.rows]).reshape(len(self), -1, a)  # candidates x masks x axes
        keys = list(map(bytes, np.ascontiguousarray(own)))
        shared = {(i, j): ((own[:, :, i] == own[:, :, j]) & (own[:, :, i] != NONE)).any(axis=1)
                  for i in range(a) for j in range(i + 1, a)}  # per pair of axes: whether they split one dim
        for perm in perms:  # relabelled: axis k takes what axis perm[k] split
            to = np.argsort(perm)  # axis i's new place
            keeps_order = np.ones(len(self), bool)
            for (i, j), both in shared.items():
                if to[i] > to[j]:
                    keeps_order &= ~both
            for r, key in zip(np.flatnonzero(keeps_order).tolist(),
                              map(bytes, np.ascontiguousarray(own[keeps_order][:, :, perm])), strict=True):
                if key < keys[r]:
                    keys[r] = key
        first: dict[bytes, list[int]] = {}
        for r, key in enumerate(keys):
            first.setdefault(key, [r])
        named = set(keep)
        for r in keep:
            kept = first[keys[r]]
            if r not in kept:  # in the first one's place, beside the class's other baselines
                kept[:] = [*(k for k in kept if k in named), r]
        return np.fromiter((r for kept in first.values() for r in kept), dtype=np.int64)

    def take(self, idx: Sequence[int] | np.ndarray) -> RuleSets:
        idx = np.asarray(idx, dtype=np.int64)
        out = RuleSets(self.choices, self.primary[idx], self.fallback[idx], self.fallback_axes[idx])
        for key, value in self._memo.items():  # (a candidate's splits are its own: taken along)
            if key[0] == "split":
                out._memo[key] = value[idx]
            elif key[0] == "group columns":  # (the columns of candidates not taken: computed, never read)
                out._memo[key] = (value[0], value[1][idx])
        if self._maps is not None:
            m = self._maps
            object.__setattr__(out, "_maps", dataclasses.replace(m, rows=idx if m.rows is None else m.rows[idx]))
        return out

    def _codes(self, primary: np.ndarray, fallback: np.ndarray, fallback_axes: np.ndarray) -> np.ndarray:
        """One row of small integers per candidate: equal rows, equal candidates."""
        return np.concatenate([primary, fallback, fallback_axes.reshape(len(primary), -1)], axis=1,
                              dtype=np.int32, casting="unsafe")

    def concat(self, other: RuleSets) -> RuleSets:
        """Both candidate lists, duplicates (of ``other``) dropped; ``other``'s choices are mapped to ours."""
        choices = list(self.choices)
        remap = []
        for c in other.choices:
            if c not in choices:
                choices.append(c)
            remap.append(choices.index(c))
        remap.append(NONE)
        prim = np.array(remap, dtype=np.int32)[other.primary]
        P = np.concatenate([self.primary, prim])
        F = np.concatenate([self.fallback, other.fallback])
        FA = np.concatenate([self.fallback_axes, other.fallback_axes])
        _, first = np.unique(unique_rows(self._codes(P, F, FA))[1], return_index=True)
        keep = np.sort(first)
        out = RuleSets(tuple(choices), P[keep], F[keep], FA[keep])
        n = len(self)
        if self._maps is not None and (n == 0 or (len(keep) >= n and keep[n - 1] == n - 1)):  # (ours all kept)
            m = self._maps
            new = RuleSets(tuple(choices), P[keep[n:]], F[keep[n:]], FA[keep[n:]])
            added = (new._project(m.masks).reshape(len(new), -1) if len(new) else m.maps[:0]).astype(m.maps.dtype)
            mine = m.maps if m.rows is None else m.maps[m.rows]
            object.__setattr__(out, "_maps", dataclasses.replace(m, maps=np.concatenate([mine, added]), rows=None))
        return out

    def index(self, other: RuleSets, r: int = 0) -> int | None:
        """The index of candidate ``r`` of ``other`` among ours, if present."""
        choices = list(self.choices)
        remap = [choices.index(c) if c in choices else -2 for c in other.choices] + [NONE]
        code = self._codes(np.array(remap, dtype=np.int32)[other.primary[r:r + 1]], other.fallback[r:r + 1],
                           other.fallback_axes[r:r + 1])[0]
        ours = self.remembered(("codes",), lambda: self._codes(self.primary, self.fallback, self.fallback_axes))
        hit = np.nonzero((ours == code).all(axis=1))[0]
        return int(hit[0]) if len(hit) else None


MAX_RELABELLINGS = 24
""":meth:`RuleSets.untwinned` tries at most this many relabellings of interchangeable axes (four alike axes)."""


def _relabellings(classes: Sequence[Sequence[int]], axes: int) -> list[np.ndarray]:
    """Every permutation of ``axes`` axis indices that moves axes only within ``classes`` (identity left out),
    as index arrays; none when there would be more than :data:`MAX_RELABELLINGS`."""
    if math.prod(math.factorial(len(c)) for c in classes) > MAX_RELABELLINGS + 1:
        return []
    out = []
    for combo in itertools.product(*(itertools.permutations(c) for c in classes)):
        perm = np.arange(axes)
        for c, p in zip(classes, combo, strict=True):
            perm[list(c)] = p
        if (perm != np.arange(axes)).any():
            out.append(perm)
    return out


def interchangeable_axes(mesh: Mesh, hw: Hardware) -> list[list[int]]:
    """The classes (two axes or more, as axis indices) of ``mesh``'s axes that the cost model cannot tell apart:
    axes of one size and one link (:meth:`Hardware.links_for`), e.g. ``fsdp`` and ``model`` of
    ``data:16,fsdp:8,model:8`` on one TPU slice. What prices a layout sees of an axis is its size and its link;
    the mesh order only breaks ties between equal links."""
    links = hw.links_for(mesh)
    classes: dict[tuple, list[int]] = {}
    for i, (name, size) in enumerate(mesh.axes):
        if size > 1:
            classes.setdefault((size, links[name]), []).append(i)
    return [c for c in classes.values() if len(c) > 1]


def model_groups(graph: Graph, limit: int = 4) -> list[tuple[str, ...]]:
    """Groups of parameter dims no op or tensor has two of (maximal, at least two dims, largest first): each
    can share one mesh axis, as ``heads``, ``d_ff`` and ``vocab`` share Megatron's model axis."""
    return list(graph_cached(graph, ("model_groups", limit), lambda: _model_groups(graph, limit)))


def _model_groups(graph: Graph, limit: int) -> tuple[tuple[str, ...], ...]:
    pdims = sorted({d for t in graph.parameters for d in t.dim_names}, key=list(graph.dims).index)
    together: set[frozenset[str]] = set()
    spaces = [op.iteration_dims(graph.tensors) for op in graph.ops] + [t.dim_names for t in graph.tensors.values()]
    for dims in {tuple(sorted(set(s) & set(pdims))) for s in spaces}:
        for a, b in itertools.combinations(dims, 2):
            together.add(frozenset((a, b)))
    apart = [(a, b) for a, b in itertools.combinations(pdims, 2) if frozenset((a, b)) not in together]
    order = {d: i for i, d in enumerate(pdims)}
    cliques = [tuple(sorted(c, key=order.__getitem__)) for c in _maximal_cliques(pdims, apart) if len(c) >= 2]
    weight = {d: sum(t.nbytes for t in graph.parameters if d in t.dim_names) for d in pdims}
    cliques.sort(key=lambda c: (-len(c), -sum(weight[d] for d in c), c))
    return tuple(cliques[:limit])


def _maximal_cliques(nodes: Sequence[str], edges: Iterable[tuple[str, str]]) -> list[frozenset[str]]:
    """The maximal cliques of a small undirected graph (Bron and Kerbosch 1973, with a pivot; in no
    particular order)."""
    near: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        if a != b:
            near[a].add(b)
            near[b].add(a)
    out: list[frozenset[str]] = []

    def extend(clique: set[str], candidates: set[str], done: set[str]) -> None:
        if not candidates and not done:
            out.append(frozenset(clique))
            return
        pivot = max(candidates | done, key=lambda n: len(near[n] & candidates))
        for n in list(candidates - near[pivot]):
            extend(clique | {n}, candidates & near[n], done & near[n])
            candidates.remove(n)
            done.add(n)

    extend(set(), set(nodes), set())
    return out


def rule_sets(graph: Graph, mesh: Mesh, fallbacks: bool = True, groups: bool = True, mapped: bool = False
              ) -> RuleSets:
    """Every candidate of the global-rules space (see :mod:`.space`): each mesh axis splits one dim, a
    group of dims (:func:`model_groups`) or nothing, divisibly; plus, when some axes split no parameter dim,
    a fallback parameter dim taking them (ZeRO/FSDP).

    Remembered per graph structure (dims, tensors' dims, parameters' dims, groups) and mesh: a graph of that
    structure whose every dim size divides the remembered graph's (one micro-batch of it) gets the remembered
    candidates that divide its sizes, in their order, which are those enumerated afresh (a split dividing the
    smaller size divides the larger; the enumeration's order does not depend on the sizes). ``mapped``: with
    their axis maps for every tensor and op (:meth:`RuleSets.mapped`, computed once per remembered enumeration:
    the graphs of one structure have the same sets of dims)."""
    found, rows = remembered_rule_sets(graph, mesh, fallbacks, groups, mapped)
    if rows is not None:
        return found.take(rows)
    out = RuleSets(found.choices, found.primary, found.fallback, found.fallback_axes)  # (its arrays: the same)
    if mapped:  # (the maps shared, as rows of the same table)
        object.__setattr__(out, "_maps", found._maps)
    return out


def remembered_rule_sets(graph: Graph, mesh: Mesh, fallbacks: bool = True, groups: bool = True,
                         mapped: bool = False) -> tuple[RuleSets, np.ndarray | None]:
    """(the remembered enumeration :func:`rule_sets` takes ``graph``'s candidates from, the rows of it that
    are they: None for all)."""
    sizes = tuple(graph.dims.values())
    key = (_structure(graph, groups), mesh.axes, fallbacks, groups)
    hit = _RULE_SETS.get(key)
    if hit is None or not all(big % small == 0 for big, small in zip(hit[0], sizes, strict=True)):
        hit = _RULE_SETS[key] = (sizes, _enumerated(graph, mesh, fallbacks, groups))
        while len(_RULE_SETS) > _RULE_SETS_SIZE:
            _RULE_SETS.pop(next(iter(_RULE_SETS)))
    found = hit[1].mapped(graph) if mapped else hit[1]
    if hit[0] != sizes:
        ok = divisible(found, np.array(sizes), [s for _, s in mesh.axes])
        if not ok.all():
            return found, np.flatnonzero(ok)
    return found, None


_RULE_SETS: dict[tuple, tuple[tuple[int, ...], RuleSets]] = {}
"""The last candidates :func:`rule_sets` enumerated, per graph structure and mesh: (the dim sizes, the candidates)."""
_RULE_SETS_SIZE = 4


def _structure(graph: Graph, groups: bool) -> tuple:
    """What :func:`rule_sets` reads of a graph besides its dim sizes."""
    def compute() -> tuple:
        spaces = frozenset(t.dim_names for t in graph.tensors.values())
        params = frozenset(t.dim_names for t in graph.parameters)
        return tuple(graph.dims), spaces, params
    return (*graph_cached(graph, "rule_sets structure", compute), tuple(model_groups(graph)) if groups else ())


def divisible(sets: RuleSets, dim_sizes: np.ndarray, axis_sizes: Sequence[int]) -> np.ndarray:
    """Per candidate, whether it splits every dim of sizes ``dim_sizes`` divisibly: its primary choices (each
    dim's split the product of its axes' sizes) and each fallback (its dim over its axes)."""
    member = np.zeros((len(sets.choices) + 1, len(dim_sizes)), bool)  # (the last row: NONE, splitting nothing)
    for c, dims in enumerate(sets.choices):
        member[c, list(dims)] = True
    rows, of = unique_rows(sets.primary)  # (many candidates share their primary choices)
    split = np.ones((len(rows), len(dim_sizes)), dtype=np.int64)
    for a, size in enumerate(axis_sizes):
        split *= np.where(member[rows[:, a]], size, 1)
    ok = (dim_sizes[None, :] % split == 0).all(axis=1)[of]
    for slot in range(sets.fallback.shape[1]):
        f = sets.fallback[:, slot]
        group = np.where(sets.fallback_axes[:, slot], np.asarray(axis_sizes), 1).prod(axis=1)
        ok &= (f < 0) | (dim_sizes[np.maximum(f, 0)] % group == 0)
    return ok


def _enumerated(graph: Graph, mesh: Mesh, fallbacks: bool, groups: bool) -> RuleSets:
    """:func:`rule_sets` enumerated."""
    dims = list(graph.dims)
    sizes = [graph.dims[d] for d in dims]
    axes = [s for _, s in mesh.axes]
    choices: list[tuple[int, ...]] = [(d,) for d in range(len(dims))]
    if groups:
        choices += [tuple(dims.index(d) for d in grp) for grp in model_groups(graph)]
    pdims = sorted({dims.index(d) for t in graph.parameters for d in t.dim_names})
    prim = choice_maps(choices, sizes, axes)
    A = len(axes)
    big = np.array([s > 1 for s in axes])
    param_choice = np.array([any(d in pdims for d in c) for c in choices] + [False])
    spaces = {tuple(sorted(dims.index(d) for d in t.dim_names)) for t in graph.tensors.values()}

    def fallback_rows(used: frozenset[int], free: tuple[int, ...], model: tuple[bool, ...], owned: frozenset[int]
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(fallback dims, fallback axes) of every (slot 0, slot 1) pair, slot 0 major, of a primary row that
        splits ``used``, leaves the big axes ``free`` to a parameter dim and gives the ``model`` axes (a mask)
        the dims ``owned``."""
        slot0: list[tuple[int, np.ndarray]] = [(NONE, np.zeros(A, bool))]
        for r in range(1, len(free) + 1):
            for subset in itertools.combinations(free, r):  # all free axes (ZeRO-3), or some (hybrid FSDP)
                mask = np.zeros(A, bool)
                mask[list(subset)] = True
                group = int(np.prod([axes[a] for a in subset]))
                slot0 += [(f, mask) for f in pdims if f not in used and sizes[f] % group == 0]
        slot1: list[tuple[int, np.ndarray]] = [(NONE, np.zeros(A, bool))]
        if fallbacks and any(model):  # sequence parallelism: dims of the tensors the model axes leave unsplit
            group = int(np.prod([s for s, m in zip(axes, model, strict=True) if m]))
            left = {d for sp in spaces if owned.isdisjoint(sp) for d in sp}
            slot1 += [(d, np.array(model)) for d in sorted(left - used) if sizes[d] % group == 0]
        n0, n1 = len(slot0), len(slot1)
        F = np.stack([np.repeat([f for f, _ in slot0], n1), np.tile([f for f, _ in slot1], n0)], axis=1)
        FA = np.stack([np.repeat(np.stack([m for _, m in slot0]), n1, axis=0),
                       np.tile(np.stack([m for _, m in slot1]), (n0, 1))], axis=1)
        return F, FA

    made: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # (rows sharing what their fallbacks depend on: once)
    F: list[np.ndarray] = []
    FA: list[np.ndarray] = []
    for row in prim.tolist():
        used = frozenset(d for c in row if c >= 0 for d in choices[c])
        free = tuple(a for a in range(A) if big[a] and not param_choice[row[a]]) if fallbacks else ()
        model = tuple(bool(big[a] and param_choice[row[a]]) for a in range(A))
        owned = frozenset(d for a in range(A) if model[a] for d in choices[row[a]])
        key = (used, free, model, owned)
        if key not in made:
            made[key] = fallback_rows(used, free, model, owned)
        f, fa = made[key]
        F.append(f)
        FA.append(fa)
    counts = [len(f) for f in F]
    return RuleSets(tuple(choices), np.repeat(prim, counts, axis=0).astype(np.int32),
                    np.concatenate(F).astype(np.int32), np.concatenate(FA).astype(bool))


def rules_of(sets: RuleSets, r: int, dims: Sequence[str], mesh: Mesh) -> tuple[tuple[str, Axes], ...]:
    """Rule set ``r`` as ordered (dim, axes) rules: primaries (graph dim order), then the fallbacks."""
    row = sets.primary[r]
    split: dict[int, list[str]] = {}
    for a, c in zip(mesh.names, row, strict=True):
        if c >= 0:
            for d in sets.choices[c]:
                split.setdefault(d, []).append(a)
    out = [(dims[d], tuple(split[d])) for d in sorted(split)]
    for f, fa in zip(sets.fallback[r], sets.fallback_axes[r], strict=True):
        if f >= 0:
            out.append((dims[int(f)], tuple(a for a, m in zip(mesh.names, fa, strict=True) if m)))
    return tuple(out)


def rule_set(choices: Sequence[Iterable[str] | str | None], dims: Sequence[str], mesh: Mesh,
             fallback: str | None = None, fallback_axes: Iterable[str] = (), activation_fallback: str | None = None,
             activation_axes: Iterable[str] = ()) -> RuleSets:
    """A one-candidate :class:`RuleSets`: ``choices[a]`` is what mesh axis ``a`` splits (a dim name, several
    dim names no tensor has two of, or None); the fallbacks of slots 0 and 1 (see :class:`RuleSets`)."""
    chosen: list[tuple[int, ...]] = []
    row = []
    for c in choices:
        if c is None:
            row.append(NONE)
            continue
        members = (c,) if isinstance(c, str) else tuple(c)
        key = tuple(dims.index(d) for d in members)
        if key not in chosen:
            chosen.append(key)
        row.append(chosen.index(key))
    fa = [[a in set(axes) for a in mesh.names] for axes in (fallback_axes, activation_axes)]
    fb = [dims.index(d) if d is not None else NONE for d in (fallback, activation_fallback)]
    return RuleSets(tuple(chosen), np.array([row], np.int32).reshape(1, len(mesh.names)),
                    np.array([fb], np.int32), np.array([fa], bool))

