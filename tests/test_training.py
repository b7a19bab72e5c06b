"""The derived training graph: gradients equal jax.grad, updates equal SGD/Adam, conventions hold."""

import jax
import numpy as np
import pytest
from cases import GPT_VARIANTS

from layoutsearch import zoo
from layoutsearch.backend.program import forward_fn, init_params, random_inputs, run_graph
from layoutsearch.errors import GraphError
from layoutsearch.ir import (
    ELEMENTWISE_FNS,
    Elementwise,
    Graph,
    GraphBuilder,
    Optimizer,
    Tensor,
    graph_from_json,
    graph_to_json,
    training_graph,
)
from layoutsearch.ir.ops import UNARY_GRAD
from layoutsearch.zoo import list_models

# float32 on both sides, but different summation orders (our einsums/scatters vs
# jax's transposes): agreement to a few ulps of the largest terms, not bitwise.
# ATOL is for unit-scale arrays and scales with the array's largest entry (an
# entry that sums large terms of both signs keeps their absolute rounding error).
RTOL, ATOL = 1e-5, 1e-6


def assert_close(actual, desired, what: str = "") -> None:
    desired = np.asarray(desired)
    scale = max(1.0, float(np.max(np.abs(desired), initial=0.0)))
    np.testing.assert_allclose(actual, desired, rtol=RTOL, atol=ATOL * scale, err_msg=what)


def run_both(fwd: Graph, optimizer: Optimizer | str = "sgd", seed: int = 0, state=None, inputs=None):
    """Run the derived training graph and jax.grad of the forward graph (one jit)."""
    train = training_graph(fwd, optimizer)
    params = init_params(fwd, seed)
    inputs = random_inputs(fwd, seed) if inputs is None else inputs
    state = init_params(train, seed) if state is None else state
    state = {k: v for k, v in state.items() if k not in params}
    wanted = [n for n in train.tensors if n.startswith("grad/") or train.tensors[n].updates]

    def both(p, x, s):
        env = run_graph(train, {**p, **x, **s})
        return {n: env[n] for n in wanted}, jax.grad(forward_fn(fwd))(p, x)

    derived, ref = jax.jit(both)(params, inputs, state)
    return train, params, state, derived, ref


def assert_grads_match(fwd: Graph, **kw) -> Graph:
    train, _, _, derived, ref = run_both(fwd, **kw)
    assert set(ref) == {p.name for p in fwd.parameters}
    for p in ref:
        assert_close(derived[f"grad/{p}"], ref[p], f"grad/{p}")
    return train


# -- small graphs covering every gradient rule -----------------------------------------------------

def einsum_graph() -> Graph:
    b = GraphBuilder("einsums")
    for n, s in {"b": 3, "i": 4, "j": 5, "k": 2, "h": 6}.items():
        b.dim(n, s)
    x = b.input("x", ["b", "i"])
    w, q, s = b.parameter("w", ["i", "j"]), b.parameter("q", ["j", "k"]), b.parameter("s", ["h", "k"])
    r, t = b.parameter("r", ["k"]), b.parameter("t", ["k", "b"])
    y1 = b.einsum([x, w], ["b", "j"], name="contract")               # contraction i, outer b and j
    e2 = b.einsum([y1, q], ["j", "b", "k"], name="batch_outer")      # batch j, outer b and k
    e3 = b.einsum([e2, s], ["b", "k"], name="only_summed")           # j only in e2, h only in s
    e4 = b.einsum([e3, r, t], ["b"], name="three")                   # three inputs, k contracted in all
    e5 = b.einsum([e2], ["k", "j"], name="single")                   # one input: sum over b, transpose
    e6 = b.einsum([w], ["j", "i"], name="transpose")                 # one input, no sum
    loss = b.reduce(e4, [], fn="mean") + b.reduce(b.square(e5), [], fn="sum") + b.reduce(
        b.einsum([e6, x], ["b"], name="use_t"), [], fn="sum")
    return b.build(loss)


