"""Importing JAX and Flax functions as graphs (``layoutsearch.importer``, ``layoutsearch import``)."""

from __future__ import annotations

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import layoutsearch as ls
from layoutsearch import zoo
from layoutsearch.backend.program import forward_fn, init_params, random_inputs, run_graph
from layoutsearch.errors import GraphError
from layoutsearch.importer import flax_dims, from_jax, partition_specs
from layoutsearch.ir import ops as ls_ops
from layoutsearch.ir.training import training_graph
from tests.clirun import run, run_json


def _zoo_import(model: str) -> tuple[ls.Graph, ls.Graph]:
    """The hand-built zoo graph and the graph imported from the backend's JAX forward of it."""
    g = zoo.build(model)
    p, i = init_params(g), random_inputs(g)
    dims = ({k: g.tensors[k].dim_names for k in p}, {k: g.tensors[k].dim_names for k in i})
    return g, from_jax(forward_fn(g), p, i, dims=dims)


def _same_costs(a: ls.CostReport, b: ls.CostReport) -> None:
    assert a.bytes_per_axis == b.bytes_per_axis
    assert a.flops_per_device == b.flops_per_device
    assert a.memory.peak_bytes == b.memory.peak_bytes
    assert a.memory.breakdown == b.memory.breakdown
    assert a.step_s == b.step_s


def _operands_in_canonical_order(g: ls.Graph, renamed: dict[str, str]) -> ls.Graph:
    """``g`` with each two-operand einsum's operands sorted by their (renamed) dims."""
    key = lambda t: tuple(sorted(renamed.get(d, d) for d in g.tensors[t].dim_names))
    ops = [dataclasses.replace(op, inputs=tuple(sorted(op.inputs, key=key)))
           if isinstance(op, ls_ops.Einsum) and len(op.inputs) == 2 else op for op in g.ops]
    return ls.Graph(g.name, g.tensors.values(), ops, loss=g.loss, meta=g.meta)


@pytest.mark.parametrize("model, renamed", [
    ("mlp", {}), ("mtf-ffn", {}), ("moe", {"capacity": "dim8"}), ("gpt", {"kv_seq": "seq_2"}),
    ("mtf-transformer", {"kv_seq": "seq_2"})])
@pytest.mark.parametrize("hardware", ["cpu-sim", "tpu-v4", "a100"])
def test_zoo_forward_imports_to_the_same_costs(model: str, renamed: dict, hardware: str) -> None:
    """The zoo models' own JAX forward (the backend's) imported: the same ops, and the same step time,
    bytes per collective, FLOPs and memory as the hand-built graph for every one-dim model split. Dims the
    program does not name get derived names: the MoE's capacity comes from a broadcast (``dim8``), the
    keys' sequence is the queries' renamed where the keys' and values' input branches (``seq_2``; the
    hand-built graphs call it ``kv_seq``). ``jnp.einsum`` chooses the order of a contraction's two operands
    (the IR einsum is commutative, but the derived backward computes the operands' gradients in that order
    and a TPU's tile quantization depends on which operand streams): both graphs are compared with their
    einsum operands in one canonical order."""
    g, h = _zoo_import(model)
    assert set(h.dims) == set(g.dims) - set(renamed) | set(renamed.values())
    assert len(g.ops) == len(h.ops)
    g, h = _operands_in_canonical_order(g, renamed), _operands_in_canonical_order(h, {})
    mesh = ls.Mesh.parse("data:2,model:4")
    for dim in ["batch", *[d for d in g.dims if d != "batch" and g.dims[d] % 4 == 0]]:
        rules = f"batch:data,{dim}:model" if dim != "batch" else "batch:data"
        ours = ",".join(f"{renamed.get(d, d)}:{a}" for d, a in (r.split(":") for r in rules.split(",")))
        _same_costs(ls.estimate(g, ls.Layout.from_rules(mesh, rules), hardware),
                    ls.estimate(h, ls.Layout.from_rules(mesh, ours), hardware))


