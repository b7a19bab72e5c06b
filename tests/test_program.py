"""Plans as running programs (``Plan.compile`` -> ``Program``): training, reload, decisions, shardings.

Equalities between programs are float32 (``precision="fp32"``) with rtol 2e-5: the programs differ only in
how reductions are split over devices or micro-batches, i.e. float32 reassociation (~1e-7 relative per
operation over a few hundred summands). Mixed-precision programs are compared only with themselves.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import layoutsearch as ls
from layoutsearch.backend.program import forward_fn, init_params, random_inputs
from layoutsearch.backend.train import Program
from layoutsearch.errors import LayoutError, LayoutSearchError

SMALL = dict(layers=2, d_model=64, heads=4, seq=16, batch=8, vocab=128)


def small(**kw):
    return ls.zoo.gpt(**{**SMALL, **kw})


def test_fifteen_line_script_trains():
    # the README's script: build, search on 8 simulated devices, compile, 20 steps, loss lower
    plan = ls.search(small(), "data:2,model:4")
    program = plan.compile()
    state = program.init(seed=0)
    batch = program.random_batch(seed=0)
    losses = []
    for _ in range(20):
        state, metrics = program.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] and int(state.step) == 20
    assert all(np.isfinite(losses))


def _losses(program, steps=3, seed=0):
    state = program.init(seed)
    out = []
    for i in range(steps):
        state, m = program.train_step(state, program.random_batch(seed + i))
        out.append(float(m["loss"]))
    return out, state


def test_saved_plan_reloads_and_runs_identically(tmp_path):
    plan = ls.search(small(), "data:2,model:4", hardware="h100", remat="selective")
    path = tmp_path / "plan.json"
    plan.save(path)
    again = ls.Plan.load(path)
    # re-priced by the cost model: the same figures (the search's wall time is not saved: same search, same file)
    assert {**again.to_dict(), "search_s": None} == {**plan.to_dict(), "search_s": None}
    assert (again.precision, again.optimizer, again.remat) == (plan.precision, plan.optimizer, "selective")
    assert _losses(again.compile())[0] == _losses(plan.compile())[0]


def test_plan_file_errors(tmp_path):
    plan = ls.search(small(), "data:2,model:4")
    doc = json.loads(plan.to_json())
    with pytest.raises(LayoutSearchError, match="p.json: not valid JSON"):
        ls.Plan.from_json("{", "p.json")
    with pytest.raises(LayoutSearchError, match="p.json: top level: duplicate key 'version'"):
        ls.Plan.from_json(plan.to_json().replace('"version": 1,', '"version": 1, "version": 1,'), "p.json")
    with pytest.raises(LayoutSearchError, match="not a layoutsearch plan"):
        ls.Plan.from_json(json.dumps({"model": {}}), "p.json")
    with pytest.raises(LayoutSearchError, match="version 99"):
        ls.Plan.from_json(json.dumps({**doc, "version": 99}), "p.json")
    del doc["plan"]["layout"]
    with pytest.raises(LayoutSearchError, match="p.json: malformed plan file"):
        ls.Plan.from_json(json.dumps(doc), "p.json")
    doc = json.loads(plan.to_json())
    doc["plan"]["layout"]["rules"] = [["nodim", ["data"]]]
    with pytest.raises(LayoutSearchError, match="p.json: .*nodim"):
        ls.Plan.from_json(json.dumps(doc), "p.json")
    with pytest.raises(LayoutSearchError, match="cannot read plan file"):
        ls.Plan.load(tmp_path / "missing.json")


def _grads(program, seed=0):
    """Loss and gradients by the graph's names, as the program's training step computes them (accumulated over
    micro-batches; a pipeline's schedule writes its own backward pass)."""
    state = program.init(seed)
    batch = program.random_batch(seed)
    loss, grads = jax.jit(program._loss_and_grads)(state.params, batch)
    if program.pipeline is not None:
        grads = program.pipeline.unstack(grads["stacked"], grads["outer"])
    return float(loss), {k: np.asarray(v) for k, v in grads.items()}


def _reference(graph, seed=0):
    """Unsharded loss and gradients of the forward graph (float32), on one device."""
    f = forward_fn(graph)
    loss, g = jax.value_and_grad(f)(init_params(graph, seed), random_inputs(graph, seed))
    return float(loss), {k: np.asarray(v) for k, v in g.items()}


@pytest.mark.parametrize("mesh, rules, kw", [
    ("data:2,model:4", "batch:data,d_ff:model,heads:model", {}),
    ("data:2,model:4", "batch:data,d_ff:model,heads:model", {"remat": "selective"}),
    ("data:8", "batch:data,d_model:data", {"remat": "full"}),  # FSDP
    ("data:2,model:4", "batch:data,d_ff:model,heads:model", {"remat": "full:1", "microbatches": 2}),
    ("data:2,model:4", "batch:data,d_ff:model,heads:model", {"microbatches": 2}),
    ("data:2,model:2,stage:2", "batch:data,d_ff:model,heads:model", {"stage_axis": "stage", "microbatches": 2}),
    ("stage:2,model:4", "d_ff:model", {"stage_axis": "stage", "microbatches": 4, "remat": "selective"}),
    ("data:2,model:4", "batch:data,d_ff:model,heads:model", {"attention": "flash"}),
    ("data:2,model:4", "batch:data,heads:model", {"attention": "flash", "remat": "selective", "microbatches": 2}),
    ("data:2,model:2,stage:2", "batch:data,heads:model", {"stage_axis": "stage", "microbatches": 2,
                                                          "attention": "flash"}),
])
def test_program_gradients_equal_unsharded(mesh, rules, kw):
    g = small()
    program = Program(g, ls.Layout.from_rules(mesh, rules), precision="fp32", **kw)
    loss, grads = _grads(program)
    ref_loss, ref = _reference(g)
    assert loss == pytest.approx(ref_loss, rel=2e-5)
    assert grads.keys() == ref.keys()
    for k in ref:
        np.testing.assert_allclose(grads[k], ref[k], rtol=2e-5, atol=2e-6, err_msg=k)


def test_remat_policies_recompute_what_they_drop():
    # seq 64: the recomputed matmuls outweigh XLA:CPU's elementwise counts, which vary with its fusion and CSE
    # by as much as a 16-token step's attention recomputation
    g = small(seq=64)
    lay = ls.Layout.from_rules("data:8", "batch:data")
    flops = {r: Program(g, lay, remat=r, precision="fp32")._lowered().compile().cost_analysis()["flops"]
             for r in ("none", "selective", "full:1", "full")}
    assert flops["none"] < flops["selective"] < flops["full"] and flops["none"] < flops["full:1"] < flops["full"]
    with pytest.raises(LayoutError, match="the pipeline executor remats every layer of a stage alike"):
        Program(g, ls.Layout.from_rules("stage:2,data:4", "batch:data"), remat="full:1", stage_axis="stage",
                microbatches=2)
    with pytest.raises(LayoutError, match="unknown remat policy 'some'"):
        Program(g, lay, remat="some")


def _saved_residuals(program):
    """What JAX keeps from the program's forward pass for its backward pass, one line per array."""
    import contextlib
    import io

    from jax.ad_checkpoint import print_saved_residuals

    state = program.init(0)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        print_saved_residuals(program._loss_fn, state.params, program.random_batch(0))
    return out.getvalue().splitlines()


@pytest.mark.parametrize("kw", [{}, {"kv_heads": 2, "mlp": "swiglu", "position": "rotary"}, {"dropout": 0.1},
                                {"parallel_block": 1}])
def test_flash_attention_keeps_no_scores(kw):
    """``attention="flash"``: no seq x kv_seq tensor is kept for the backward pass (the scores are recomputed,
    as a flash-attention kernel does), where ``standard`` keeps them; one core per layer. (XLA:CPU merges the
    recomputation with the forward pass again, so the compiled CPU program is no witness: JAX's residuals
    are, and XLA:GPU/TPU keep the recomputation, as they keep every ``jax.checkpoint``'s.)"""
    from layoutsearch.backend.program import flash_cores

    seq = 32
    g = small(seq=seq, **kw)
    assert len(flash_cores(g)) == SMALL["layers"]
    lay = ls.Layout.from_rules("data:8", "batch:data")
    scores = f"{seq},{seq}]"  # the trailing seq, kv_seq dims of the scores (no other tensor ends so)
    standard = _saved_residuals(Program(g, lay, attention="standard"))
    flash = _saved_residuals(Program(g, lay, attention="flash"))
    assert any(scores in line for line in standard) and not any(scores in line for line in flash)
    auto = Program(g, lay)  # auto: standard on CPU devices, flash on accelerators
    assert auto.attention == ("standard" if auto.mesh.devices.flat[0].platform == "cpu" else "flash")
    with pytest.raises(LayoutError, match=r"unknown attention 'fast' \(known: auto, standard, flash\)"):
        Program(g, lay, attention="fast")


def _residuals(f, *args):
    import contextlib
    import io

    from jax.ad_checkpoint import print_saved_residuals

    with contextlib.redirect_stdout(io.StringIO()) as out:
        print_saved_residuals(f, *args)
    return out.getvalue().splitlines()


def test_backward_passes_keep_what_the_ir_backward_ops_read():
    """Softmax keeps its output, layer norm, GeLU/SiLU/exp and cross-entropy their inputs, as the IR's derived
    backward ops read them (and as the cost model counts): JAX's own derivatives keep intermediates besides
    (softmax: exp's output too, a second seq x kv_seq tensor per attention core, the 0.5 GiB per layer an H200
    showed, bench/RESULTS_device.md). Their gradients are JAX's own (float32, to rounding)."""
    from layoutsearch.backend import program as P

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(4, 6, 8)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(4, 6, 8)), jnp.float32)
    w2 = w[..., 0]
    labels = jnp.asarray(rng.integers(0, 8, size=(4, 6)), jnp.int32)  # a constant: not among the residuals
    gelu = P.ELEMENTWISE_IMPL["gelu"]
    cases = {  # ours, JAX's own, the residuals ours keeps
        "softmax": (lambda a: P._softmax(a, 2), lambda a: jax.nn.softmax(a, axis=2), ["f32[4,6,8]"]),
        "layer norm": (lambda a: P._layer_norm(a, 2, 1e-5, True), lambda a: P._normalized(a, 2, 1e-5, True)[0],
                       ["f32[4,6,8]"]),
        "rms norm": (lambda a: P._layer_norm(a, 1, 1e-5, False), lambda a: P._normalized(a, 1, 1e-5, False)[0],
                     ["f32[4,6,8]"]),
        "gelu": (gelu, lambda a: jax.nn.gelu(a, approximate=True), ["f32[4,6,8]"]),
        "silu": (P.ELEMENTWISE_IMPL["silu"], jax.nn.silu, ["f32[4,6,8]"]),
        "exp": (P.ELEMENTWISE_IMPL["exp"], jnp.exp, ["f32[4,6,8]"]),
        "cross-entropy": (lambda a: P._cross_entropy(a, labels), lambda a: P._cross_entropy_loss(a, labels),
                          ["f32[4,6,8]"]),
    }
    for name, (ours, theirs, kept) in cases.items():
        loss = lambda f: lambda a: jnp.sum(f(a) * (w if f(a).ndim == 3 else w2))  # noqa: E731
        lines = [line for line in _residuals(loss(ours), x) if "from a constant" not in line]  # not w
        assert sorted(line.split()[0] for line in lines) == sorted(kept), (name, lines)
        np.testing.assert_allclose(jax.grad(loss(ours))(x), jax.grad(loss(theirs))(x), rtol=2e-5, atol=2e-6,
                                   err_msg=name)
        np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-6, atol=1e-7, err_msg=name)
    theirs = [line for line in _residuals(loss(lambda a: jax.nn.softmax(a, axis=2)), x) if "constant" not in line]
    assert len(theirs) > 1  # what JAX's own softmax keeps (its output-only rule is behind a flag, off by default)


