"""Compiling a graph's strategy space (:mod:`.space`) into a :class:`~.problem.Problem`.

Every op of the training graph contributes cost *items* over the nodes whose
strategies it depends on, every tensor and transient buffer a memory item:

* an op whose inputs, output and computation are decided by at most two nodes
  is priced whole (:meth:`OpRules.cost` with all its layouts, e.g. a gather
  whose table may be used as stored);
* otherwise its compute (the iteration layout alone), its finishing
  communication (statistics, partial sums and the reshard to the stored
  output: iteration x output storage) and each input's reshard (input
  storage x iteration) are separate items; every item is nonnegative;
* the operands of einsums are resharded once per distinct (stored, wanted)
  layout pair over all einsums reading the tensor (XLA computes a shared
  reshard once), which is one item over the tensor's owner and every einsum
  reading it: a factor over more than two nodes when those are distinct;
* memory: each stored tensor over its lifetime (the cost model's live-set
  rules), each op's transient buffers at the op, and each shared resharded
  copy from its first to its last reader;
* with remat, the recomputed ops are priced a second time and the
  recomputation's buffers count at its point, as the cost model does; on
  hardware that combines the gradient all-reduces (XLA on CPU), a parameter
  gradient's unreduced partial lives until the end of the backward pass.

The nodes and their strategies come from :class:`~.nodes.SpaceNodes`. Items of
tied (repeated) ops merge, counting their instances; items over the same
nodes are summed into one factor whose keys are the distinct combinations of
the items' keys (:mod:`.assemble`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from layoutsearch.costmodel.memory import lifetimes, remat_plan, transient_buffers
from layoutsearch.costmodel.ops import OpCost, is_matmul, local_bytes
from layoutsearch.costmodel.step import signature_ids
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.solvers.assemble import Excess, Item, Items, Roles, assemble
from layoutsearch.solvers.axismaps import NONE, project
from layoutsearch.solvers.blocks import strip_block
from layoutsearch.solvers.clock import Deadline
from layoutsearch.solvers.enumerate import check_size
from layoutsearch.solvers.nodes import SpaceNodes
from layoutsearch.solvers.pricer import Pricer
from layoutsearch.solvers.rulesets import RuleSets, rule_sets
from layoutsearch.solvers.space import SPACES, Space


class _Builder(SpaceNodes):
    """Compiles a graph into a :class:`Space` (see :func:`build_space`): the nodes (:class:`.nodes.SpaceNodes`),
    then every op's, operand's and tensor's items, assembled into a :class:`Problem` (:mod:`.assemble`)."""

    def __init__(self, graph: Graph, mesh: Mesh, hw: Hardware, kind: str, tie: bool, rules: RuleSets | None,
                 include: RuleSets | None, variants: bool, pricer: Pricer | None, remat: str = "none",
                 deadline: Deadline | None = None, max_assignments: int | None = None) -> None:
        if kind not in SPACES:
            raise LayoutSearchError(f"unknown search space {kind!r} (known: {', '.join(SPACES)})")
        if remat != "none" and kind == "ops":
            raise LayoutSearchError(f"remat {remat!r} is supported in the rules and layers spaces, not in 'ops'")
        self.hw = hw
        self.p = pricer or Pricer(graph, mesh, hw)
        if self.p.graph is not graph:  # its caches are keyed by this graph's signature ids
            raise LayoutSearchError("build_space: the pricer was made for another graph")
        rules = rules if rules is not None else (rule_sets(graph, mesh) if kind != "ops" else None)
        super().__init__(graph, mesh, kind, tie, rules, include, variants, self.p.cache)
        self.deadline = deadline or Deadline()
        self.max_assignments = max_assignments
        self._sigs: dict[str, tuple] = self.p.cache.setdefault(("sigs",), {})  # (per op, :meth:`sig`)
        self.plan = remat_plan(graph, remat)
        self.life = lifetimes(graph, self.plan)
        self.recomputed = frozenset(self.plan.recomputed)
        self.deferred = frozenset(self.life.deferrable) if getattr(hw, "combined_gradient_all_reduce", False) \
            else frozenset()

    # -- pricing
    def sig(self, op: O.Op) -> tuple:
        """What an op's cost depends on besides layouts (its kind, attributes, shapes)."""
        sigs = self._sigs
        hit = sigs.get(op.name)
        if hit is None:
            roles = tuple(self.p.classes.get(x) for x in (*op.inputs, op.output))  # which collectives overlap
            hit = sigs[op.name] = (signature_ids(self.g)[op.name], self.p.fusion.signature(op), roles)
        return hit

    def f_op(self, op: O.Op, it: np.ndarray, out: np.ndarray) -> OpCost:
        """``op`` computed as ``it`` with its inputs already laid out for it, its output stored as ``out``."""
        key = ("op", self.sig(op), it.tobytes(), out.tobytes())
        hit = self._fcache.get(key)
        if hit is None:
            t = self.g.tensors
            I = self.dl(it)
            wants = [{d: I[d] for d in t[x].dim_names if d in I} for x in op.inputs]
            hit = self._fcache[key] = self.p.rules.cost(op, I, wants, self.dl(out))
        return hit

    def f_whole(self, op: O.Op, it: np.ndarray, ins: Sequence[np.ndarray], out: np.ndarray) -> OpCost:
        key = ("whole", self.sig(op), it.tobytes(), tuple(x.tobytes() for x in ins), out.tobytes())
        hit = self._fcache.get(key)
        if hit is None:
            I = {} if isinstance(op, O.Reshape) else self.dl(it)
            hit = self._fcache[key] = self.p.rules.cost(op, I, [self.dl(x) for x in ins], self.dl(out))
        return hit

    def f_reshard(self, t: Tensor, src: np.ndarray, dst: np.ndarray, matmul: bool = False
                  ) -> tuple[float | np.ndarray, int]:
        """(seconds, or a bound vector of :meth:`.pricer.Pricer.bound`; transient bytes: the payload of the
        last gather or all-to-all) of resharding ``t`` for an op that is a matmul or not (``matmul``: in a
        bound vector, its all-gathers may run beside the matmul, see :meth:`.pricer.Pricer.critical`)."""
        key = ("rs", self.p.counted, self.p.optimizer, self.p.classes.get(t.name), t.dims, t.dtype, src.tobytes(),
               dst.tobytes(), matmul and self.p.counted == "bound")
        if key not in self._fcache:
            comms = self.reshard_comms(t, src, dst)
            payload = [c.bytes for c in comms if c.kind in ("all-gather", "all-to-all", "collective-permute")]
            self._fcache[key] = (self.p.collectives(comms, matmul=matmul, tensor=t.name),
                                 payload[-1] if payload else 0)
        return self._fcache[key]

    def reshard_comms(self, t: Tensor, src: np.ndarray, dst: np.ndarray) -> tuple:
        """The collectives resharding ``t`` from axis map ``src`` to ``dst`` (the op rules', without a tensor)."""
        key = ("rs comms", t.dims, t.dtype, src.tobytes(), dst.tobytes())
        if key not in self._fcache:
            self._fcache[key] = tuple(self.p.rules.reshard(t, self.dl(src), self.dl(dst), ""))
        return self._fcache[key]

    def transient(self, op: O.Op, cost: OpCost, out: np.ndarray) -> tuple[int, dict[Any, int]]:
        """The cost model's transient buffers of ``op`` (``cost`` may come from the cache, priced for another
        op of the same shapes: its collectives are relabelled with ``op``'s tensors first)."""
        if cost.op != op.name:
            src = self.g.op(cost.op)
            names = dict(zip((*src.inputs, src.output), (*op.inputs, op.output), strict=True))
            cost = dataclasses.replace(cost, comms=tuple(dataclasses.replace(c, tensor=names.get(c.tensor, c.tensor))
                                                         for c in cost.comms))
        stored = 0 if op.output in self.p.fusion.on_chip else self.stored(self.g.tensors[op.output], out)
        return transient_buffers(op, cost, stored, op.output in self.deferred)

    def deferred_item(self, t: Tensor, part: int) -> Item:
        """A parameter gradient whose all-reduce the backend defers to the end of the backward pass (one
        combined all-reduce, ``Hardware.combined_gradient_all_reduce``): part 0 from its producer to the last
        backward op holds the unreduced partial (else the stored gradient), part 1 at the last backward op the
        partial and its reduced copy, part 2 after it the stored gradient."""
        op = self.g.producer(t.name)
        n, o = self.op_node[op.name], self.owner[t.name]

        def fn(a: list[np.ndarray]) -> float:
            stored = self.stored(t, a[1])
            if part == 2:
                return float(stored)
            cost = self.f_op(op, a[0], a[1])
            src = self.g.op(cost.op)
            name = src.output if cost.op != op.name else t.name
            payload = max((c.bytes for c in cost.comms if c.tensor == name and c.kind == "all-reduce"), default=0)
            if not payload:
                return float(stored)
            return float(payload * (2 if part == 1 else 1))

        return Item("deferred", [(n, self.iter_keys(n, op)), (o, self.store_keys(o, t))], fn)

    def stored(self, t: Tensor, amap: np.ndarray) -> int:
        """Bytes of ``t`` stored as ``amap`` as the memory model counts them (new values: in the old buffer)."""
        if t.updates is not None:
            return 0
        key = ("bytes", t.dims, t.dtype, amap.tobytes())
        if key not in self._fcache:
            self._fcache[key] = local_bytes(t, self.dl(amap), self.mesh)
        return self._fcache[key]

    # -- items
    def op_items(self, op: O.Op, n: int, o: int) -> tuple[list[Item], list[Item]]:
        """Cost items and memory items (at the op) of one op."""
        t = self.g.tensors
        out = t[op.output]
        om = self.mask(out.dim_names)
        owners = [self.owner[x] for x in op.inputs]
        cost: list[Item] = []
        mem: list[Item] = []
        nodes = len({n, o, *owners})
        if not isinstance(op, O.Einsum) and (nodes == 1 or nodes == 2 and isinstance(op, (O.Gather, O.ScatterAdd))):
            ins = [(u, self.store_keys(u, t[x])) for u, x in zip(owners, op.inputs, strict=True)]
            roles: Roles = [(n, self.iter_keys(n, op)), (o, self.store_keys(o, out)), *ins]

            def whole(a: list[np.ndarray]) -> OpCost:
                return self.f_whole(op, a[0], a[2:], a[1])

            cost.append(Item("whole", roles, lambda a: self.p.seconds(whole(a), op)))
            mem.append(Item("whole", roles, lambda a: float(self.transient(op, whole(a), a[1])[0])))
            return cost, mem
        I = self.iter_keys(n, op)
        # partial sums: a reduce-scatter leaves the output more split, so even the compute (the HBM bytes of
        # the output) depends on the stored output; otherwise compute depends on the iteration layout only
        partial = isinstance(op, (O.Einsum, O.Reduce, O.ScatterAdd, O.Gather))
        if not partial:
            cost.append(Item("compute", [(n, I)], lambda a: self.p.compute(self.f_op(op, a[0], project(a[0], om)), op)))
        special = len(self.dims) + 1
        coarse = I if partial else np.where(om[I], I, np.where(I >= 0, special, NONE)).astype(np.int32)
        reps = {c.tobytes(): I[k] for k, c in enumerate(coarse)}

        def finish(a: list[np.ndarray]) -> tuple[float, float]:
            """Communication (statistics, partial sums, reshard to the stored output; with partial sums also
            the compute) and its buffers."""
            full = self.f_op(op, reps[a[0].tobytes()], a[1])
            seconds = self.p.seconds(full, op) if partial else self.p.comm(full)
            return seconds, float(self.transient(op, full, a[1])[0])

        froles: Roles = [(n, coarse), (o, self.store_keys(o, out))]
        cost.append(Item("finish", froles, lambda a: finish(a)[0]))
        mem.append(Item("finish", froles, lambda a: finish(a)[1]))
        if isinstance(op, O.Einsum):
            return cost, mem
        for i, (u, x) in enumerate(zip(owners, op.inputs, strict=True)):
            xt = t[x]
            roles = [(u, self.store_keys(u, xt)), (n, project(I, self.mask(xt.dim_names)))]
            cost.append(Item(f"in{i}", roles, lambda a, xt=xt: self.f_reshard(xt, a[0], a[1])[0]))
            if x not in op.inputs[:i]:
                mem.append(Item(f"in{i}", roles, lambda a, xt=xt: float(self.f_reshard(xt, a[0], a[1])[1])))
        return cost, mem

    def reader_items(self, x: Tensor, op: O.Op) -> tuple[Item, Item]:
        """The reshard of operand ``x`` for einsum ``op`` alone: (cost item, memory item at the op)."""
        u, n = self.owner[x.name], self.op_node[op.name]
        roles: Roles = [(u, self.store_keys(u, x)), (n, project(self.iter_keys(n, op), self.mask(x.dim_names)))]
        matmul = is_matmul(op, self.g.tensors)
        return (Item("reader", roles, lambda a: self.f_reshard(x, a[0], a[1], matmul)[0]),
                Item("reader", roles, lambda a: float(self.f_reshard(x, a[0], a[1], matmul)[1])))

    def shared_items(self, x: Tensor, slots: list[tuple[int, int, O.Op]]) -> tuple[Item, list[Item]]:
        """The shared reshard of einsum operand ``x``: its cost item, and per segment of the schedule between
        its readers (:func:`_segments`) a memory item: the copies live there (a copy lives from its first
        reader to its last)."""
        u = self.owner[x.name]
        xm = self.mask(x.dim_names)
        roles: Roles = [(u, self.store_keys(u, x))]
        roles += [(self.op_node[op.name], project(self.iter_keys(self.op_node[op.name], op), xm))
                  for _, _, op in slots]
        rank = _ranks([k for k, _, _ in slots])

        runs = [self.runs(op) for _, _, op in slots]
        # the cost model gives a shared reshard's collectives to its first reader; any matmul reader here (a
        # weaker bound when that one is not a matmul, still a lower bound)
        matmul = any(is_matmul(op, self.g.tensors) for _, _, op in slots)

        def seconds(a: list[np.ndarray]) -> float:
            """Each distinct reshard once, and again each time its first reader is recomputed (remat, or a
            flash-attention backward pass)."""
            first: dict[bytes, tuple[np.ndarray, int]] = {}
            for w, n in zip(a[1:], runs, strict=True):
                first.setdefault(w.tobytes(), (w, n))
            return sum(self.f_reshard(x, a[0], w, matmul)[0] * n for w, n in first.values())

        copies: dict[bytes, list[tuple[int, int, int]]] = {}

        def live(a: list[np.ndarray]) -> list[tuple[int, int, int]]:
            """Each distinct copy of ``x`` under keys ``a``: its bytes and the first and last rank reading it
            (found once per keys, for every segment's item; each role's keys have one width)."""
            key = np.concatenate(a).tobytes()
            if key not in copies:
                ranks: dict[bytes, list[int]] = {}
                ws = {}
                for w, r in zip(a[1:], rank, strict=True):
                    ranks.setdefault(w.tobytes(), []).append(r)
                    ws[w.tobytes()] = w
                copies[key] = [(self.f_reshard(x, a[0], ws[k], matmul)[1], min(rs), max(rs))
                               for k, rs in ranks.items()]
            return copies[key]

        def mem_fn(seg: tuple[int, int]) -> Callable:
            def fn(a: list[np.ndarray]) -> float:
                return float(sum(b for b, lo, hi in live(a) if lo <= seg[0] and hi >= seg[1]))
            return fn

        return (Item("shared", roles, seconds),
                [Item("shared", roles, mem_fn(seg)) for seg in _segments(max(rank) + 1)])

    def hold_item(self, op: O.Op, operands: list[tuple[str, list[O.Op]]]) -> Item:
        """A bound vector's compute entry for matmul ``op`` beyond its compute (and launch): the longest
        communicator's decomposed collectives (:meth:`~.pricer.Pricer.decomposed`) of its own cost and of the
        reshards of its operands it runs, those no earlier reader of the same operand (``operands``: each with
        its earlier readers, as :meth:`add_operand_reshards` groups them) runs to the same layout (the cost
        model gives a shared reshard to its first reader)."""
        t = self.g.tensors
        n, o = self.op_node[op.name], self.owner[op.output]
        I = self.iter_keys(n, op)
        roles: Roles = [(n, I), (o, self.store_keys(o, t[op.output]))]
        at: list[tuple[Tensor, int, int]] = []  # per operand: its tensor, its first role, its earlier readers
        for x, before in operands:
            xt, u, xm = t[x], self.owner[x], self.mask(t[x].dim_names)
            at.append((xt, len(roles), len(before)))
            roles += [(u, self.store_keys(u, xt)), (n, project(I, xm))]
            roles += [(self.op_node[b.name], project(self.iter_keys(self.op_node[b.name], b), xm)) for b in before]
        launch_s = float(self.p.launch(op)[0])  # (bound prices: vectors, entry 0 the compute stream)

        def fn(a: list[np.ndarray]) -> float | np.ndarray:
            own = self.f_op(op, a[0], a[1])
            per = self.p.decomposed(own.comms, own.op)
            for xt, r, m in at:
                want = a[r + 1].tobytes()
                if any(a[r + 2 + j].tobytes() == want for j in range(m)):
                    continue  # an earlier reader runs this reshard
                for axes, sec in self.p.decomposed(self.reshard_comms(xt, a[r], a[r + 1]), op.name, xt.name).items():
                    per[axes] = per.get(axes, 0.0) + sec
            excess = max(0.0, max(per.values(), default=0.0) - float(self.p.compute(own, op)[0]) - launch_s)
            return self.p.on_compute_stream(excess) if excess else 0.0

        return Item("hold", roles, fn)

    def recompute_item(self, at: O.Op, ops: list[O.Op]) -> Item:
        """The transient buffers of the recomputation run before op ``at``: the cost model keeps the larger of
        ``at``'s own buffers and each recomputed op's (own and shared); this item is the excess over ``at``'s."""
        g = self.g
        t = g.tensors
        every = [at, *ops]
        roles: Roles = []
        for op in every:
            o = self.owner[op.output]
            roles += [(self.op_node[op.name], self.iter_keys(self.op_node[op.name], op)),
                      (o, self.store_keys(o, t[op.output]))]
            roles += [(self.owner[x], self.store_keys(self.owner[x], t[x])) for x in op.inputs]

        def term(op: O.Op) -> tuple[int, Callable]:
            def value(keys: list[np.ndarray]) -> float:  # the op's buffers (own, and shared unless it is ``at``)
                own, shared = self.transient(op, self.f_whole(op, keys[0], keys[2:], keys[1]), keys[1])
                return float(own if op is at else own + sum(shared.values()))
            return 2 + len(op.inputs), value

        fn = Excess(tuple(term(op) for op in every))
        return Item("recompute", roles, fn)

    def point_classes(self) -> list[Any]:
        """Per op of the schedule: its class, the sequences in which :func:`.assemble.memory_rows` looks for
        runs of points whose live items grow alike (equal for the instances of one op of tied blocks, and for
        untagged ops of equal signature: the repeated layers of a graph without block tags)."""
        def make() -> list[Any]:
            fam = self.families(True)
            sig = signature_ids(self.g)
            return [(fam[op.block], strip_block(op.name, op.block)) if op.block is not None
                    else ("untagged", sig[op.name]) for op in self.g.ops]

        return self.cached(("point_classes",), make)

    def build(self) -> Space:
        self.make_nodes()
        if self.max_assignments is not None:  # refused before the (long) pricing
            check_size(math.prod(n.size for n in self.nodes), self.max_assignments)
        self.items = Items()
        self.add_op_items()
        self.add_operand_reshards()
        self.add_recompute_items()
        self.add_tensor_items()
        try:
            problem = assemble([n.name for n in self.nodes], [n.size for n in self.nodes], self.items,
                               [op.name for op in self.g.ops], self.point_classes(), self.deadline, self.known())
        finally:  # the items' makers refer back to this builder: let it go by reference counting
            self.items = Items()
        return Space(self.g, self.mesh, self.hw, self.kind, self.nodes, self.op_node, self.owner, problem, self.dims)

    def known(self) -> dict[str, dict[tuple, dict[bytes, Any]]]:
        """The item values met before by the spaces this pricer built alike (:func:`.assemble.assemble`'s
        ``known``): an item's value is a function of its merge key and its keys under one space kind, tying,
        variants and pricing (seconds or bounds, optimizer or not), and for a memory item one remat policy
        (lifetimes and recomputation buffers; a cost item's recomputation is in its count, or in its key);
        the candidates (the keys asked for) may differ from build to build."""
        alike = ("item values", self.kind, self.tie, self.variants, self.p.counted, self.p.optimizer)
        return {"cost": self.p.cache.setdefault(alike, {}),
                "memory": self.p.cache.setdefault((*alike, self.plan.policy), {})}

    def runs(self, op: O.Op) -> int:
        """How often ``op`` runs in a step: once, and again when remat or a flash-attention backward pass
        recomputes it."""
        return 1 + (op.name in self.recomputed) + (op.name in self.p.flash_recomputed)

    def launch_item(self, op: O.Op, n: int) -> Item:
        """The kernel launch of one execution of ``op`` in node ``n`` (:meth:`~.pricer.Pricer.launch`): the same
        whatever the layout."""
        launch = self.p.launch(op)
        return Item("launch", [(n, self.iter_keys(n, op))], lambda a: launch)

    def add_op_items(self) -> None:
        """Every op's own items (:meth:`op_items`); the ops of one class (tied layers) share them, built once."""
        kinds: dict[tuple, tuple[list[str], list[str]]] = {}  # per op class: the kinds of its items
        for k, op in enumerate(self.g.ops):
            if k % 256 == 0:
                self.deadline.check()
            n, o = self.op_node[op.name], self.owner[op.output]
            base = (self.sig(op), n, o, tuple(self.owner[x] for x in op.inputs))
            made: dict[str, Any] = {}

            def items(op: O.Op = op, n: int = n, o: int = o, made: dict = made) -> tuple[list[Item], list[Item]]:
                if "v" not in made:
                    made["v"] = self.op_items(op, n, o)
                return made["v"]

            if base not in kinds:
                kinds[base] = ([it.kind for it in items()[0]], [it.kind for it in items()[1]])
            for j, kind in enumerate(kinds[base][0] if self.p.optimizer or op.phase != "optimizer" else ()):
                for _ in range(self.runs(op)):
                    self.items.add_cost(("op", base, kind), lambda j=j, items=items: items()[0][j])
            if op.name in self.p.fusion.kernels and (self.p.optimizer or op.phase != "optimizer"):
                for _ in range(1 + (op.name in self.recomputed)):  # (a flash backward's recomputation: none)
                    self.items.add_cost(("launch", n), lambda op=op, n=n: self.launch_item(op, n))
            for j, kind in enumerate(kinds[base][1]):
                self.items.add_memory(("op", base, kind), lambda j=j, items=items: items()[1][j], (k, k))

    def add_operand_reshards(self) -> None:
        """The reshards of einsum operands: one shared reshard per operand over the einsums reading it (all of
        them, or those of one phase where the backend gathers weights again for the backward pass,
        ``Hardware.regather_weights``); priced per reader when the readers are in several nodes."""
        g = self.g
        readers: dict[tuple[str, str], list[tuple[int, int, O.Op]]] = defaultdict(list)
        for k, op in enumerate(g.ops):
            if isinstance(op, O.Einsum) and (self.p.optimizer or op.phase != "optimizer"):
                for i, x in enumerate(op.inputs):
                    if x in self.p.rules.constant:
                        continue  # a compile-time constant is built in the layout it is read in (the op rules)
                    readers[(x, op.phase if self.hw.regather_weights else "")].append((k, i, op))
        self.add_hold_items(readers)
        for (x, _), slots in readers.items():
            t = g.tensors[x]
            nodes = {self.owner[x], *(self.op_node[op.name] for _, _, op in slots)}
            if len(nodes) > 2:  # readers in several nodes: priced per reader (see the module docstring)
                for k, i, op in slots:
                    key = ("reader", t.dim_names, t.dtype, self.owner[x], self.op_node[op.name], self.sig(op), i)
                    cost, mem = self.reader_items(t, op)
                    self.items.add_cost(key, lambda cost=cost: cost)
                    if x not in op.inputs[:i]:
                        self.items.add_memory(key, lambda mem=mem: mem, (k, k))
                continue
            self.add_shared_reshard(t, slots)

    def add_hold_items(self, readers: dict[tuple[str, str], list[tuple[int, int, O.Op]]]) -> None:
        """Bound prices on hardware with collective matmuls: each matmul's :meth:`hold_item`, once per run
        (``readers``: the einsums reading each operand, grouped as their reshards are shared)."""
        hw = self.hw
        if not (self.p.counted == "bound" and hw.collective_matmul and hw.async_collectives):
            return
        operands: dict[str, list[tuple[str, list[O.Op]]]] = defaultdict(list)
        for (x, _), slots in readers.items():
            for j, (_, i, op) in enumerate(slots):
                if x not in op.inputs[:i]:
                    operands[op.name].append((x, [b for _, _, b in slots[:j] if b is not op]))
        t = self.g.tensors
        for op in self.g.ops:
            if not is_matmul(op, t) or not (self.p.optimizer or op.phase != "optimizer"):
                continue
            mine = operands.get(op.name, [])
            key = ("hold", self.sig(op), self.op_node[op.name], self.owner[op.output],
                   tuple((t[x].dim_names, t[x].dtype, self.owner[x], tuple((self.op_node[b.name], self.sig(b))
                                                                           for b in before)) for x, before in mine))
            for _ in range(self.runs(op)):
                self.items.add_cost(key, lambda op=op, mine=mine: self.hold_item(op, mine))

    def add_shared_reshard(self, t: Tensor, slots: list[tuple[int, int, O.Op]]) -> None:
        """The one reshard of operand ``t`` its einsums ``slots`` share: its time, and its copies' memory per
        piece of the schedule between the readers."""
        positions = [k for k, _, _ in slots]
        key = ("shared", t.dim_names, t.dtype, self.owner[t.name],
               tuple((self.op_node[op.name], self.sig(op), i, op.name in self.recomputed,
                      op.name in self.p.flash_recomputed) for _, i, op in slots),
               tuple(_ranks(positions)))
        made: dict[str, Any] = {}

        def shared() -> tuple[Item, list[Item]]:
            if "v" not in made:
                made["v"] = self.shared_items(t, slots)
            return made["v"]

        distinct = sorted(set(positions))
        self.items.add_cost(key, lambda: shared()[0])
        for j, (lo, hi) in enumerate(_segments(len(distinct))):
            # segment (lo, hi) in reader ranks: at reader lo when lo == hi, else strictly between two readers
            span = (distinct[lo], distinct[lo]) if lo == hi else (distinct[lo] + 1, distinct[hi] - 1)
            if span[0] <= span[1]:
                self.items.add_memory((*key, j), lambda j=j: shared()[1][j], span)

    def add_recompute_items(self) -> None:
        """Per remat point, the buffers of the recomputation run there (:meth:`recompute_item`)."""
        g = self.g
        by_block: dict[str | None, list[O.Op]] = defaultdict(list)  # (one pass: a scan per block grew as blocks²)
        for name in self.plan.recomputed:
            by_block[g.op(name).block].append(g.op(name))
        for block, p in self.plan.points.items():
            ops = by_block.get(block, [])
            if ops:
                n = self.op_node[g.ops[p].name]
                nodes = tuple(sorted({self.op_node[op.name] for op in ops} | {self.owner[x] for op in ops
                                                                               for x in (*op.inputs, op.output)}))
                key = ("recompute", self.sig(g.ops[p]), tuple(self.sig(op) for op in ops), n, nodes)
                self.items.add_memory(key, lambda ops=ops, p=p: self.recompute_item(g.ops[p], ops), (p, p))

    def add_tensor_items(self) -> None:
        """Every stored tensor over its lifetime (the cost model's live ranges); a gradient whose all-reduce
        is deferred in three parts (:meth:`deferred_item`); tensors kept on chip (fusion) none."""
        life = self.life
        deferred_rows = {row: name for name, row in life.deferrable.items() if name in self.deferred}
        for row, (ti, start, end) in enumerate(zip(life.tensor, life.start, life.end, strict=True)):
            t = life.tensors[int(ti)]
            o = self.owner[t.name]
            if row in deferred_rows:
                op = self.g.producer(t.name)
                last = life.last_backward
                for part, span in enumerate(((int(start), last - 1), (last, last), (last + 1, int(end)))):
                    if span[0] <= span[1]:
                        key = ("deferred", part, t.dim_names, t.dtype, o, self.op_node[op.name], self.sig(op))
                        self.items.add_memory(key, lambda t=t, part=part: self.deferred_item(t, part), span)
                continue
            if t.name in self.p.fusion.on_chip:
                continue  # never in HBM
            self.items.add_memory(("store", t.dim_names, t.dtype, o), lambda t=t, o=o: self.store_item(t, o),
                                  (int(start), int(end)))

    def store_item(self, t: Tensor, o: int) -> Item:
        """Tensor ``t`` stored by its owner ``o`` (its bytes as the memory model counts them)."""
        return Item("store", [(o, self.store_keys(o, t))], lambda a: float(self.stored(t, a[0])))