def broadcast_graph() -> Graph:
    b = GraphBuilder("broadcast")
    b.dim("m", 3), b.dim("n", 4)
    a, v, c = b.parameter("a", ["m", "n"]), b.parameter("v", ["n"]), b.parameter("c", ["m"])
    x = b.input("x", ["n", "m"])
    s1 = a + v                                   # rhs broadcast over m
    s2 = c - s1                                  # lhs broadcast over n
    s3 = s2 * x                                  # other input's dims permuted
    s4 = s3 / b.unary("exp", v)                  # rhs broadcast in div
    s5 = v / b.unary("exp", a)                   # lhs broadcast in div, output [n, m]
    s6 = a * a                                   # one tensor twice
    s7 = b.elementwise("identity", [v], ["m", "n"])          # broadcast by identity
    s8 = b.elementwise("identity", [a], ["n", "m"])          # transpose by identity
    s9 = -b.scale(c, 0.5)
    total = b.elementwise("add", [s4, s5], ["m", "n"]) + s6 + s7 * x + s8 + s9
    return b.build(b.reduce(b.square(total), [], fn="mean"))


UNARY = sorted(f for f, spec in ELEMENTWISE_FNS.items()
               if spec.arity == 1 and (f in UNARY_GRAD or f in ("identity", "neg", "scale")))


def unary_graph() -> Graph:
    b = GraphBuilder("unary")
    b.dim("m", 3), b.dim("n", 5)
    w = b.input("w", ["m", "n"])
    terms = []
    for fn in UNARY:
        p = b.parameter(f"p_{fn}", ["m", "n"])
        arg = b.unary("exp", p) if fn in ("log", "sqrt", "rsqrt") else p   # positive domain
        params = {"factor": -1.5} if fn == "scale" else {}
        terms.append(b.unary(fn, arg, **params) * w)
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return b.build(b.reduce(total, [], fn="sum"))


def reduce_graph() -> Graph:
    b = GraphBuilder("reduce")
    b.dim("a", 3), b.dim("b", 4), b.dim("c", 5)
    p, v = b.parameter("p", ["a", "b", "c"]), b.parameter("v", ["a"])
    w1, w2, w3 = b.input("w1", ["c", "a"]), b.input("w2", ["b"]), b.input("w3", ["a", "b"])
    r_sum = b.reduce(p, ["c", "a"], fn="sum")
    r_mean = b.reduce(p, ["b"], fn="mean")
    r_max = b.reduce(p, ["a", "b"], fn="max")
    ties = b.reduce(b.elementwise("identity", [v], ["a", "b"]), ["a"], fn="max")   # every entry tied
    keep = b.reduce(p, ["a", "b", "c"], fn="sum")                                   # reduces nothing
    loss = (b.reduce(r_sum * w1, [], fn="sum") + b.reduce(r_mean * w2, [], fn="sum")
            + b.reduce(r_max * w3, [], fn="sum") + b.reduce(b.square(ties), [], fn="sum")
            + b.reduce(b.square(keep), [], fn="mean"))
    return b.build(loss)


def norm_graph() -> Graph:
    b = GraphBuilder("norms")
    b.dim("b", 4), b.dim("d", 3), b.dim("e", 6)
    x, t1, t2 = b.input("x", ["b", "d"]), b.input("t1", ["b", "e"]), b.input("t2", ["e", "b"])
    w = b.parameter("w", ["d", "e"])
    h = b.einsum([x, w], ["b", "e"])
    loss = b.reduce(b.softmax(h, "e") * t1, [], fn="sum") + b.reduce(b.layer_norm(h, "e") * t2, [], fn="sum")
    return b.build(loss)


def rms_norm_graph() -> Graph:
    """RMSNorm (a layer norm without centring) over a dim that is not the last, and a layer norm beside it."""
    b = GraphBuilder("rms")
    b.dim("b", 4), b.dim("d", 3), b.dim("e", 6)
    x, t1, t2 = b.input("x", ["b", "d"]), b.input("t1", ["e", "b"]), b.input("t2", ["b", "e"])
    w = b.parameter("w", ["d", "e"])
    h = b.einsum([x, w], ["e", "b"])
    rms = b.layer_norm(h, "e", eps=1e-3, center=False)
    loss = b.reduce(rms * t1, [], fn="sum") + b.reduce(b.square(b.layer_norm(rms, "e")) * t2, [], fn="sum")
    return b.build(loss)


