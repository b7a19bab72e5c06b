"""The cost model agrees with what XLA compiles, case by case (``tests/cases.py``).

For the training step of every zoo case, the op rules
(:meth:`OpRules.step_costs` with ``reduce_scatter=False``, the XLA CPU backend:
it all-reduces and slices instead of reduce-scattering) predict

* the collective bytes per device, by (kind, mesh axes): within 2% of the
  compiled program (:func:`layoutsearch.backend.hlo.summarize`);
* the FLOPs per device: within 2% of XLA's cost analysis of the program
  compiled without instruction fusion (:data:`~layoutsearch.backend.sharding.UNFUSED`;
  see :data:`KNOWN_DEVIATIONS` for why and for what fusion adds);
* the peak memory per device (:func:`layoutsearch.costmodel.memory.memory_profile`
  with the ``cpu-sim`` backend's behaviour: all-reduce + slice, gradient
  all-reduces combined after the backward pass and run out of place):
  within 15% of the compiled program XLA runs by default (fusion on, updated
  parameters donated), except the cases listed in :data:`KNOWN_DEVIATIONS`.

The per-element FLOP table of the elementwise functions is checked against XLA
function by function. Nothing is silently widened: every case outside a tolerance is listed with its
reason and the measured range it must stay in, and a listed case that comes
back inside the tolerance fails too (remove it from the list).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections import defaultdict
from dataclasses import dataclass
from functools import cache

import jax
import jax.numpy as jnp
import pytest
from cases import ADAM, CASES, CASES_BY_NAME, SGD, Case, case_params, compiled

from layoutsearch.backend.hlo import CompiledSummary, summarize
from layoutsearch.backend.program import ELEMENTWISE_IMPL
from layoutsearch.backend.sharding import FAST_COMPILE, UNFUSED
from layoutsearch.costmodel.flops import WHERE_FNS
from layoutsearch.costmodel.memory import memory_profile
from layoutsearch.costmodel.ops import (
    ELEMENTWISE_FLOPS,
    FORWARD_SHARED_FLOPS,
    OpRules,
    dedupe_shared,
    integer_pow_flops,
    op_flops,
)
from layoutsearch.ir import Graph, LayerNorm, LayerNormGrad, Optimizer, Tensor
from layoutsearch.ir import ops as O
from layoutsearch.ir.dims import Dim
from layoutsearch.ir.ops import ELEMENTWISE_FNS, UNARY_GRAD
from layoutsearch.mesh import hardware

BYTES_RTOL = 0.02
FLOPS_RTOL = 0.02
MEMORY_RTOL = 0.15


@dataclass(frozen=True)
class Deviation:
    """A known difference between the cost model and XLA: the quantity
    (``flops-fused``, ``memory``), the cases (glob patterns), the range the
    measured ``predicted / compiled - 1`` must stay in, and why."""

    what: str
    cases: tuple[str, ...]
    low: float
    high: float
    reason: str

    def covers(self, case: str) -> bool:
        return any(fnmatch.fnmatchcase(case, p) for p in self.cases)


_UNSLICED_KEPT = (
    "XLA keeps the unsliced results of its all-reduce + slice and of its all-gathers (the full activation, and for "
    "gshard two activation-gradient all-reduces combined out of place) live from the forward into the backward "
    "pass, its fusions slicing on read, where the memory model stores the slice and holds each collective's "
    "buffer during its own op only. (The combined out-of-place gradient all-reduce, the cause these cases were "
    "first listed with, is modelled: Hardware.combined_gradient_all_reduce; these cases reduce few or no "
    "parameter gradients.)")

KNOWN_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "flops-fused", ("*",), -0.15, 0.0,
        "XLA's instruction fusion recomputes cheap elementwise producers (layer-norm centring, gelu, broadcast "
        "adds) inside every consumer fusion instead of storing them: a code-generation choice trading FLOPs for "
        "memory traffic, not a layout effect. The op rules count each op once, like the program compiled without "
        "fusion (same partitioning, collectives and CSE; checked below); the default program counts up to 15% more "
        "(most for the transformers' layer norms and gelu): the prediction is 0-13% below it."),
    Deviation(
        "flops-fused", ("gpt-dropout/*",), -0.26, -0.18,
        "As above, and XLA's fusion draws each dropout mask again (threefry: 35 FLOPs per element) inside every "
        "fusion that reads it (the forward dropout, its gradient in the backward pass) instead of storing it once: "
        "measured -22.0% (the same GPT without dropout, gpt/2d: -12.7%; the unfused program agrees within 0.2%)."),
    # memory: predicted / compiled (default pipeline, donated) - 1, measured on these sizes
    Deviation("memory", ("mlp/mp-alternating", "moe/ep-gshard"), -0.36, -0.20,
              "model-parallel activations, all-reduced and sliced or all-gathered: " + _UNSLICED_KEPT),
    Deviation("memory", ("gpt/2d-seq", "gpt-gqa/2d-seq"), -0.22, -0.14,
              "sequence parallelism on the tensor-parallel axis (measured -19.0% and -16.6%): not analysed in "
              "detail. Two known parts: XLA partitions the embedding gradient as index passthrough (see "
              "XLA_CHOICES: the whole [vocab,d_model] table and its all-reduces live, 8 KiB each, where the memory "
              "model holds the vocab slice), and every layer-norm output is all-gathered over model before its "
              "matmul: " + _UNSLICED_KEPT),
    Deviation("memory", ("gpt-llama/2d-dmodel",), -0.28, -0.20,
              "d_model split over model (every projection all-reduces its partial sums, attention runs replicated "
              "over model): not analysed yet. Not caused by the Llama options: the plain gpt case sizes under the "
              "same rules measure -19.7% (mtf-transformer/2d-dmodel: -10%); grouped-query attention lowers the "
              "predicted peak (smaller keys and values) where XLA's stays put (measured -24.1% with 2 KV heads, "
              "-13.5% with 8)."),
)


@dataclass(frozen=True)
class XlaChoice:
    """An op of the listed cases that XLA compiles otherwise than the op rules price it, and why (``how``:
    ``updates-passthrough``, a scatter-add XLA's SPMD partitioner keeps in its updates' layout, see
    :meth:`OpRules._updates_passthrough`; ``rename-cse``, a reshape that only renames dims, whose output reshard
    XLA computes once with the same reshard of its input for an einsum, where the op rules and the search's
    spaces price it apart). The case must disagree as predicted and agree exactly (within the tolerances) once
    the listed ops are priced as XLA compiles them: nothing else of the case may differ."""

    cases: tuple[str, ...]
    op: str
    how: str
    reason: str

    def covers(self, case: str) -> bool:
        return any(fnmatch.fnmatchcase(case, p) for p in self.cases)


XLA_CHOICES: tuple[XlaChoice, ...] = (
    XlaChoice(
        ("gpt/2d-seq", "gpt-gqa/2d-seq"), "grad/tok_embedded/0", "updates-passthrough",
        "the token-embedding gradient (scatter-add of grad/tok_embedded [batch,seq,d_model], stored "
        "{batch:data,seq:model}, into embed's vocab:model layout). The rules take the cheaper candidate in bytes: "
        "gather the updates and ids over model (8,192 + 256 B), scatter locally into the vocab slice, all-reduce it "
        "over data (2,048 B). XLA's partitioner (gather_scatter_handler.cc, jaxlib 0.10.2; its VLOG prints both) "
        "orders its candidates by its own estimate of the memory of the partitioned instructions first and bytes "
        "second: index passthrough (the whole table on every device: 10,304 B estimated, 38,912 B of "
        "communication) before the trivially sliced operand (24,576 B, 16,896 B), so it all-reduces the whole "
        "[vocab,d_model] table over model and over data (8,192 B each). The choice flips with the sizes (at "
        "batch 8, seq 16 on data:2,model:4: vocab < 156 rows index passthrough, else the sliced table, whatever "
        "d_model), and XLA's memory estimate (masking selects, clamped ids, resharding chains) is no quantity the "
        "cost model has: not modelled. The same ordering makes XLA gather the whole embed table for the forward "
        "lookup at the zoo's default sizes (vocab 128) where the rules gather the ids."),
    XlaChoice(
        ("gpt/2d-seq", "gpt-gqa/2d-seq"), "layer.0/attn_kv_input", "rename-cse",
        "the keys' and values' input renames ln_attn_biased's seq to kv_seq (no instruction: the same array). "
        "Stored {batch:data,seq:model}, it is all-gathered over model for the query projection and, renamed, for "
        "the key and value projections: XLA computes one all-gather (CSE); the op rules price the rename's own "
        "(8,192 B). Not modelled: the search's spaces price each tensor's reshards apart, and the rules must "
        "price what they do (a shared reshard across a rename would need the spaces to relabel dims between "
        "tensors)."),
)
"""XLA's gather/scatter partitioning choices the op rules do not reproduce, listed per case and op."""