def build_space(graph: Graph, mesh: Mesh, hw: Hardware, kind: str = "ops", tie: bool = True,
                rules: RuleSets | None = None, include: RuleSets | None = None, variants: bool = True,
                pricer: Pricer | None = None, remat: str = "none", deadline: Deadline | None = None,
                max_assignments: int | None = None) -> Space:
    """Compile training graph ``graph`` on ``mesh`` into the search space ``kind`` (see :mod:`.space`).

    ``rules``: the candidate rule sets of the ``rules``/``layers`` spaces (default :func:`rule_sets`);
    ``include``: rule sets whose projections every op and tensor of the ``ops`` space may also take (so that
    space contains those plans); ``variants``: whether ops may store their output more split than they
    compute it; ``tie``: whether repeated blocks share their nodes; ``remat``: the cost model's
    rematerialization policy (recomputed ops priced twice, the lifetimes and buffers it implies; rules and
    layers spaces); ``deadline``: :class:`~.clock.TimeUp` when it passes while the space is built;
    ``max_assignments``: LayoutSearchError, before any pricing, when the space has more assignments (for
    enumeration, which evaluates all of them).
    """
    return _Builder(graph, mesh, hw, kind, tie, rules, include, variants, pricer, remat, deadline,
                    max_assignments).build()


def _ranks(positions: Sequence[int]) -> list[int]:
    """Each position's rank among the distinct positions."""
    distinct = sorted(set(positions))
    return [distinct.index(p) for p in positions]


def _segments(m: int) -> list[tuple[int, int]]:
    """The pieces of the schedule between ``m`` readers, in reader ranks: (j, j) at reader j, (j, j + 1)
    strictly between readers j and j + 1. A copy read by ranks ``rs`` lives on piece (lo, hi) when
    ``min(rs) <= lo`` and ``max(rs) >= hi``."""
    out: list[tuple[int, int]] = []
    for j in range(m):
        out.append((j, j))
        if j + 1 < m:
            out.append((j, j + 1))
    return out