def reshape_graph() -> Graph:
    b = GraphBuilder("reshape")
    for n, s in {"a": 6, "b": 4, "a1": 2, "a2": 3, "c": 8, "a3": 3, "z": 24}.items():
        b.dim(n, s)
    p = b.parameter("p", ["a", "b"])
    s = b.split(p, "a", ["a1", "a2"])                          # [a1, a2, b]
    m = b.reshape(s, [(["b", "a1"], ["c"]), (["a2"], ["a3"])])  # merge + rename in one op
    flat = b.merge(b.relu(p), ["b", "a"], "z")                 # merge against the dim order
    w1, w2 = b.input("w1", ["a3", "c"]), b.input("w2", ["z"])
    loss = b.reduce(b.square(m) * w1, [], fn="sum") + b.reduce(flat * w2, [], fn="sum")
    return b.build(loss)


def lm_graph() -> Graph:
    b = GraphBuilder("lm")
    b.dim("vocab", 5), b.dim("d", 3), b.dim("f", 4), b.dim("b", 4), b.dim("s", 3)
    table, w, u = b.parameter("table", ["vocab", "d"]), b.parameter("w", ["d", "f"]), b.parameter("u", ["f", "d"])
    ids, labels = b.input("ids", ["b", "s"], "int32"), b.input("labels", ["s", "b"], "int32")
    emb = b.gather(table, ids, "vocab")                                # [b, s, d]; repeated ids
    h = emb + b.einsum([b.relu(b.einsum([emb, w], ["b", "s", "f"])), u], ["b", "s", "d"])   # residual
    logits = b.einsum([h, table], ["b", "vocab", "s"])                 # tied table: two consumers
    return b.build(b.reduce(b.cross_entropy(logits, labels, "vocab"), [], fn="mean"))


def stop_graph() -> Graph:
    """A parameter used thrice, an unused one, and one reaching the loss only through ``eq``."""
    b = GraphBuilder("stop")
    b.dim("n", 4)
    p, z = b.parameter("p", ["n"]), b.parameter("z", ["n"])
    b.parameter("unused", ["n"])
    x = b.input("x", ["n"])
    mask = b.binary("eq", z, x)
    y = b.unary("tanh", p) * p + b.unary("sigmoid", p) + mask
    return b.build(b.reduce(y, [], fn="sum"))


GRAPHS = [einsum_graph, broadcast_graph, unary_graph, reduce_graph, norm_graph, rms_norm_graph, reshape_graph,
          lm_graph, stop_graph]


@pytest.mark.parametrize("build", GRAPHS, ids=lambda f: f.__name__)
def test_derived_gradients_equal_jax_grad(build):
    assert_grads_match(build())


def test_small_graphs_cover_every_op_kind_and_differentiable_function():
    fwd = [f() for f in GRAPHS]
    kinds = {op.kind for g in fwd for op in g.ops}
    assert kinds == {"einsum", "elementwise", "reduce", "softmax", "layer_norm", "reshape", "gather", "cross_entropy"}
    fns = {op.fn for g in fwd for op in g.ops if isinstance(op, Elementwise)}
    assert fns >= {"add", "sub", "mul", "div", "eq", *UNARY}
    assert {op.fn for g in fwd for op in g.ops if op.kind == "reduce"} == {"sum", "mean", "max"}
    train_kinds = {op.kind for g in fwd for op in training_graph(g).ops}
    assert train_kinds >= {"softmax_grad", "layer_norm_grad", "scatter_add", "cross_entropy_grad"}


def test_gather_ids_repeat_so_scatter_add_accumulates():
    ids = np.asarray(random_inputs(lm_graph())["ids"]).ravel()
    assert len(set(ids.tolist())) < len(ids)


def test_unused_parameter_gets_zero_gradient_and_eq_stops_gradients():
    train = assert_grads_match(stop_graph())
    for name in ("grad/unused", "grad/z"):
        op = train.producer(name)
        assert isinstance(op, Elementwise) and op.fn == "fill" and op.param == {"value": 0.0}
    sums = [op.output for op in train.ops if op.output == "grad/p" or op.output.startswith("grad/p/add")]
    assert sums == ["grad/p/add1", "grad/p"]                     # three contributions, two adds