def _loss_with_new_functions(p, x):
    h = jnp.einsum("bd,df->bf", x, p["w"])
    h = jnp.where(h > 0.1, jax.scipy.special.erf(h), 0.5 * h**3)
    h = jnp.maximum(h, p["floor"]) + 1.5
    return jnp.mean(jax.nn.softmax(h, axis=-1) ** 2 - 1.0 / (2.0 + h**2))


def test_imported_forward_and_derived_gradients_match_jax() -> None:
    """Every primitive of the function (where, erf, integer powers, maximum, shifts, a reciprocal,
    softmax) becomes IR ops whose forward value and derived gradients equal JAX's (float32, rtol 1e-5)."""
    rng = np.random.default_rng(0)
    p = {"w": jnp.asarray(rng.standard_normal((8, 16)), jnp.float32),
         "floor": jnp.asarray(rng.standard_normal(16) * 0.1, jnp.float32)}
    x = jnp.asarray(rng.standard_normal((4, 8)), jnp.float32)
    g = from_jax(_loss_with_new_functions, p, x, dims=({"w": ("d", "f"), "floor": ("f",)}, ("b", "d")))
    fns = {getattr(op, "fn", None) for op in g.ops}
    assert {"where", "erf", "pow", "maximum", "shift", "gt", "softmax"} - fns == {"softmax"}
    assert any(op.kind == "softmax" for op in g.ops)
    feeds = {"w": p["w"], "floor": p["floor"], "x": x}
    np.testing.assert_allclose(run_graph(g, feeds)[g.loss], _loss_with_new_functions(p, x), rtol=1e-5)
    tg = training_graph(g, "sgd", precision="fp32")
    out = run_graph(tg, feeds)
    want = jax.grad(_loss_with_new_functions)(p, x)
    for name in ("w", "floor"):
        np.testing.assert_allclose(out[f"grad/{name}"], want[name], rtol=1e-5, atol=1e-7)


def test_scan_over_layers_unrolls_into_tied_blocks() -> None:
    def loss(ws, x):
        y, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)
        return jnp.sum(y**2)

    g = from_jax(loss, jnp.ones((3, 8, 8)), jnp.ones((4, 8)), dims=(("layers", "d", "d_out"), ("batch", "d")))
    assert [t.name for t in g.parameters] == ["ws[0]", "ws[1]", "ws[2]"]
    assert {op.block for op in g.ops if op.kind == "einsum"} == {"layer.0", "layer.1", "layer.2"}
    assert {t.dim_names for t in g.parameters} == {("d", "d_out")}
    layout = ls.Layout.from_rules(ls.Mesh.parse("data:2,model:4"), "batch:data,d_out:model")
    spec = partition_specs(layout, g, jnp.ones((3, 8, 8)), name="ws")
    assert spec == jax.sharding.PartitionSpec(None, None, "model")


def test_unsupported_primitive_names_it_its_line_and_dims() -> None:
    def loss(p, x):
        return jnp.sum(jnp.sort(x @ p, axis=0))

    with pytest.raises(GraphError) as e:
        from_jax(loss, jnp.ones((8, 4)), jnp.ones((2, 8)), dims=(("d", "f"), ("batch", "d")))
    msg = str(e.value)
    assert "'sort'" in msg and "test_import.py:" in msg and "[batch, f]" in msg
    assert "jaxpr" in "".join(getattr(e.value, "__notes__", []))


@pytest.mark.parametrize("dims, fn, match", [
    ((("d", "f"), ("batch", "f")), lambda p, x: jnp.sum(x @ p), "size"),
    ((("d", "f"),), lambda p, x: jnp.sum(x @ p), "one entry per argument"),
    ((("d", "f"), ("batch", "d")), lambda p, x: x @ p, "scalar"),
])
def test_bad_dims_or_outputs_are_refused(dims, fn, match) -> None:
    with pytest.raises(GraphError, match=match):
        from_jax(fn, jnp.ones((8, 4)), jnp.ones((2, 8)), dims=dims)