def xla_choice(case: str) -> tuple[XlaChoice, ...]:
    return tuple(c for c in XLA_CHOICES if c.covers(case))


def deviation(what: str, case: str) -> Deviation | None:
    found = [d for d in KNOWN_DEVIATIONS if d.what == what and d.covers(case)]
    if len(found) > 1:  # one listing the case's family replaces the one covering every case
        found = [d for d in found if d.cases != ("*",)]
    assert len(found) <= 1, f"{case}: several {what} deviations listed"
    return found[0] if found else None


# ------------------------------------------------------------------ predictions and compiled programs

@dataclass(frozen=True)
class Predicted:
    bytes_by: dict[tuple[str, tuple[str, ...]], int]
    flops: float


@cache
def predicted(case: Case, optimizer: Optimizer = SGD, as_xla_chose: bool = False) -> Predicted:
    """The op rules' prediction (``as_xla_chose``: with the ops of :data:`XLA_CHOICES` priced in XLA's layout)."""
    g, lay = case.training(optimizer), case.layout()
    rules = OpRules(g, lay.mesh, reduce_scatter=False)
    if as_xla_chose:
        chosen = {c.op: c.how for c in xla_choice(case.name)}
        t = g.tensors
        costs = []
        for op in g.ops:
            if op.name not in chosen:
                costs.append(rules.cost_under(op, lay))
            elif chosen[op.name] == "rename-cse":
                assert isinstance(op, O.Reshape), op
                cost = rules.cost_under(op, lay)
                kept = tuple(c for c in cost.comms if not c.cause.startswith(f"{op.output} stored differently"))
                assert len(kept) < len(cost.comms), f"{op.name}: its output is not resharded"
                costs.append(dataclasses.replace(cost, comms=kept))
            else:
                assert chosen[op.name] == "updates-passthrough" and isinstance(op, O.ScatterAdd), op
                inputs = [lay.dim_layout(t[i]) for i in op.inputs]
                costs.append(rules._cost(op, rules._updates_passthrough(op, inputs), inputs,
                                         lay.dim_layout(t[op.output])))
        costs = dedupe_shared(costs)
    else:
        costs = rules.step_costs(lay)
    by: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    for c in costs:
        for x in c.comms:
            by[(x.kind, tuple(x.axes))] += x.bytes
    return Predicted(dict(by), sum(c.flops for c in costs))