def test_seed_is_a_fill_of_one_on_the_loss():
    train = training_graph(einsum_graph())
    seed = train.producer(f"grad/{train.loss}")
    assert isinstance(seed, Elementwise) and seed.fn == "fill" and seed.inputs == (train.loss,)
    assert seed.param == {"value": 1.0} and seed.phase == "backward"


# -- optimizers ------------------------------------------------------------------------------------

def test_sgd_update_matches_reference():
    opt = Optimizer("sgd", lr=0.05)
    train, params, _, derived, ref = run_both(lm_graph(), opt)
    for p, v in params.items():
        assert_close(derived[f"new/{p}"], np.asarray(v) - 0.05 * np.asarray(ref[p]), f"new/{p}")
        t = train.tensors[f"new/{p}"]
        assert (t.role, t.updates, t.dims, t.dtype) == ("parameter", p, train.tensors[p].dims, "float32")
    assert train.meta["training"] == {"optimizer": {"kind": "sgd", "lr": 0.05}}


def test_adam_update_with_bias_correction_matches_reference():
    opt = Optimizer("adam", lr=0.01, b1=0.8, b2=0.95, eps=1e-6, step=3)
    fwd = norm_graph()
    rng = np.random.default_rng(1)
    state = {}
    for p in fwd.parameters:
        shape = [d.size for d in p.dims]
        state[f"adam_m/{p.name}"] = rng.standard_normal(shape).astype(np.float32) * 0.1
        state[f"adam_v/{p.name}"] = rng.random(shape).astype(np.float32) * 0.01
    train, params, _, derived, ref = run_both(fwd, opt, state=state)
    for p, v in params.items():
        g, m0, v0 = np.asarray(ref[p], np.float64), state[f"adam_m/{p}"], state[f"adam_v/{p}"]
        m = 0.8 * m0 + 0.2 * g
        vv = 0.95 * v0 + 0.05 * g * g
        mhat, vhat = m / (1 - 0.8**3), vv / (1 - 0.95**3)
        new = np.asarray(v, np.float64) - 0.01 * mhat / (np.sqrt(vhat) + 1e-6)
        assert_close(derived[f"new/adam_m/{p}"], m, f"new/adam_m/{p}")
        assert_close(derived[f"new/adam_v/{p}"], vv, f"new/adam_v/{p}")
        assert_close(derived[f"new/{p}"], new, f"new/{p}")
        for s in ("adam_m", "adam_v"):
            assert train.tensors[f"{s}/{p}"].role == "optimizer_state"
            assert train.tensors[f"new/{s}/{p}"].updates == f"{s}/{p}"
    assert train.meta["training"]["optimizer"] == {"kind": "adam", "lr": 0.01, "b1": 0.8, "b2": 0.95,
                                                   "eps": 1e-6, "step": 3}


def test_optimizer_accepts_names_and_rejects_bad_settings():
    assert Optimizer.of("sgd") == Optimizer("sgd")
    for bad in ({"kind": "lamb"}, {"lr": 0.0}, {"b1": 1.0}, {"step": 0}, {"eps": -1.0}):
        with pytest.raises(GraphError):
            Optimizer(**bad)
    with pytest.raises(GraphError, match="unknown optimizer"):
        training_graph(norm_graph(), "adagrad")


# -- conventions -----------------------------------------------------------------------------------

def blocked_graph() -> Graph:
    b = GraphBuilder("blocked", dtype="bfloat16")
    b.dim("b", 4), b.dim("d", 8), b.dim("f", 16)
    h = b.input("x", ["b", "d"])
    for i in range(2):
        with b.block(f"layer.{i}"):
            w, v = b.parameter("w", ["d", "f"]), b.parameter("v", ["f", "d"])
            ff = b.einsum([b.relu(b.einsum([h, w], ["b", "f"], name="mm")), v], ["b", "d"])
            h = b.binary("add", h, ff, name="residual")
    return b.build(b.reduce(b.square(h), [], fn="mean"), meta={"model": "blocked"})