def test_a_dim_named_twice_in_one_array_is_refused() -> None:
    with pytest.raises(GraphError, match="appears twice"):
        from_jax(lambda p, x: jnp.sum(x @ p), jnp.ones((8, 8)), jnp.ones((2, 8)), dims=(("d", "d"), ("batch", "d")))


def _apply_back(graph, plan, tree, loss, *args) -> None:
    """The plan's PartitionSpecs applied to the user's own arrays give the unsharded loss (float32
    reassociation: rtol 1e-5)."""
    layout = plan.chosen.layout
    names, sizes = zip(*layout.mesh.axes, strict=True)
    jm = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(sizes), names)
    put = lambda tree, specs: jax.device_put(tree, jax.tree_util.tree_map(
        lambda s: jax.sharding.NamedSharding(jm, s), specs,
        is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)))
    sharded = put(tree, partition_specs(layout, graph, tree))
    inputs = [put(a, partition_specs(layout, graph, a, name=n)) for n, a in args]
    got = jax.jit(loss)(sharded, *inputs)
    np.testing.assert_allclose(got, loss(tree, *(a for _, a in args)), rtol=1e-5)


def _train(plan, steps: int = 3) -> list[float]:
    program = plan.compile()
    state = program.init(0)
    batch = program.random_batch(0)
    losses = []
    for _ in range(steps):
        state, metrics = program.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    return losses


def test_flax_linen_mlp_imports_searches_runs_and_applies_back() -> None:
    import flax.linen as nn

    part = nn.with_logical_partitioning

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(256, kernel_init=part(nn.initializers.lecun_normal(), ("embed", "mlp")),
                         bias_init=part(nn.initializers.zeros, ("mlp",)))(x)
            return nn.Dense(64, kernel_init=part(nn.initializers.lecun_normal(), ("mlp", "embed")),
                            bias_init=part(nn.initializers.zeros, ("embed",)))(nn.relu(h))

    model = MLP()
    x = jax.random.normal(jax.random.key(1), (32, 64))
    y = jax.random.normal(jax.random.key(2), (32, 64))
    boxed = model.init(jax.random.key(0), x)
    params = nn.unbox(boxed)

    def loss(params, x, y):
        return jnp.mean((model.apply(params, x) - y) ** 2)

    graph = from_jax(loss, params, x, y, dims=(flax_dims(boxed), ("batch", "embed"), ("batch", "embed")))
    assert {t.name: t.dim_names for t in graph.parameters}["params/Dense_0/kernel"] == ("embed", "mlp")
    plan = ls.search(graph, "data:2,model:4")
    _train(plan)
    _apply_back(graph, plan, params, loss, ("x", x), ("y", y))