@cache
def summary(case: Case, optimizer: Optimizer = SGD, fused: bool = False) -> CompiledSummary:
    return summarize(*compiled(case, optimizer, fused=fused))


def _off(want: dict, got: dict) -> list:
    return [k for k in sorted(set(want) | set(got), key=str) if abs(got.get(k, 0) - want.get(k, 0)) > BYTES_RTOL
            * want.get(k, 0)]


def _check_collectives(case: Case, optimizer: Optimizer) -> None:
    want = summary(case, optimizer).bytes_by()
    assert None not in {a for _, a in want}, f"{case.name}: a compiled collective is not over mesh axes: {want}"
    if xla_choice(case.name):  # the listed op as XLA partitions it, and only it, makes the difference
        assert _off(want, predicted(case, optimizer).bytes_by), f"{case.name}: agrees now: unlist it in XLA_CHOICES"
    got = predicted(case, optimizer, bool(xla_choice(case.name))).bytes_by
    for key in sorted(set(want) | set(got), key=str):
        w, g = want.get(key, 0), got.get(key, 0)
        assert abs(g - w) <= BYTES_RTOL * w, f"{case.name} {key}: predicted {g} bytes, compiled {w}"


def _check_flops(case: Case, optimizer: Optimizer) -> None:
    want, got = summary(case, optimizer).flops, predicted(case, optimizer).flops
    assert got == pytest.approx(want, rel=FLOPS_RTOL), f"{case.name}: predicted {got:.0f} FLOPs, compiled {want:.0f}"


# ------------------------------------------------------------------ collectives and FLOPs, every case

@pytest.mark.parametrize("case", case_params())
def test_collective_bytes_agree(case: Case):
    _check_collectives(case, SGD)


@pytest.mark.parametrize("case", case_params())
def test_flops_agree(case: Case):
    _check_flops(case, SGD)


ADAM_CASES = tuple(CASES_BY_NAME[n] for n in (
    "mtf-ffn/fsdp", "mlp/2d", "mtf-transformer/mp", "gpt/2d", "gpt/fsdp", "moe/ep", "gpt-llama/2d"))
"""The Adam subset of ``test_sharded_numerics`` (same executables)."""


@pytest.mark.parametrize("case", case_params(ADAM_CASES))
def test_adam_step_agrees(case: Case):
    """Adam adds optimizer-state FLOPs (and no collective: state is laid out like its parameter)."""
    _check_collectives(case, ADAM)
    _check_flops(case, ADAM)


