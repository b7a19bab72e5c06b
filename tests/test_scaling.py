"""``estimate`` and ``search`` are linear in the number of ops, blocks tagged or not (checked by counting work,
not by timing).

* :func:`layoutsearch.costmodel.step.repeats` finds the same repeats as the quadratic reference (every op
  compared with every earlier representative of its signature), on the zoo and on random graphs built to
  hit its corner cases (names holding another block's prefix, blocks whose prefix overlaps itself, nested
  blocks), with a number of ``_maps``/``op_signature`` calls linear in the ops;
* the Python lines ``estimate`` executes in ``layoutsearch`` grow by 2x per doubling of the model (a
  quadratic term makes each increment grow faster than the model);
* a graph without block tags prices as the tagged one where tags cannot matter (no remat).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import sys
from pathlib import Path
from typing import Any

import pytest

import layoutsearch as ls
from layoutsearch import zoo
from layoutsearch.costmodel import step
from layoutsearch.ir import GraphBuilder
from layoutsearch.ir import ops as O
from layoutsearch.ir.dims import Dim
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh

MESH = "data:2,model:4"
GPT_RULES = "batch:data,d_ff:model,heads:model"
CHAIN_RULES = "batch:data,d_ff:model"


def untagged(g: Graph) -> Graph:
    return Graph(g.name, g.tensors.values(), [dataclasses.replace(op, block=None) for op in g.ops], loss=g.loss,
                 meta=g.meta)


def gpt(layers: int, tagged: bool = True, **kw: Any) -> Graph:
    g = zoo.gpt(layers=layers, d_model=64, heads=4, seq=16, batch=8, vocab=128, **kw)
    return g if tagged else untagged(g)


def chain(layers: int, tagged: bool = True, nested: bool = False) -> Graph:
    """``x -> tanh(x · w1) · w2`` per layer; tagged: layer ``i`` in block ``layer.i`` (``stack/layer.i`` when
    nested), each layer reading the previous block's output; untagged: one pair of parameters per layer."""
    b = GraphBuilder("chain")
    batch, d, e = b.dim("batch", 8), b.dim("d_model", 64), b.dim("d_ff", 64)
    h = b.input("x", [batch, d])

    def layer(h: Any, i: int) -> Any:
        w1 = b.parameter("wi" if tagged else f"w{i}a", [d, e])
        w2 = b.parameter("wo" if tagged else f"w{i}b", [e, d])
        return b.einsum([b.unary("tanh", b.einsum([h, w1], [batch, e])), w2], [batch, d])

    for i in range(layers):
        if not tagged:
            h = layer(h, i)
            continue
        if nested:
            with b.block("stack"), b.block(f"layer.{i}"):
                h = layer(h, i)
        else:
            with b.block(f"layer.{i}"):
                h = layer(h, i)
    return b.build(b.reduce(b.square(h), [], fn="mean"))


def reference_repeats(graph: Any) -> tuple[int, ...]:
    """The definition: each op against every earlier representative of its signature, in order."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    out = []
    for i, op in enumerate(graph.ops):
        reps = groups.setdefault(step.op_signature(op, graph), [])
        j = next((r for r in reps if step._maps(graph.ops[r], op)), None)
        if j is None:
            reps.append(i)
            j = i
        out.append(j)
    return tuple(out)


class _Ops:
    """A bare op list with tensors (what :func:`step.repeats` reads), free of the graph's checks."""

    def __init__(self, ops: list[O.Op], tensors: dict[str, Tensor]) -> None:
        self.ops, self.tensors = tuple(ops), tensors


