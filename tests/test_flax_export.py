"""The Flax exports, proven with Flax itself: Linen models whose parameters carry the zoo models' dim names
as logical axis names get, from the exported rules and Flax's own functions, the layout's PartitionSpecs;
so do Flax NNX models with the NNX export."""

import numpy as np
import pytest

pytest.importorskip("flax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from layoutsearch import zoo  # noqa: E402
from layoutsearch.errors import LayoutError  # noqa: E402
from layoutsearch.export import export  # noqa: E402
from layoutsearch.layout import Layout  # noqa: E402

MTF_GRAPH = zoo.build("mtf-ffn", batch=16, io=32, hidden=64)
MLP_GRAPH = zoo.build("mlp", batch=16, features=32, hidden=64, classes=8, layers=3)
GPT = zoo.build("gpt", layers=1, heads=4, kv_heads=2, mlp="swiglu", norm="rmsnorm", bias=0, position="rotary",
                tie_embeddings=0)


def _mesh(layout):
    return jax.make_mesh(tuple(s for _, s in layout.mesh.axes), layout.mesh.names,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(layout.mesh.axes))


def _rules(layout, graph, fmt, **kw):
    namespace: dict = {}
    exec(compile(export(layout, graph, fmt, **kw), "<export>", "exec"), namespace)  # noqa: S102 -- ours
    return namespace["logical_axis_rules"]


def _init(fan_in_axis=0):
    return nn.initializers.lecun_normal(in_axis=fan_in_axis, out_axis=-1)


# -- Linen -----------------------------------------------------------------------------------------------------------

class MtfFFN(nn.Module):
    """The Mesh-TF FFN (zoo ``mtf-ffn``): y = relu(x[batch, io] . w[io, hidden]) . v[hidden, io]."""

    io: int
    hidden: int

    @nn.compact
    def __call__(self, x):
        w = self.param("w", nn.with_logical_partitioning(_init(), ("io", "hidden")), (self.io, self.hidden))
        v = self.param("v", nn.with_logical_partitioning(_init(), ("hidden", "io")), (self.hidden, self.io))
        h = nn.with_logical_constraint(jnp.einsum("bi,ih->bh", x, w), ("batch", "hidden"))
        return nn.with_logical_constraint(jnp.einsum("bh,hi->bi", nn.relu(h), v), ("batch", "io"))


class MLP(nn.Module):
    """The zoo ``mlp``: Dense layers alternating ``hidden`` / ``hidden2``, then ``classes``."""

    hidden: int
    classes: int
    layers: int

    @nn.compact
    def __call__(self, x):
        d_in = "features"
        for i in range(self.layers):
            d_out = ("hidden", "hidden2")[i % 2]
            x = nn.Dense(self.hidden, name=f"layer_{i}",
                         kernel_init=nn.with_logical_partitioning(_init(), (d_in, d_out)),
                         bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (d_out,)))(x)
            x = nn.gelu(nn.with_logical_constraint(x, ("batch", d_out)))
            d_in = d_out
        return nn.Dense(self.classes, name="out", kernel_init=nn.with_logical_partitioning(_init(), (d_in, "classes")),
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("classes",)))(x)


MLP_NAMES = {("layer_0", "kernel"): "layer.0/w", ("layer_0", "bias"): "layer.0/bias",
             ("layer_1", "kernel"): "layer.1/w", ("layer_1", "bias"): "layer.1/bias",
             ("layer_2", "kernel"): "layer.2/w", ("layer_2", "bias"): "layer.2/bias",
             ("out", "kernel"): "w_out", ("out", "bias"): "b_out"}


class GraphParams(nn.Module):
    """Every parameter of a graph as a Linen param named after it, logical axis names = its dim names."""

    graph_name: str

    @nn.compact
    def __call__(self):
        graph = {"gpt": GPT}[self.graph_name]
        return {t.name: self.param(t.name.replace("/", "__"),
                                   nn.with_logical_partitioning(nn.initializers.zeros, t.dim_names),
                                   tuple(d.size for d in t.dims))
                for t in graph.tensors.values() if t.role == "parameter"}