@pytest.mark.parametrize("spec", ["bsd,df->bsf", "bskgd,btkd->bkgst", "bkgst,btkd->bskgd", "bsf,df->bds",
                                  "bkgst,bskgd->btkd", "xy,yz->zx", "bhst,bthd->bshd"])
def test_matmul_is_the_einsum(spec):
    """One ``dot_general`` (transposes on the smaller tensors) computes the einsum, whatever the dims' order."""
    from layoutsearch.backend.program import matmul

    (a, b), out = spec.split("->")[0].split(","), spec.split("->")[1]
    sizes = dict(zip("bsdfkgthxyz", (2, 5, 3, 4, 2, 3, 5, 2, 3, 4, 5), strict=True))
    rng = np.random.default_rng(1)
    x, y = (jnp.asarray(rng.normal(size=[sizes[c] for c in t]), jnp.float32) for t in (a, b))
    np.testing.assert_allclose(matmul((x, list(a)), (y, list(b)), list(out)), jnp.einsum(spec, x, y),
                               rtol=1e-5, atol=1e-5)
    if (out[-1] in a) != (out[-1] in b):  # without it in the output, that dim is summed in one operand only
        assert matmul((x, list(a)), (y, list(b)), list(out)[:-1]) is None


def test_grouped_query_scores_are_never_transposed():
    """Grouped-query attention's seq x kv_seq tensors come out of their matmuls in the graph's order, forward
    and backward: no transpose of one in the program JAX emits (``jnp.einsum`` transposed the scores, and
    the backward pass again, seq x kv_seq copies an H200 ran as kernels of their own,
    bench/RESULTS_device.md); the small operands are transposed instead."""
    import re

    seq = 32
    g = small(seq=seq, kv_heads=2, mlp="swiglu", position="rotary")
    text = Program(g, ls.Layout.from_rules("data:8", "batch:data"), attention="standard").lowered_text()
    transposes = [line for line in text.splitlines() if "stablehlo.transpose" in line]
    assert transposes and not [t for t in transposes if re.search(rf"{seq}x(\d+x)?{seq}x", t.split("->")[0])]