def test_gradients_have_the_tensor_dims_dtype_and_role():
    fwd = blocked_graph()
    train = training_graph(fwd)
    grads = [t for t in train.tensors.values() if t.name.startswith("grad/")]
    assert {t.role for t in grads} == {"gradient"}
    for t in grads:
        src = train.tensors.get(t.name[len("grad/"):])
        if src is not None:
            assert (t.dims, t.dtype) == (src.dims, src.dtype)
    for p in fwd.parameters:
        assert f"grad/{p.name}" in train.tensors
        assert train.tensors[f"adam_m/{p.name}"].dtype == "float32"
        assert train.tensors[f"new/{p.name}"].dtype == "bfloat16"
    assert {t.name for t in train.parameters} == {p.name for p in fwd.parameters}
    states = {f"{s}/{p.name}" for p in fwd.parameters for s in ("adam_m", "adam_v")}
    assert {t.name for t in train.fed} == {t.name for t in fwd.fed} | states


def test_a_new_value_must_match_the_tensor_it_updates():
    train = training_graph(norm_graph(), "sgd")
    tensors = dict(train.tensors)
    tensors["new/w"] = Tensor("new/w", tuple(reversed(tensors["w"].dims)), role="parameter", updates="w")
    with pytest.raises(GraphError, match="differs in dims or dtype"):
        Graph("bad", tensors.values(), train.ops, loss=train.loss)


def test_phases_and_blocks_follow_the_forward_ops():
    fwd = blocked_graph()
    train = training_graph(fwd)
    assert train.ops[: len(fwd.ops)] == fwd.ops
    assert {op.phase for op in train.ops[len(fwd.ops):]} == {"backward", "optimizer"}
    assert train.op("grad/layer.1/w").block == "layer.1"              # dW einsum of layer.1's matmul
    assert train.op("grad/layer.0/mm").block == "layer.0"
    assert train.op("new/layer.0/w").phase == "optimizer" and train.op("new/layer.0/w").block == "layer.0"
    # the residual stream between the layers sums two contributions, in the producer's block
    total = train.op("grad/layer.0/residual")
    assert total.block == "layer.0" and total.fn == "add" and total.phase == "backward"
    assert train.meta["model"] == "blocked" and fwd.meta == {"model": "blocked"}


def test_training_graph_is_deterministic_and_round_trips_json():
    fwd = lm_graph()
    train = training_graph(fwd, "adam")
    assert training_graph(fwd, "adam") == train
    assert graph_from_json(graph_to_json(train)) == train


def test_rejects_graphs_without_loss_or_already_trained_or_without_gradient_rule():
    b = GraphBuilder("noloss")
    b.dim("n", 2)
    b.relu(b.parameter("p", ["n"]))
    with pytest.raises(GraphError, match="no loss"):
        training_graph(b.build())
    with pytest.raises(GraphError, match="already a training graph"):
        training_graph(training_graph(norm_graph()))
    b = GraphBuilder("second-order")
    b.dim("n", 2)
    p, x = b.parameter("p", ["n"]), b.input("x", ["n"])
    with pytest.raises(GraphError, match="no gradient rule for elementwise function 'relu_grad'"):
        training_graph(b.build(b.reduce(b.binary("relu_grad", p, x), [], fn="sum")))


# -- the zoo ---------------------------------------------------------------------------------------

ZOO_SMALL = {"layers": 1, "batch": 2}


@pytest.mark.parametrize("model", [m.name for m in list_models()])
def test_zoo_gradients_equal_jax_grad(model):
    spec = next(m for m in list_models() if m.name == model)
    fwd = zoo.build(model, **{k: v for k, v in ZOO_SMALL.items() if k in spec.params})
    assert_grads_match(fwd)


@pytest.mark.parametrize("variant", list(GPT_VARIANTS))
def test_gpt_variant_gradients_equal_jax_grad(variant):
    """Llama-style (SwiGLU, GQA, RMSNorm, rotary, no bias, untied), PaLM-style (parallel block) and
    multi-query GPTs: the derived backward pass is jax.grad of the forward."""
    fwd = zoo.build("gpt", **{**GPT_VARIANTS[variant], "batch": 2})
    train = assert_grads_match(fwd)
    if GPT_VARIANTS[variant].get("norm") == "rmsnorm":
        assert all(not op.center for op in train.ops if op.kind in ("layer_norm", "layer_norm_grad"))