def test_flax_nnx_transformer_block_imports_searches_runs_and_applies_back() -> None:
    from flax import nnx

    part, init = nnx.with_partitioning, nnx.initializers.lecun_normal()

    def norm(d, rngs):
        return nnx.LayerNorm(d, rngs=rngs, scale_init=part(nnx.initializers.ones, ("embed",)),
                             bias_init=part(nnx.initializers.zeros, ("embed",)))

    class Block(nnx.Module):
        def __init__(self, d, heads, ff, rngs):
            self.ln1, self.ln2 = norm(d, rngs), norm(d, rngs)
            self.attn = nnx.MultiHeadAttention(
                num_heads=heads, in_features=d, decode=False, rngs=rngs,
                kernel_init=part(init, ("embed", "heads", "kv")), out_kernel_init=part(init, ("heads", "kv", "embed")),
                bias_init=part(nnx.initializers.zeros, ("heads", "kv")),
                out_bias_init=part(nnx.initializers.zeros, ("embed",)))
            self.up = nnx.Linear(d, ff, rngs=rngs, kernel_init=part(init, ("embed", "mlp")),
                                 bias_init=part(nnx.initializers.zeros, ("mlp",)))
            self.down = nnx.Linear(ff, d, rngs=rngs, kernel_init=part(init, ("mlp", "embed")),
                                   bias_init=part(nnx.initializers.zeros, ("embed",)))

        def __call__(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.down(nnx.gelu(self.up(self.ln2(x))))

    with nnx.use_eager_sharding(False):
        graphdef, state = nnx.split(Block(32, 4, 128, nnx.Rngs(0)))

    def loss(state, x, y):
        return jnp.mean((nnx.merge(graphdef, state)(x) - y) ** 2)

    x = jax.random.normal(jax.random.key(1), (8, 16, 32))
    y = jax.random.normal(jax.random.key(2), (8, 16, 32))
    act = ("batch", "seq", "embed")
    graph = from_jax(loss, state, x, y, dims=(flax_dims(state), act, act))
    assert {"batch", "seq", "embed", "heads", "kv", "mlp"} <= set(graph.dims)
    plan = ls.search(graph, "data:2,model:4")
    _train(plan)
    _apply_back(graph, plan, state, loss, ("x", x), ("y", y))


MODULE = '''
import jax.numpy as jnp

def loss(params, x):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"]) ** 2)
'''


def test_cli_import_writes_a_graph_the_other_commands_take(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "usermodel.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {"args": [{"w1": {"dims": ["d_model", "d_ff"], "shape": [64, 256]},
                      "w2": {"dims": ["d_ff", "d_model"], "shape": [256, 64]}},
                     {"dims": ["batch", "d_model"], "shape": [32, 64]}]}
    (tmp_path / "dims.json").write_text(json.dumps(spec))
    out = tmp_path / "graph.json"
    res = run_json(capsys, "import", "usermodel:loss", "--dims", str(tmp_path / "dims.json"), "--out", str(out))
    assert res["dims"] == {"d_model": 64, "d_ff": 256, "batch": 32}
    assert res["parameters"] == ["w1", "w2"] and res["inputs"] == ["x"]
    cost = run_json(capsys, "cost", str(out), "--mesh", "data:2,model:2", "--layout", "batch:data,d_ff:model")
    assert cost["step_s"] > 0
    sys.modules.pop("usermodel", None)


def test_cli_run_trains_from_the_users_arrays(tmp_path, capsys, monkeypatch) -> None:
    """``import`` a module, ``search`` it, and ``run`` the plan from the user's own parameters and batch
    (``--params`` / ``--batch``, numpy .npz files named as the graph's tensors): the first loss is the user's."""
    (tmp_path / "usermodel2.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {"args": [{"w1": {"dims": ["d_model", "d_ff"], "shape": [64, 256]},
                      "w2": {"dims": ["d_ff", "d_model"], "shape": [256, 64]}},
                     {"dims": ["batch", "d_model"], "shape": [32, 64]}]}
    (tmp_path / "dims.json").write_text(json.dumps(spec))
    try:
        run_json(capsys, "import", "usermodel2:loss", "--dims", str(tmp_path / "dims.json"), "--out",
                 str(tmp_path / "g.json"))
    finally:
        sys.modules.pop("usermodel2", None)
    run_json(capsys, "search", str(tmp_path / "g.json"), "--mesh", "data:2,model:4", "--precision", "fp32",
             "--out", str(tmp_path / "plan.json"))
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((64, 256)) / 8, "w2": rng.standard_normal((256, 64)) / 16}
    x = rng.standard_normal((32, 64)).astype(np.float32)
    np.savez(tmp_path / "p.npz", **params)
    np.savez(tmp_path / "b.npz", x=x)
    res = run_json(capsys, "run", str(tmp_path / "plan.json"), "--steps", "2", "--params", str(tmp_path / "p.npz"),
                   "--batch", str(tmp_path / "b.npz"))
    h = np.tanh(x @ params["w1"].astype(np.float32))
    np.testing.assert_allclose(res["steps"][0]["loss"], np.mean((h @ params["w2"].astype(np.float32)) ** 2), rtol=1e-5)
    (tmp_path / "bad.npz").write_text("not a zip")
    code, _, err = run(capsys, "run", str(tmp_path / "plan.json"), "--steps", "1", "--params", str(tmp_path / "bad.npz"))
    assert code == 2 and "--params" in err and len(err.strip().splitlines()) == 1
    np.savez(tmp_path / "short.npz", w1=params["w1"])
    code, _, err = run(capsys, "run", str(tmp_path / "plan.json"), "--steps", "1", "--params", str(tmp_path / "short.npz"))
    assert code == 2 and "w2" in err