def test_state_is_placed_by_the_layout_and_advances():
    g = small()
    lay = ls.Layout.from_rules("data:2,model:4", "batch:data,d_ff:model,heads:model,d_model:data")
    program = Program(g, lay)  # mixed precision: float32 master weights
    state = program.init(0)
    wi = g.tensors["layer.0/wi"]
    assert state.params["layer.0/wi"].dtype == jnp.float32
    assert state.params["layer.0/wi"].sharding.spec == lay.partition_spec(wi)
    assert program.shardings["layer.0/wi"] == lay.partition_spec(wi)
    mu = state.opt_state[0].mu["layer.0/wi"]
    assert mu.sharding.spec == lay.partition_spec(wi)
    batch = program.random_batch(0)
    assert batch["ids"].sharding.spec == lay.partition_spec(g.tensors["ids"])
    state, _ = program.train_step(state, batch)
    state, _ = program.train_step(state, batch)
    assert int(state.step) == 2 and int(state.opt_state[0].count) == 2  # bias correction advances
    assert state.params["layer.0/wi"].sharding.spec == lay.partition_spec(wi)


def test_optax_optimizer_with_a_schedule_matches_a_plain_loop():
    g = small()
    # SGD with momentum, weight decay and a schedule (linear in the gradients, so float32 reassociation stays
    # small; Adam would amplify it where a gradient is ~0, e.g. the key bias's, which is exactly 0)
    tx = optax.chain(optax.add_decayed_weights(0.1), optax.sgd(optax.linear_schedule(0.1, 0.01, 3), momentum=0.9))
    program = Program(g, ls.Layout.from_rules("data:2,model:4", "batch:data,d_ff:model"), precision="fp32",
                      optimizer=tx)
    state = program.init(0)
    params, opt = init_params(g, 0), tx.init(init_params(g, 0))
    f = forward_fn(g)
    for i in range(3):
        state, m = program.train_step(state, program.random_batch(i))
        loss, grads = jax.value_and_grad(f)(params, random_inputs(g, i))
        updates, opt = tx.update(grads, opt, params)
        params = optax.apply_updates(params, updates)
        assert float(m["loss"]) == pytest.approx(float(loss), rel=2e-5)
    for k, v in program.params(state).items():
        np.testing.assert_allclose(np.asarray(v), np.asarray(params[k]), rtol=1e-4, atol=1e-6, err_msg=k)