# -- dropout ---------------------------------------------------------------------------------------------------------

def test_dropout_gradients_equal_jax_grad_and_masks_are_seeded_per_layer_and_site():
    """Dropout is ``mul(x, dropout_mask(x))``: the derived backward pass multiplies by the same mask (no
    gradient flows into it), and equals jax.grad of the forward, whose masks come from fixed seeds."""
    rate = 0.3
    fwd = zoo.build("gpt", batch=2, layers=2, dropout=rate)
    train = assert_grads_match(fwd)
    masks = [op for op in fwd.ops if isinstance(op, Elementwise) and op.fn == "dropout_mask"]
    assert [op.name for op in masks] == [f"layer.{i}/{s}_dropout_mask" for i in range(2)
                                         for s in ("attn_probs", "attn_out", "ff_out")]
    assert sorted(op.param["seed"] for op in masks) == [0, 1, 2, 3, 4, 5]
    for op in masks:
        assert not any(n.startswith(f"grad/{op.output}") for n in train.tensors)
        assert fwd.tensors[op.output].dims == fwd.tensors[op.inputs[0]].dims
    feeds = {**init_params(fwd), **random_inputs(fwd)}
    env = jax.jit(lambda f: {op.output: run_graph(fwd, f)[op.output] for op in masks})(feeds)
    again = jax.jit(lambda f: {op.output: run_graph(fwd, f)[op.output] for op in masks})(feeds)
    seen = []
    for op in masks:
        m = np.asarray(env[op.output])
        np.testing.assert_array_equal(m, np.asarray(again[op.output]))   # deterministic
        assert set(np.unique(m).tolist()) == {0, 1} and m.dtype == np.uint8  # a byte mask; the scale follows
        assert abs(np.mean(m > 0) - (1 - rate)) < 0.05                    # 1024 or 2048 draws
        seen.append((m > 0).ravel()[:1024])
    assert len({s.tobytes() for s in seen}) == len(seen)                  # every site and layer draws its own


def test_dropout_rate_and_seed_are_checked():
    for params, match in (({"rate": 1.0, "seed": 0}, r"dropout rate must be in \[0, 1\), got 1.0"),
                          ({"rate": -0.1, "seed": 0}, r"dropout rate must be in \[0, 1\), got -0.1"),
                          ({"rate": 0.1, "seed": 1.5}, "dropout seed must be an integer"),
                          ({"rate": 0.1}, r"takes attributes \['rate', 'seed'\]")):
        b = GraphBuilder("drop")
        b.dim("n", 4)
        x = b.parameter("x", ["n"])
        with pytest.raises(GraphError, match=match):
            b.build(b.reduce(x * b.unary("dropout_mask", x, **params), [], fn="sum"))
    b = GraphBuilder("drop")
    b.dim("n", 4), b.dim("m", 2)
    x = b.parameter("x", ["n"])
    with pytest.raises(GraphError, match="dropout_mask output must have the dims of its input"):
        b.build(b.reduce(b.elementwise("dropout_mask", [x], ["n", "m"], rate=0.1, seed=0), [], fn="sum"))
    b = GraphBuilder("drop")
    b.dim("n", 4)
    x = b.parameter("x", ["n"])
    kept = b.unary("dropout_mask", x, rate=0.0, seed=7)                  # rate 0 keeps everything
    g = b.build(b.reduce(x * kept, [], fn="sum"))
    np.testing.assert_array_equal(np.asarray(run_graph(g, init_params(g))[kept.name]), np.ones(4, np.float32))