@pytest.mark.parametrize("target, spec, match", [
    ("nosuchmodule_xyz:loss", {"args": []}, "cannot import module"),
    ("json:nosuchfn", {"args": []}, "has no attribute"),
    ("noseparator", {"args": []}, "MODULE:FUNCTION"),
    ("json:dumps", {"arg": []}, "args"),
    ("json:dumps", {"args": [{"dims": ["a"], "shape": [0]}]}, "positive sizes"),
])
def test_cli_import_bad_input_is_one_line_exit_2(tmp_path, capsys, target, spec, match) -> None:
    path = tmp_path / "dims.json"
    path.write_text(json.dumps(spec))
    code, out, err = run(capsys, "import", target, "--dims", str(path))
    assert code == 2 and match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _user_module(folder, name: str) -> None:
    """``folder/NAME.py``: MODULE's loss; a test importing it drops it from sys.modules after."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(MODULE)


SPEC = {"args": [{"w1": {"dims": ["d_model", "d_ff"], "shape": [64, 256]},
                  "w2": {"dims": ["d_ff", "d_model"], "shape": [256, 64]}},
                 {"dims": ["batch", "d_model"], "shape": [32, 64]}]}


def test_cli_import_finds_the_module_in_the_current_directory(tmp_path, capsys, monkeypatch) -> None:
    """``layoutsearch import mymodel:loss`` run from mymodel.py's folder, as ``python -c`` would find it (no
    PYTHONPATH); sys.path is as before after."""
    _user_module(tmp_path, "cwdmodel_imp")
    (tmp_path / "dims.json").write_text(json.dumps(SPEC))
    monkeypatch.chdir(tmp_path)
    path = list(sys.path)
    try:
        res = run_json(capsys, "import", "cwdmodel_imp:loss", "--dims", "dims.json", "--out", "g.json")
    finally:
        sys.modules.pop("cwdmodel_imp", None)
    assert res["dims"] == {"d_model": 64, "d_ff": 256, "batch": 32} and (tmp_path / "g.json").exists()
    assert sys.path == path


def test_cli_import_takes_a_py_file_that_imports_its_neighbours(tmp_path, capsys, monkeypatch) -> None:
    src = tmp_path / "src"
    _user_module(src, "filemodel_helper")
    (src / "filemodel_imp.py").write_text("from filemodel_helper import loss\n")
    (tmp_path / "dims.json").write_text(json.dumps(SPEC))
    monkeypatch.chdir(tmp_path)
    try:
        res = run_json(capsys, "import", "src/filemodel_imp.py:loss", "--dims", "dims.json")
        code, _, err = run(capsys, "import", "src/nosuchfile.py:loss", "--dims", "dims.json")
    finally:
        sys.modules.pop("filemodel_imp", None)
        sys.modules.pop("filemodel_helper", None)
    assert res["parameters"] == ["w1", "w2"] and res["graph"] == "loss"
    assert code == 2 and "no file 'src/nosuchfile.py'" in err


def _import_error(tmp_path, capsys, monkeypatch, module: str, spec: dict) -> str:
    """``layoutsearch import MODULE:loss`` of MODULE's code with ``spec``: a one-line error, exit 2."""
    _user_module(tmp_path, module)
    (tmp_path / "dims.json").write_text(json.dumps(spec))
    monkeypatch.chdir(tmp_path)
    try:
        code, _, err = run(capsys, "import", f"{module}:loss", "--dims", "dims.json")
    finally:
        sys.modules.pop(module, None)
    assert code == 2 and "internal error" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_cli_import_spec_missing_an_entry_names_the_argument(tmp_path, capsys, monkeypatch) -> None:
    spec = {"args": [{"w1": SPEC["args"][0]["w1"]}, SPEC["args"][1]]}
    err = _import_error(tmp_path, capsys, monkeypatch, "missmodel_imp", spec)
    assert "missmodel_imp:loss failed when traced with the shapes from dims.json: KeyError: 'w2'" in err
    assert "argument 'params' has no spec for 'w2'" in err and "missmodel_imp.py:6" in err