def test_inspection():
    program = Program(small(), ls.Layout.from_rules("data:8", "batch:data"), precision="fp32")
    assert "all-reduce" in program.compiled_text()  # the data-parallel gradient reduction
    assert "sharding" in program.lowered_text()
    mem = program.memory_analysis()
    assert mem["argument"] > 0 and set(mem) == {"argument", "output", "temp", "alias"}
    state = program.init(0)
    assert float(program.loss(state.params, program.random_batch(0))) > 0


def test_program_refusals():
    g = small()
    with pytest.raises(LayoutError, match="one data axis"):
        Program(g, ls.Layout.from_rules("stage:2,data:2,fsdp:2", "batch:data+fsdp"), stage_axis="stage",
                microbatches=2)
    with pytest.raises(LayoutError, match="batch only"):
        Program(g, ls.Layout.from_rules("stage:2,data:4", "batch:data,d_model:data"), stage_axis="stage",
                microbatches=2)
    with pytest.raises(LayoutSearchError, match="training graph"):
        Program(ls.training_graph(g), ls.Layout.from_rules("data:8", "batch:data"))
    with pytest.raises(LayoutError, match="3 micro-batches do not divide batch=8"):
        Program(g, ls.Layout.from_rules("data:8", "batch:data"), microbatches=3)