def _linen_specs(model, args, layout, rules):
    """Flax's own answer: nn.get_partition_spec (logical) -> nn.logical_to_mesh_sharding(..., rules)."""
    abstract = jax.eval_shape(model.init, jax.random.key(0), *args)
    logical = nn.get_partition_spec(abstract)
    shardings = nn.logical_to_mesh_sharding(logical, _mesh(layout), rules)
    return {tuple(p.key for p in path): s.spec for path, s in jax.tree_util.tree_flatten_with_path(shardings)[0]}


MTF_LAYOUTS = ["batch:data,hidden:model", "batch:data+model", "hidden:model,io:data", "batch:data,io:data",
               "batch:data,hidden:-,hidden:model", "io:data+model,batch:model"]


@pytest.mark.parametrize("rules", MTF_LAYOUTS)
def test_linen_mtf_ffn_gets_the_layout_specs(rules):
    layout = Layout.from_rules("data:2,model:4", rules)
    flax_rules = _rules(layout, MTF_GRAPH, "flax")
    specs = _linen_specs(MtfFFN(32, 64), (jnp.zeros((16, 32)),), layout, flax_rules)
    for name in ("w", "v"):
        assert specs[("params", name)] == layout.partition_spec(MTF_GRAPH.tensors[name]), name
    # activations too: Flax's logical_to_mesh_axes on every tensor's dim names
    for t in MTF_GRAPH.tensors.values():
        assert nn.logical_to_mesh_axes(t.dim_names, flax_rules) == layout.partition_spec(t), t.name


@pytest.mark.parametrize("rules", ["batch:data,hidden:model,hidden2:data", "features:model,hidden2:model,batch:data",
                                   "hidden:data+model,classes:model", "batch:model,hidden:model,hidden2:model"])
def test_linen_mlp_gets_the_layout_specs(rules):
    layout = Layout.from_rules("data:2,model:4", rules)
    flax_rules = _rules(layout, MLP_GRAPH, "flax")
    specs = _linen_specs(MLP(64, 8, 3), (jnp.zeros((16, 32)),), layout, flax_rules)
    for (module, kind), tensor in MLP_NAMES.items():
        assert specs[("params", module, kind)] == layout.partition_spec(MLP_GRAPH.tensors[tensor]), tensor
    for t in MLP_GRAPH.tensors.values():
        assert nn.logical_to_mesh_axes(t.dim_names, flax_rules) == layout.partition_spec(t), t.name


@pytest.mark.parametrize("rules", ["batch:data,kv_heads:model,d_ff:model,vocab:model",
                                   "batch:data+fsdp,d_model:fsdp,d_ff:model,kv_heads:model",
                                   "d_model:data,batch:data,q_per_kv:model,vocab:fsdp"])
def test_linen_gpt_parameters_get_the_layout_specs(rules):
    layout = Layout.from_rules("data:2,fsdp:2,model:2", rules)
    flax_rules = _rules(layout, GPT, "flax")
    specs = _linen_specs(GraphParams("gpt"), (), layout, flax_rules)
    params = [t for t in GPT.tensors.values() if t.role == "parameter"]
    assert len(specs) == len(params)
    for t in params:
        assert specs[("params", t.name.replace("/", "__"))] == layout.partition_spec(t), t.name


def test_linen_mtf_ffn_runs_sharded_as_laid_out():
    """Initialized under jit with the exported shardings, the parameters are laid out as the layout says, and
    the model applied under the rules computes what it computes unsharded."""
    layout = Layout.from_rules("data:2,model:4", "batch:data,hidden:model")
    flax_rules = _rules(layout, MTF_GRAPH, "flax")
    mesh, model, x = _mesh(layout), MtfFFN(32, 64), jnp.asarray(np.random.default_rng(0).standard_normal((16, 32)),
                                                                 jnp.float32)
    abstract = jax.eval_shape(model.init, jax.random.key(0), x)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, flax_rules)
    params = jax.jit(model.init, out_shardings=shardings)(jax.random.key(0), x)
    assert params["params"]["w"].value.sharding.spec == P(None, "model")
    assert params["params"]["v"].value.sharding.spec == P("model", None)
    with jax.set_mesh(mesh), nn.logical_axis_rules(flax_rules):
        y = jax.jit(model.apply)(params, jax.device_put(x, jax.sharding.NamedSharding(mesh, P("data", None))))
    reference = model.apply(jax.device_get(params), x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(reference), rtol=1e-5, atol=1e-5)


# -- NNX -------------------------------------------------------------------------------------------------------------