def random_ops(rng: random.Random, n: int) -> _Ops:
    """Ops of one signature whose names and blocks are drawn to collide: block prefixes inside other blocks'
    names, blocks whose prefix overlaps itself (``a/a``, ``//``), nested blocks, untagged ops."""
    blocks = ["a", "a/a", "b", "layer.1", "layer.11", "x/layer.1", "ab", "a/b", "b/a", "aa", "a/a/a", "1", "/", "//"]
    d = Dim("d", 4)
    tensors: dict[str, Tensor] = {}
    ops: list[O.Op] = []
    used: set[str] = set()

    def name(block: str | None, templates: list[str]) -> str:
        if rng.random() < 0.3:
            return "".join(rng.choice(["x", "a", "/", *(b + "/" for b in blocks), *blocks])
                           for _ in range(rng.randint(1, 4)))
        fill = block if block is not None else rng.choice(blocks)
        return rng.choice(templates).replace("{B}", fill)

    for _ in range(n):
        block = rng.choice([*blocks, None])
        out = name(block, ["{B}/x", "{B}/y", "g/{B}/x", "{B}/{B}/x", "x", "{B}/a/{B}/", "a/{B}/b"])
        op_name = out if rng.random() < 0.8 else name(block, ["{B}/op", "op{B}/"]) + str(rng.randint(0, 2))
        if op_name in used:
            continue
        used.add(op_name)
        inputs = tuple(name(block, ["{B}/x", "{B}/y", "g/{B}/x", "x", "y", "{B}/a/{B}/"])
                       for _ in range(rng.randint(1, 2)))
        for t in (*inputs, out):
            tensors.setdefault(t, Tensor(t, (d,)))
        ops.append(O.Elementwise(name=op_name, inputs=inputs, output=out, phase="forward", block=block,
                                 fn="add" if len(inputs) == 2 else "neg"))
    return _Ops(ops, tensors)


@pytest.mark.parametrize("make", [
    lambda: gpt(4), lambda: gpt(4, tagged=False), lambda: gpt(3, dropout=0.1, position="rotary", kv_heads=2),
    lambda: zoo.build("moe"), lambda: zoo.build("mtf-transformer"), lambda: zoo.build("mlp"),
    lambda: chain(6), lambda: chain(6, nested=True), lambda: chain(6, tagged=False),
], ids=["gpt", "gpt-untagged", "gpt-dropout-rotary-gqa", "moe", "mtf-transformer", "mlp", "chain", "chain-nested",
        "chain-untagged"])
def test_repeats_match_the_reference_on_models(make: Any) -> None:
    g = step.training_step(make())
    assert step.repeats(g) == reference_repeats(g)


def test_repeats_match_the_reference_on_colliding_names() -> None:
    rng = random.Random(0)
    matched = 0
    for _ in range(2000):
        g = random_ops(rng, rng.randint(1, 25))
        got = step.repeats(g)
        assert got == reference_repeats(g)
        matched += sum(j != i for i, j in enumerate(got))
    assert matched > 100  # the draws do produce repeats


def _count_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"_maps": 0, "op_signature": 0}
    for fn in calls:
        orig = getattr(step, fn)

        def counted(*args: Any, _orig: Any = orig, _fn: str = fn) -> Any:
            calls[_fn] += 1
            return _orig(*args)

        monkeypatch.setattr(step, fn, counted)
    return calls


@pytest.mark.parametrize("make, n", [(gpt, 8), (lambda n: gpt(n, False), 8), (chain, 100),
                                     (lambda n: chain(n, False), 100), (lambda n: chain(n, nested=True), 100)],
                         ids=["gpt", "gpt-untagged", "chain", "chain-untagged", "chain-nested"])
def test_repeat_checks_are_linear(monkeypatch: pytest.MonkeyPatch, make: Any, n: int) -> None:
    calls = _count_calls(monkeypatch)
    counts = []
    for size in (n, 2 * n, 4 * n):
        g = step.training_step(make(size))
        for k in calls:
            calls[k] = 0
        step.repeats(g)
        assert calls["_maps"] <= len(g.ops) and calls["op_signature"] <= len(g.ops)
        counts.append((len(g.ops), calls["_maps"] + calls["op_signature"]))
    # the quadratic scan made 1.3 million _maps calls for the 6,404 ops of the untagged 400-layer chain
    for (ops, checks), (ops2, checks2) in itertools.pairwise(counts):
        assert checks2 <= 1.05 * checks * ops2 / ops + 50, counts