def test_cli_import_spec_missing_an_argument_names_it(tmp_path, capsys, monkeypatch) -> None:
    err = _import_error(tmp_path, capsys, monkeypatch, "argmodel_imp", {"args": SPEC["args"][:1]})
    assert "argument 'x' of argmodel_imp:loss has no spec" in err and "takes params, x" in err
    err = _import_error(tmp_path, capsys, monkeypatch, "argmodel_imp", {"args": SPEC["args"] * 2})
    assert "has 4 entries, more than the arguments" in err


def test_cli_import_shape_mismatch_is_a_tracing_failure_of_the_function(tmp_path, capsys, monkeypatch) -> None:
    spec = json.loads(json.dumps(SPEC))
    spec["args"][0]["w1"]["shape"] = [60, 256]
    err = _import_error(tmp_path, capsys, monkeypatch, "shapemodel_imp", spec)
    assert "shapemodel_imp:loss failed when traced with the shapes from dims.json: TypeError: dot_general " in err
    assert "(at shapemodel_imp.py:5: h = jnp.tanh(x @ params[\"w1\"]))" in err


def test_cli_import_internal_bug_is_still_an_internal_error(tmp_path, capsys, monkeypatch) -> None:
    """Only the user's function is excused: a bug of the importer past tracing stays exit 1."""
    from layoutsearch.importer import patterns

    def broken(nodes):
        raise KeyError("bug")

    monkeypatch.setattr(patterns, "rewrite", broken)
    _user_module(tmp_path, "bugmodel_imp")
    (tmp_path / "dims.json").write_text(json.dumps(SPEC))
    monkeypatch.chdir(tmp_path)
    try:
        code, _, err = run(capsys, "import", "bugmodel_imp:loss", "--dims", "dims.json")
    finally:
        sys.modules.pop("bugmodel_imp", None)
    assert code == 1 and "internal error: KeyError: 'bug'" in err


def test_mixed_precision_flax_and_custom_vjp_import() -> None:
    """Flax layers computing in bfloat16 (``dtype=``) cast their float32 parameters: the casts are
    identity ops writing bfloat16 tensors; a ``custom_vjp`` function is inlined (its primal)."""
    import flax.linen as nn

    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.relu(nn.Dense(256, dtype=jnp.bfloat16, name="up")(x))
            return nn.Dense(64, dtype=jnp.bfloat16, name="down")(h)

    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1, 1),))
    model, x = M(), jnp.ones((32, 64))
    params = model.init(jax.random.key(0), x)

    def loss(p, x):
        return jnp.mean(clip_grad(model.apply(p, x).astype(jnp.float32)) ** 2)

    dims = {"params": {"up": {"kernel": ("embed", "mlp"), "bias": ("mlp",)},
                       "down": {"kernel": ("mlp", "embed"), "bias": ("embed",)}}}
    g = from_jax(loss, params, x, dims=(dims, ("batch", "embed")))
    assert {t.dtype for t in g.parameters} == {"float32"}
    einsums = [op for op in g.ops if op.kind == "einsum"]
    assert len(einsums) == 2 and all(g.tensors[op.output].dtype == "bfloat16" for op in einsums)
    casts = [op for op in g.ops if getattr(op, "fn", None) == "identity"]
    assert len(casts) == 6  # x and four parameters to bfloat16, the output back to float32
    feeds = {f"params/{m}/{k}": params["params"][m][k] for m in ("up", "down") for k in ("kernel", "bias")}
    got = run_graph(g, {**feeds, "x": x})[g.loss]
    np.testing.assert_allclose(got, loss(params, x), rtol=1e-2)  # bfloat16 products: 8 bits of mantissa