def _leaky_attention(leak: bool, split: bool = False):
    """One attention core (scores, softmax, context); with ``leak``, the scores also feed an op outside it;
    with ``split``, the scores are in one block and the softmax and context in the next."""
    import contextlib

    from layoutsearch.ir.builder import GraphBuilder

    b = GraphBuilder("leaky-attention")
    batch, seq, kv, d, dk = (b.dim(n, s) for n, s in (("batch", 8), ("seq", 4), ("kv_seq", 4), ("d_model", 8),
                                                      ("d_kv", 8)))
    x = b.input("x", [batch, seq, d])
    q = b.einsum([x, b.parameter("wq", [d, dk])], [batch, seq, dk], name="q")
    kx = b.rename(x, seq, kv)
    k, v = (b.einsum([kx, b.parameter(w, [d, dk])], [batch, kv, dk], name=n) for w, n in (("wk", "k"), ("wv", "v")))
    with b.block("layer.0") if split else contextlib.nullcontext():
        scores = b.einsum([q, k], [batch, seq, kv], name="scores")
    with b.block("layer.1") if split else contextlib.nullcontext():
        c = b.einsum([b.softmax(scores, kv, name="probs"), v], [batch, seq, dk], name="context")
    if leak:
        c = b.elementwise("add", [c, b.reduce(scores, [batch, seq], "sum", name="leak")], [batch, seq, dk])
    return b.build(loss=b.reduce(c, [], "mean", name="loss"))


def test_flash_says_which_cores_it_runs_as_standard():
    """A core whose scores are read outside it cannot recompute them: ``flash`` runs it as standard attention,
    and says so, since the cost model prices it as flash."""
    import warnings

    from layoutsearch.backend.program import unflashed_cores

    lay = ls.Layout.from_rules("data:8", "batch:data")
    assert unflashed_cores(_leaky_attention(False)) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Program(_leaky_attention(False), lay, attention="flash")
        Program(_leaky_attention(True), lay, attention="standard")
    assert unflashed_cores(_leaky_attention(True)) == ["context"]
    with pytest.warns(UserWarning, match=r"1 attention core\(s\) run as standard attention.*: context; the cost"):
        Program(_leaky_attention(True), lay, attention="flash")
    split = _leaky_attention(False, split=True)  # remat runs each block on its own: the core is cut in two
    assert unflashed_cores(split) == [] and unflashed_cores(split, "full") == ["layer.1/context"]