def _lines(fn: Any) -> int:
    """Python lines of ``layoutsearch`` executed by ``fn()`` (every loop iteration counts)."""
    root = str(Path(ls.__file__).parent)
    n = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal n
        if event == "line":
            n += 1
        return local

    def trace(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(root) else None

    before = sys.gettrace()
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(before)
    return n


@pytest.mark.parametrize("make, rules, sizes", [
    (gpt, GPT_RULES, (8, 16, 32)), (lambda n: gpt(n, False), GPT_RULES, (8, 16, 32)),
    (chain, CHAIN_RULES, (50, 100, 200)), (lambda n: chain(n, False), CHAIN_RULES, (50, 100, 200)),
], ids=["gpt", "gpt-untagged", "chain", "chain-untagged"])
def test_estimate_work_is_linear(make: Any, rules: str, sizes: tuple[int, int, int]) -> None:
    """Each doubling of the model adds twice the work of the previous doubling (1.99-2.01 measured); the
    quadratic repeat scan and flash-attention lookups made it 2.19 (gpt), 2.31 (gpt untagged), 2.27 (chain),
    2.31 (chain untagged) at these sizes."""
    mesh = Mesh.parse(MESH)
    work = []
    for n in sizes:
        g = make(n)  # a new graph object: derivation and every cached analysis included
        work.append(_lines(lambda g=g: ls.estimate(g, Layout.from_rules(mesh, rules), "h100")))
    growth = (work[2] - work[1]) / (work[1] - work[0])
    assert growth < 2.08, (work, growth)


@pytest.mark.parametrize("tagged", [True, False], ids=["chain", "chain-untagged"])
def test_search_work_is_linear(tagged: bool) -> None:
    """The search (rules space, memory limit, remat auto) does work linear in the ops (2.02 tagged, 2.00
    untagged measured): each plan it prices costs work linear in the ops. With a fixed overlap fraction the
    number of plans it prices does not depend on the depth (the runner-ups alone are refined), so the work
    compares across depths; with ``overlap="auto"`` the number of candidates refined with the overlap
    schedule varies with how close their costs come (19-20 here, 38-51 on the GPT from 4 to 16 layers),
    the work per refined plan staying linear (``bench/bench_scaling.py --search``). Without block tags,
    remat is searched for ``none`` alone: there is nothing to recompute."""
    work, refined = [], []
    for n in (12, 24, 48):
        g = chain(n, tagged)
        plans: list[Any] = []
        work.append(_lines(lambda g=g: plans.append(ls.search(g, MESH, hardware="h100", baselines=False,
                                                                       overlap=0.0))))
        pruning = plans[0].problem["pruning"]
        blocks = [f"remat full:{round(n * q)}" for q in (0.25, 0.5, 0.75)]  # the block groups, searched last
        assert list(pruning) == (["remat none", "remat selective", "remat full", *blocks] if tagged
                                 else ["remat none"])
        refined.append(sum(p["refined"] for p in pruning.values()))
    assert len(set(refined)) == 1, refined  # the same plans priced at every depth: the work is comparable
    growth = (work[2] - work[1]) / (work[1] - work[0])
    assert growth < 2.08, (work, growth)


@pytest.mark.parametrize("hardware", ["cpu-sim", "h100"])
def test_untagged_graph_prices_as_the_tagged_one(hardware: str) -> None:
    """Without remat, block tags change only how the cost model finds repeats (tagged ops are priced once per
    group and renamed, untagged ones one by one), where flash attention's backward recomputation is listed
    (before each block's backward pass, or all before the first) and the reports' grouping: every op costs
    the same."""
    layout = Layout.from_rules(Mesh.parse(MESH), GPT_RULES)
    tagged, bare = (ls.estimate(gpt(4, t), layout, hardware) for t in (True, False))
    assert [dataclasses.replace(c, block=None) for c in tagged.op_costs] == list(bare.op_costs)

    def ops(report: Any) -> tuple[list[Any], list[str]]:
        ops = [dataclasses.replace(o, block=None) for o in report.ops]
        return [o for o in ops if o.phase != "recompute"], sorted(repr(o) for o in ops if o.phase == "recompute")

    assert ops(tagged) == ops(bare)
    assert (hardware == "h100") == bool(ops(bare)[1])
    for key in ("step_s", "compute_s", "comm_s", "flops_per_device", "model_flops", "bytes_per_axis",
                "memory_bytes"):
        assert getattr(tagged, key) == getattr(bare, key), key
    assert tagged.memory == bare.memory