def test_cli_import_unsupported_primitive_debug_shows_the_jaxpr(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "cummodel.py").write_text("import jax.numpy as jnp\n\ndef loss(w, x):\n"
                                          "    return jnp.sum(jnp.sort(x @ w, axis=0))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {"args": [{"dims": ["d", "f"], "shape": [8, 4]}, {"dims": ["batch", "d"], "shape": [2, 8]}]}
    (tmp_path / "dims.json").write_text(json.dumps(spec))
    code, _, err = run(capsys, "import", "cummodel:loss", "--dims", str(tmp_path / "dims.json"))
    assert code == 2 and "'sort'" in err and "cummodel.py:4" in err and "jaxpr" not in err
    code, _, err = run(capsys, "import", "cummodel:loss", "--dims", str(tmp_path / "dims.json"), "--debug")
    assert code == 2 and "the traced program (jaxpr)" in err and "sort" in err
    sys.modules.pop("cummodel", None)


def test_static_slice_of_an_argument_is_a_tensor_of_its_own() -> None:
    """``pos_embed[:seq]``: the rows a model reads of a longer positional table become a parameter of their
    own whose cut axis takes the name of the axis it is added to; a slice of a computed value is a slice op."""
    def loss(p, x):
        seq = x.shape[1]
        h = x + p["pos_embed"][:seq]
        return jnp.mean(jnp.einsum("bsd,df->bsf", h, p["w"]) ** 2)

    p = {"pos_embed": jnp.ones((64, 8)), "w": jnp.ones((8, 16))}
    x = jnp.ones((2, 16, 8))
    g = from_jax(loss, p, x, dims=({"pos_embed": ("max_len", "d"), "w": ("d", "f")}, ("batch", "seq", "d")))
    view = g.tensors["pos_embed[0:16, 0:8]"]
    assert view.role == "parameter" and view.dim_names == ("seq", "d")
    layout = ls.Layout.from_rules(ls.Mesh.parse("data:2,model:4"), "batch:data,seq:model")
    assert partition_specs(layout, g, p)["pos_embed"] == jax.sharding.PartitionSpec("model", None)
    h = from_jax(lambda p, x: jnp.sum((x @ p)[:, :2]), jnp.ones((8, 4)), jnp.ones((2, 8)),
                 dims=(("d", "f"), ("batch", "d")))
    assert [op.kind for op in h.ops] == ["einsum", "slice", "reduce"]  # of a computed value: a slice op


def test_two_files_of_one_name_and_an_edited_file_import_afresh(tmp_path) -> None:
    """``PATH.py:FUNCTION`` twice in one process: another file of the same name, or the same file edited, is
    imported again (the first was refused as 'the module name is taken', the second came from the cache)."""
    from layoutsearch.importer import from_spec_file

    body = "import jax.numpy as jnp\n\ndef loss(params, x):\n    return jnp.{}(jnp.tanh(x @ params['w']))\n"
    spec = {"args": [{"w": {"dims": ["d_model", "d_ff"], "shape": [16, 32]}},
                     {"dims": ["batch", "d_model"], "shape": [8, 16]}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    for d, reduce in (("a", "sum"), ("b", "max")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "samename_model.py").write_text(body.format(reduce))
    try:
        a = from_spec_file(str(tmp_path / "a" / "samename_model.py") + ":loss", tmp_path / "spec.json")
        b = from_spec_file(str(tmp_path / "b" / "samename_model.py") + ":loss", tmp_path / "spec.json")
        # (another size: a cached .pyc of the same size and mtime second would be taken for the source)
        (tmp_path / "a" / "samename_model.py").write_text(body.format("mean"))
        edited = from_spec_file(str(tmp_path / "a" / "samename_model.py") + ":loss", tmp_path / "spec.json")
    finally:
        sys.modules.pop("samename_model", None)

    def ops(g):
        return [(o.kind, getattr(o, "fn", None)) for o in g.ops]

    assert ops(a) != ops(b) and ops(edited) not in (ops(a), ops(b))