class NnxMtfFFN(nnx.Module):
    def __init__(self, io, hidden, rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (io, hidden)), out_sharding=("io", "hidden"))
        self.v = nnx.Param(jax.random.normal(rngs.params(), (hidden, io)), out_sharding=("hidden", "io"))

    def __call__(self, x):
        return jnp.einsum("bh,hi->bi", nnx.relu(jnp.einsum("bi,ih->bh", x, self.w[...])), self.v[...])


class NnxGraphParams(nnx.Module):
    def __init__(self, graph):
        for t in graph.tensors.values():
            if t.role == "parameter":
                setattr(self, t.name.replace("/", "__").replace(".", "_"),
                        nnx.Param(jnp.zeros(tuple(d.size for d in t.dims)), out_sharding=t.dim_names))


@pytest.mark.parametrize("rules", MTF_LAYOUTS)
def test_nnx_mtf_ffn_gets_the_layout_specs(rules):
    layout = Layout.from_rules("data:2,model:4", rules)
    nnx_rules = _rules(layout, MTF_GRAPH, "nnx")
    with jax.set_mesh(_mesh(layout)), nnx.logical_axis_rules(nnx_rules):
        model = NnxMtfFFN(32, 64, nnx.Rngs(0))
        specs = nnx.get_partition_spec(nnx.state(model))
    for name in ("w", "v"):
        expected = layout.partition_spec(MTF_GRAPH.tensors[name])
        assert getattr(model, name)[...].sharding.spec == expected, name
        assert specs[name].get_value() == expected, name


@pytest.mark.parametrize("rules", ["batch:data,kv_heads:model,d_ff:model,vocab:model",
                                   "batch:data+fsdp,d_model:fsdp,d_ff:model,kv_heads:model",
                                   "d_model:data,batch:data,q_per_kv:model,vocab:fsdp"])
def test_nnx_gpt_parameters_get_the_layout_specs(rules):
    layout = Layout.from_rules("data:2,fsdp:2,model:2", rules)
    nnx_rules = _rules(layout, GPT, "nnx")
    with jax.set_mesh(_mesh(layout)), nnx.logical_axis_rules(nnx_rules):
        model = NnxGraphParams(GPT)
    for t in GPT.tensors.values():
        if t.role == "parameter":
            value = getattr(model, t.name.replace("/", "__").replace(".", "_"))[...]
            assert value.sharding.spec == layout.partition_spec(t), t.name


def test_linen_rules_would_mislead_nnx():
    """Why NNX has its own export: NNX looks names up in a dict (the last rule for a name wins, no precedence;
    a name without a rule is taken as a mesh axis), so Linen rules with a fallback put a parameter on the
    wrong axis, and Linen rules that leave a dim out fail; the NNX export does neither."""
    mesh = _mesh(Layout.replicated("data:2,model:4"))
    layout = Layout.from_rules("data:2,model:4", "hidden:model,hidden:data,io:-,batch:data")
    expected = layout.partition_spec(MTF_GRAPH.tensors["w"])
    assert expected == P(None, "model")
    with jax.set_mesh(mesh), nnx.logical_axis_rules(_rules(layout, MTF_GRAPH, "flax")):
        assert NnxMtfFFN(32, 64, nnx.Rngs(0)).w[...].sharding.spec == P(None, "data")
    with jax.set_mesh(mesh), nnx.logical_axis_rules(_rules(layout, MTF_GRAPH, "nnx")):
        assert NnxMtfFFN(32, 64, nnx.Rngs(0)).w[...].sharding.spec == expected
    layout = Layout.from_rules("data:2,model:4", "hidden:model")
    with jax.set_mesh(mesh), nnx.logical_axis_rules(_rules(layout, MTF_GRAPH, "flax")):
        with pytest.raises(ValueError, match="io"):
            NnxMtfFFN(32, 64, nnx.Rngs(0))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(_rules(layout, MTF_GRAPH, "nnx")):
        assert NnxMtfFFN(32, 64, nnx.Rngs(0)).w[...].sharding.spec == P(None, "model")


def test_nnx_export_refuses_what_nnx_cannot_express():
    with pytest.raises(LayoutError, match="one mesh-axes value"):
        export(Layout.from_rules("data:2,model:4", "hidden:model,hidden2:model"), MLP_GRAPH, "nnx")