@pytest.mark.parametrize("name", [m.name for m in list_models()])
def test_a_resized_training_graph_is_the_training_graph_of_the_resized_model(name):
    """resized_training_graph (how a micro-batch's training step is made from the whole batch's) gives what
    deriving the micro-batch's training graph afresh gives: the same ops (a mean's gradient scaled by its
    own count), tensors and meta; None where the derivation would emit other ops (a count that becomes 1)."""
    from layoutsearch.ir.precision import Precision
    from layoutsearch.ir.training import resized_training_graph

    fwd = zoo.build(name)
    if "batch" not in fwd.dims:
        pytest.skip(f"{name} has no batch dim")
    sizes = [{"batch": fwd.dims["batch"] // k} for k in sorted({2, fwd.dims["batch"]}) if fwd.dims["batch"] % k == 0]
    for opt, precision in (("adam", Precision.of("mixed")), ("sgd", None)):
        train = training_graph(fwd, opt, precision)
        for new in sizes:
            small = fwd.with_sizes(new)
            got = resized_training_graph(train, fwd, new)
            means = [op for op in fwd.ops if getattr(op, "fn", None) == "mean"]
            if got is None:  # only where some mean's count changes to 1
                assert any(small.tensors[op.output].num_elements == small.tensors[op.inputs[0]].num_elements
                           for op in means), (name, new)
                continue
            want = training_graph(small, opt, precision)
            assert got.ops == want.ops, (name, new, opt)
            assert got.tensors == want.tensors and got.meta == want.meta and got.loss == want.loss


@pytest.mark.parametrize("name", [m.name for m in list_models()])
def test_a_micro_batchs_fusion_plan_is_the_one_found_afresh(name):
    """The fusion plan of a micro-batch's training step, taken from the whole batch's (fusion._resized_plan:
    it reads no size but which einsums are matmuls), equals the one computed for that graph afresh; batch 1
    (where a weight gradient's contraction over the batch may fall below a matmul's) included."""
    from layoutsearch.costmodel import fusion
    from layoutsearch.costmodel.flops import is_matmul
    from layoutsearch.costmodel.step import resized, training_step

    fwd = zoo.build(name)
    if "batch" not in fwd.dims:
        pytest.skip(f"{name} has no batch dim")
    big = training_step(fwd)
    reused = False
    for b in sorted({fwd.dims["batch"] // 2, 1}):
        small = training_step(resized(fwd, {"batch": b}))
        for fused, attention in ((True, "flash"), (True, "standard"), (False, "standard")):
            whole = fusion.fusion_plan(big, fused, attention)
            got = fusion.fusion_plan(small, fused, attention)
            want = fusion._plan(small, fused, attention)
            assert (got.fused, got.on_chip, got.charged, got.writes, got.flash, got.kernels) == (
                want.fused, want.on_chip, want.charged, want.writes, want.flash, want.kernels), (name, b)
            if all(is_matmul(op, small.tensors) == is_matmul(op, big.tensors) for op in small.ops):
                assert got is whole, (name, b)  # (the same matmuls: the whole batch's plan itself)
                reused = True
    assert reused or name in ("mlp", "mtf-ffn"), name  # (tiny models: a contraction over the batch drops below)


@pytest.mark.parametrize("name", [m.name for m in list_models()])
def test_a_micro_batchs_remat_plans_and_lifetimes_are_those_found_afresh(name):
    """A micro-batch's remat plans and live ranges (taken from the whole batch's: they read no size) equal those
    computed for its graph afresh, the ranges' tensors its own (its sizes), under every policy."""
    import numpy as np

    from layoutsearch.costmodel import memory
    from layoutsearch.costmodel.step import resized, training_step
    from layoutsearch.ir.remat import REMAT_POLICIES, block_groups, forward_blocks

    fwd = zoo.build(name)
    if "batch" not in fwd.dims:
        pytest.skip(f"{name} has no batch dim")
    big = training_step(fwd)
    small = training_step(resized(fwd, {"batch": fwd.dims["batch"] // 2}))
    for policy in (*REMAT_POLICIES, *block_groups(len(forward_blocks(big)))):
        plan = memory.remat_plan(small, policy)
        assert plan == memory._remat_plan(small, policy) and plan.points == memory._remat_plan(small, policy).points
        assert plan is memory.remat_plan(big, policy)
        got, want = memory.lifetimes(small, plan), memory._lifetimes(small, plan)
        assert got.tensors == want.tensors and all(t is small.tensors[t.name] for t in got.tensors)
        for f in ("tensor", "cat", "start", "end"):
            assert np.array_equal(getattr(got, f), getattr(want, f)), (name, policy, f)
        assert (got.fed, got.deferrable, got.last_backward) == (want.fed, want.deferrable, want.last_backward)