# ------------------------------------------------------------------ the default pipeline: fusion and memory

FUSED_CASES = tuple(CASES_BY_NAME[n] for n in (
    "mtf-ffn/dp", "mtf-ffn/fsdp", "mlp/mp", "mtf-transformer/sp", "gpt/mp", "gpt/fsdp", "moe/ep"))
"""Cases compiled a second time with XLA's default pipeline in the fast tier (the rest: ``-m slow``)."""


def _fused_params() -> list:
    slow = [pytest.param(c, id=c.name, marks=pytest.mark.slow) for c in CASES if c not in FUSED_CASES]
    return case_params(FUSED_CASES) + slow


@pytest.mark.parametrize("case", _fused_params())
def test_fusion_changes_flops_only_as_listed(case: Case):
    """Fusion changes no collective, and its extra FLOPs stay within the listed deviation."""
    fused, unfused = summary(case, SGD, True), summary(case, SGD)
    assert fused.bytes_by() == unfused.bytes_by()
    dev = deviation("flops-fused", case.name)
    ratio = predicted(case).flops / fused.flops - 1
    if abs(ratio) <= FLOPS_RTOL:
        return
    assert dev is not None, f"{case.name}: predicted FLOPs {ratio:+.1%} off the fused program, no deviation listed"
    assert dev.low <= ratio <= dev.high + FLOPS_RTOL, f"{case.name}: {ratio:+.1%} off the fused program, outside {dev}"


@pytest.mark.parametrize("case", _fused_params())
def test_peak_memory_agrees(case: Case):
    """Peak memory per device: the memory model against XLA's buffer assignment of
    the default program (arguments + outputs + temporaries - donated aliases:
    ``total_bytes``; ``peak_memory_in_bytes`` leaves out the temporaries on CPU)."""
    want = summary(case, SGD, True).memory["total_bytes"]
    hw = hardware("cpu-sim")  # all-reduce + slice; gradient all-reduces combined after the backward pass
    got = memory_profile(case.training(SGD), case.layout(), reduce_scatter=hw.reduce_scatter,
                         combined_gradient_all_reduce=hw.combined_gradient_all_reduce).peak_bytes
    ratio = got / want - 1
    dev = deviation("memory", case.name)
    if dev is None:
        assert abs(ratio) <= MEMORY_RTOL, f"{case.name}: predicted {got} B, compiled {want} B ({ratio:+.1%})"
    else:
        assert abs(ratio) > MEMORY_RTOL, f"{case.name}: now within {MEMORY_RTOL:.0%} ({ratio:+.1%}): unlist it"
        assert dev.low <= ratio <= dev.high, f"{case.name}: predicted/compiled - 1 = {ratio:+.1%} outside {dev}"


def test_known_deviations_name_existing_cases():
    for d in KNOWN_DEVIATIONS:
        for p in d.cases:
            assert fnmatch.filter(CASES_BY_NAME, p), f"deviation {d.what}: pattern {p!r} matches no case"
        assert d.reason and d.low <= d.high
    for c in XLA_CHOICES:
        for p in c.cases:
            assert fnmatch.filter(CASES_BY_NAME, p), f"XLA choice {c.op}: pattern {p!r} matches no case"
            for name in fnmatch.filter(CASES_BY_NAME, p):
                assert c.op in {op.name for op in CASES_BY_NAME[name].training(SGD).ops}, (name, c.op)
        assert c.reason


def test_reduce_scatter_profile_differs_only_where_outputs_stay_split():
    """``reduce_scatter=True`` (GPU/TPU) turns exactly the FSDP gradient all-reduces into reduce-scatters."""
    case = CASES_BY_NAME["mtf-ffn/fsdp"]
    g, lay = case.training(SGD), case.layout()
    rs = [x for c in OpRules(g, lay.mesh, reduce_scatter=True).step_costs(lay) for x in c.comms
          if x.kind == "reduce-scatter"]
    assert {x.tensor for x in rs} == {"grad/w", "grad/v"}
    assert all(x.bytes == 32 * 64 * 4 for x in rs)


# ------------------------------------------------------------------ the FLOP table, function by function

_PARAMS = {"lr": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "step": 3.0, "factor": 0.37, "value": 0.0,
           "rate": 0.1, "seed": 3.0, "offset": 0.5, "exponent": 3.0}

CONSTANT_FLOPS = {"dropout_mask": 7}
"""FLOPs XLA counts once per op, whatever its size, beyond :data:`ELEMENTWISE_FLOPS` per element (which
leaves them out): ``dropout_mask``'s threefry, lowered on XLA:CPU as a rolled loop, has a scalar loop counter,
its compare and the key schedule (measured: ``35 n + 7`` at every ``n``)."""


def _xla_flops_per_element(f, arity: int, n: int = 64) -> float:
    args = [jnp.arange(n, dtype=jnp.float32) * 0.01 + i + 2 for i in range(arity)]  # no constant operands
    exe = jax.jit(f).lower(*args).compile(compiler_options={**UNFUSED, **FAST_COMPILE})
    return exe.cost_analysis().get("flops", 0.0) / n


@pytest.mark.parametrize("fn", sorted(ELEMENTWISE_FNS))
def test_elementwise_flops_match_xla(fn: str):
    """:data:`ELEMENTWISE_FLOPS` is XLA's count of the backend's lowering of each function (per element, at
    two sizes, plus the function's :data:`CONSTANT_FLOPS`)."""
    spec = ELEMENTWISE_FNS[fn]
    params = {a: _PARAMS[a] for a in spec.attrs}
    for n in (64, 128):
        got = _xla_flops_per_element(lambda *xs: ELEMENTWISE_IMPL[fn](*xs, **params), spec.arity, n)
        per_exponent = integer_pow_flops(O.Elementwise(name="x", inputs=("a",) * spec.arity, output="y", fn=fn,
                                                       params=tuple(params.items())))
        compare = 1 if fn in WHERE_FNS else 0  # a select's compare, of a condition as large as the output here
        assert got == ELEMENTWISE_FLOPS[fn] + compare + per_exponent + CONSTANT_FLOPS.get(fn, 0) / n, n


def test_a_select_compares_its_mask_at_the_mask_size():
    """``where(mask[batch, seq], x[batch, seq, d], y)``: XLA compares the mask before it broadcasts it (one
    compare per mask element, one select per output element)."""
    def f(c, a, b):
        return ELEMENTWISE_IMPL["where"](c[:, :, None], a, b)

    c, a = jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((4, 8, 16), jnp.float32)
    got = jax.jit(f).lower(c, a, a).compile().cost_analysis()["flops"]
    assert got == 4 * 8 * 16 + 4 * 8


@pytest.mark.parametrize("fn", ["gelu", "silu", "sigmoid", "tanh", "relu"])
def test_forward_shared_flops_match_xla(fn: str):
    """A gradient computed next to its forward function shares :data:`FORWARD_SHARED_FLOPS` per element (CSE)."""
    g = UNARY_GRAD[fn]
    both = _xla_flops_per_element(lambda x, dy: (ELEMENTWISE_IMPL[fn](x), ELEMENTWISE_IMPL[g](x, dy)), 2)
    assert both == ELEMENTWISE_FLOPS[fn] + ELEMENTWISE_FLOPS[g] - FORWARD_SHARED_FLOPS.get(g, 0)


@pytest.mark.parametrize("center", [True, False], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("rows, width", [(8, 64), (4, 128)])
def test_norm_flops_match_xla(center: bool, rows: int, width: int):
    """:func:`op_flops` of a layer norm (RMSNorm: ``center=False``) and of its gradient
    computed beside it (as in a training step: the normalized input is shared) is
    XLA's count of the backend's lowering, exactly."""
    from layoutsearch.backend.program import run_graph

    r, d = Dim("r", rows), Dim("d", width)
    tensors = [Tensor("x", (r, d), role="input"), Tensor("dy", (d, r), role="input"), Tensor("y", (r, d)),
               Tensor("dx", (r, d), role="gradient")]
    ops = [LayerNorm(name="y", inputs=("x",), output="y", dim="d", center=center),
           LayerNormGrad(name="dx", inputs=("x", "dy"), output="dx", dim="d", center=center, phase="backward")]
    feeds = {"x": jnp.arange(rows * width, dtype=jnp.float32).reshape(rows, width) * 0.01,
             "dy": jnp.arange(rows * width, dtype=jnp.float32).reshape(width, rows) * 0.02 + 1}
    for n in (1, 2):
        g = Graph("norm", tensors if n == 2 else tensors[:1] + tensors[2:3], ops[:n])
        args = {k: v for k, v in feeds.items() if k in g.tensors}
        exe = jax.jit(lambda f, g=g: {op.output: run_graph(g, f)[op.output] for op in g.ops}).lower(args).compile(
            compiler_options={**UNFUSED, **FAST_COMPILE})
        assert exe.cost_analysis().get("flops", 0.0) == sum(op_flops(g, op) for op in g.ops), (n, center)
