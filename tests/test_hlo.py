"""Hand-checked tests of the compiled-program reader against programs written directly in JAX."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from layoutsearch.backend import hlo

B, IO, H = 64, 32, 128


def make_mesh(shape: tuple[int, ...], names: tuple[str, ...], order: list[int] | None = None) -> Mesh:
    devices = np.array(jax.devices())
    if order is not None:
        devices = devices[order]
    return Mesh(devices.reshape(shape), names, axis_types=(AxisType.Auto,) * len(names))


def mlp_step(w, v, x, t):
    def loss(w, v):
        y = jnp.maximum(x @ w, 0.0) @ v
        return jnp.mean((y - t) ** 2)

    gw, gv = jax.grad(loss, argnums=(0, 1))(w, v)
    return w - 0.1 * gw, v - 0.1 * gv


def mlp_summary(mesh: Mesh, ws: P, vs: P, xs: P) -> hlo.CompiledSummary:
    def s(p: P) -> NamedSharding:
        return NamedSharding(mesh, p)

    args = (jnp.ones((IO, H)), jnp.ones((H, IO)), jnp.ones((B, IO)), jnp.ones((B, IO)))
    return hlo.compile_summary(mlp_step, *args, mesh=mesh, in_shardings=(s(ws), s(vs), s(xs), s(xs)),
                               out_shardings=(s(ws), s(vs)))


def smap(f, mesh: Mesh, in_specs, out_specs, *args, check_vma: bool = False) -> hlo.CompiledSummary:
    g = jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma)
    return hlo.compile_summary(g, *args, mesh=mesh)


def only(summary: hlo.CompiledSummary) -> hlo.Collective:
    assert len(summary.collectives) == 1, summary.collectives
    return summary.collectives[0]


# ---------------------------------------------------------------- MLP training step


def test_mlp_data_parallel_all_reduces_both_weight_gradients():
    s = mlp_summary(make_mesh((8,), ("data",)), P(), P(), P("data", None))
    assert s.bytes_by() == {("all-reduce", ("data",)): 2 * IO * H * 4}
    assert all(c.group_size == 8 and c.count == 1 and c.dtype == "f32" for c in s.collectives)


def test_mlp_hidden_split_all_reduces_activations():
    s = mlp_summary(make_mesh((8,), ("model",)), P(None, "model"), P("model", None), P())
    assert s.bytes_by() == {("all-reduce", ("model",)): B * IO * 4}


@pytest.mark.parametrize(("r", "c"), [(2, 4), (4, 2)])
def test_mlp_batch_by_hidden(r: int, c: int):
    s = mlp_summary(make_mesh((r, c), ("rows", "cols")), P(None, "cols"), P("cols", None), P("rows", None))
    assert s.bytes_by() == {("all-reduce", ("cols",)): B * IO // r * 4, ("all-reduce", ("rows",)): 2 * IO * H // c * 4}
    sizes = {col.axes: col.group_size for col in s.collectives}
    assert sizes == {("cols",): c, ("rows",): r}


def test_mlp_fsdp_on_cpu_all_gathers_weights_and_all_reduces_gradients():
    """CPU-specific: XLA all-reduces the full gradients then slices (no reduce-scatter)."""
    io, h = 256, 1024  # weights large enough that XLA gathers weights rather than activations
    m = make_mesh((8,), ("data",))

    def s(p: P) -> NamedSharding:
        return NamedSharding(m, p)

    args = (jnp.ones((io, h)), jnp.ones((h, io)), jnp.ones((16, io)), jnp.ones((16, io)))
    summary = hlo.compile_summary(mlp_step, *args, mesh=m, in_shardings=(s(P("data")), s(P(None, "data")),
                                  s(P("data")), s(P("data"))), out_shardings=(s(P("data")), s(P(None, "data"))))
    assert summary.bytes_by() == {("all-gather", ("data",)): 2 * io * h * 4, ("all-reduce", ("data",)): 2 * io * h * 4}


# ---------------------------------------------------------------- loops


def psum_loop(x):
    return lax.fori_loop(0, 7, lambda i, c: c + lax.psum(jnp.sin(c), "a"), x)


def test_fori_loop_psum_counted_per_trip():
    m = make_mesh((2, 4), ("a", "b"))
    col = only(smap(psum_loop, m, P("a", "b"), P("a", "b"), jnp.ones((16, 32))))
    assert (col.kind, col.axes, col.group_size, col.count) == ("all-reduce", ("a",), 2, 7)
    assert col.bytes == 8 * 8 * 4 and col.total_bytes == 7 * 8 * 8 * 4


def test_scan_psum_over_two_axes():
    def f(x):
        return lax.scan(lambda c, _: (c + lax.psum(jnp.sin(c), ("a", "b")), None), x, None, length=5)[0]

    m = make_mesh((2, 4), ("a", "b"))
    col = only(smap(f, m, P("a", "b"), P("a", "b"), jnp.ones((16, 32))))
    assert (col.axes, col.group_size, col.count) == (("a", "b"), 8, 5)


def test_trip_count_from_loop_condition_without_backend_config():
    m = make_mesh((2, 4), ("a", "b"))
    g = jax.shard_map(psum_loop, mesh=m, in_specs=P("a", "b"), out_specs=P("a", "b"), check_vma=False)
    text = jax.jit(g).lower(jnp.ones((16, 32))).compile().as_text()
    assert "known_trip_count" in text
    stripped = re.sub(r', backend_config=\{"dynamic_variables.*\}\}', "", text)
    assert "known_trip_count" not in stripped
    assert [c.count for c in hlo.parse_collectives(stripped, m)] == [7]


def test_flops_with_trip_counts_multiplies_loop_body():
    m = make_mesh((8,), ("d",))
    a, b = jnp.ones((256, 64)), jnp.ones((64, 32))
    s = hlo.compile_summary(lambda a, b: lax.fori_loop(0, 5, lambda i, x: jnp.tanh(x @ b @ b.T), a), a, b, mesh=m,
                            in_shardings=(NamedSharding(m, P("d")), NamedSharding(m, P())))
    body = 2 * (2 * 32 * 64 * 32)  # two per-device matmuls [32,64]x[64,32] and [32,32]x[32,64]
    assert s.flops == pytest.approx(body, rel=0.01)  # cost_analysis counts the body once
    assert s.flops_with_trip_counts == pytest.approx(5 * body, rel=0.01)


# ---------------------------------------------------------------- other collectives


def test_all_gather_payload_is_output_bytes():
    m = make_mesh((2, 4), ("a", "b"))
    s = smap(lambda x: lax.all_gather(x, "b", tiled=True, axis=0), m, P(("a", "b")), P("a"), jnp.ones((16, 32)))
    col = only(s)  # local [2,32] -> [8,32]
    assert (col.kind, col.axes, col.group_size, col.bytes) == ("all-gather", ("b",), 4, 8 * 32 * 4)


def test_reduce_scatter_payload_is_input_bytes():
    m = make_mesh((2, 4), ("a", "b"))
    f = lambda x: lax.psum_scatter(x, "b", tiled=True, scatter_dimension=0)
    col = only(smap(f, m, P("a"), P(("a", "b")), jnp.ones((16, 32))))  # local [8,32] -> [2,32]
    assert (col.kind, col.axes, col.group_size, col.bytes) == ("reduce-scatter", ("b",), 4, 8 * 32 * 4)


def test_all_to_all_payload_is_operand_bytes():
    m = make_mesh((2, 4), ("a", "b"))
    f = lambda x: lax.all_to_all(x, "a", 0, 1, tiled=True)
    col = only(smap(f, m, P(None, ("a", "b")), P(("a", "b")), jnp.ones((16, 32))))  # local [16,4]
    assert (col.kind, col.axes, col.group_size, col.bytes) == ("all-to-all", ("a",), 2, 16 * 4 * 4)


@pytest.mark.parametrize(("axis", "n"), [("a", 2), ("b", 4)])
def test_ppermute_is_collective_permute_along_axis(axis: str, n: int):
    m = make_mesh((2, 4), ("a", "b"))
    f = lambda x: lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)])
    col = only(smap(f, m, P("a", "b"), P("a", "b"), jnp.ones((16, 32)), check_vma=True))
    assert (col.kind, col.axes, col.group_size, col.bytes) == ("collective-permute", (axis,), n, 8 * 8 * 4)
    assert col.source_target_pairs is not None and len(col.source_target_pairs) == 8


def test_permuted_device_order_uses_mesh_positions():
    m = make_mesh((2, 4), ("a", "b"), order=[0, 2, 4, 6, 1, 3, 5, 7])
    col = only(smap(lambda x: lax.psum(x, "a"), m, P("a", "b"), P(None, "b"), jnp.ones((16, 32))))
    assert col.axes == ("a",)


@pytest.mark.parametrize(
    ("shape", "names", "spec", "axes"),
    [((2, 4), ("a", "b"), P("b"), ("b",)), ((2, 4), ("a", "b"), P(("b", "a")), ("a", "b")),
     ((2, 2, 2), ("a", "b", "c"), P(("a", "c")), ("a", "c"))],
)
def test_gspmd_reductions_in_mesh_form(shape, names, spec, axes):
    m = make_mesh(shape, names)
    s = hlo.compile_summary(lambda x: jnp.sum(x, axis=0), jnp.ones((64, 16)), mesh=m,
                            in_shardings=NamedSharding(m, spec), out_shardings=NamedSharding(m, P()))
    col = only(s)
    assert (col.kind, col.axes, col.bytes) == ("all-reduce", axes, 16 * 4)


# ---------------------------------------------------------------- replica groups and shapes


@pytest.mark.parametrize(
    ("text", "groups"),
    [
        ("{{0,1},{2,3}}", [[0, 1], [2, 3]]),
        ("{{0,2},{1,3}}", [[0, 2], [1, 3]]),
        ("{}", [[0, 1, 2, 3]]),
        (None, [[0, 1, 2, 3]]),
        ("[2,2]<=[4]", [[0, 1], [2, 3]]),
        ("[2,2]<=[2,2]T(1,0)", [[0, 2], [1, 3]]),
        ("[1,4]<=[4]", [[0, 1, 2, 3]]),
        ("mesh['a'=2,'b'=2] {'b'}", [[0, 1], [2, 3]]),
        ("mesh['a'=2,'b'=2] {'a'}", [[0, 2], [1, 3]]),
        ("mesh['a'=2,'b'=2] {'a','b'}", [[0, 1, 2, 3]]),
        ("mesh['axis_0'=2,'axis_1'=1,'axis_2'=2], device_ids=([2,2]T(1,0)) {'axis_0'}", [[0, 1], [2, 3]]),
        ("mesh['a'=2,'b'=2], device_ids=(3,2,1,0) {'b'}", [[3, 2], [1, 0]]),
        ("mesh['a'=4] {'a':(1)2}", [[0, 2], [1, 3]]),
        ("mesh['a'=4] {'a':(2)2}", [[0, 1], [2, 3]]),
    ],
)
def test_parse_replica_groups(text, groups):
    assert hlo.parse_replica_groups(text, 4) == groups


def test_mesh_form_with_device_ids_on_larger_mesh():
    groups = hlo.parse_replica_groups("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}")
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    groups = hlo.parse_replica_groups("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_0'}")
    assert groups == [[0, 1, 4, 5], [2, 3, 6, 7]]


@pytest.mark.parametrize(
    ("shape", "nbytes"),
    [("f32[64,256]{1,0}", 64 * 256 * 4), ("bf16[8]{0}", 16), ("pred[3]", 3), ("s32[]", 4), ("u4[3]", 2),
     ("(f32[2,2]{1,0}, s8[4]{0})", 20), ("((f32[2]{0}), (bf16[2]{0}, f16[1]))", 14), ("f8e4m3fn[5]", 5),
     ("f32[8,128]{1,0:T(8,128)}", 4096)],
)
def test_shape_bytes(shape: str, nbytes: int):
    assert hlo.shape_bytes(shape) == nbytes


HANDWRITTEN = """HloModule handwritten, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}

%rs_comp (p0: bf16[16,32]) -> bf16[4,32] {
  %p0 = bf16[16,32]{1,0} parameter(0)
  ROOT %rs = bf16[4,32]{1,0} reduce-scatter(%p0), channel_id=3, replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add
}

%inner_body (ip: (s32[], f32[8])) -> (s32[], f32[8]) {
  %ip = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%ip), index=0
  %x = f32[8]{0} get-tuple-element(%ip), index=1
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %ars = f32[8]{0} all-reduce-start(%x), channel_id=1, replica_groups={{0,4},{1,5},{2,6},{3,7}}, to_apply=%add
  %ard = f32[8]{0} all-reduce-done(%ars)
  ROOT %t = (s32[], f32[8]{0}) tuple(%i1, %ard)
}

%inner_cond (cp: (s32[], f32[8])) -> pred[] {
  %cp = (s32[], f32[8]{0}) parameter(0)
  %ci = s32[] get-tuple-element(%cp), index=0
  %lim = s32[] constant(3)
  ROOT %lt = pred[] compare(%ci, %lim), direction=LT
}

%outer_body (op: (s32[], f32[8])) -> (s32[], f32[8]) {
  %op = (s32[], f32[8]{0}) parameter(0)
  %oi = s32[] get-tuple-element(%op), index=0
  %ox = f32[8]{0} get-tuple-element(%op), index=1
  %z = s32[] constant(0)
  %it = (s32[], f32[8]{0}) tuple(%z, %ox)
  %w = (s32[], f32[8]{0}) while(%it), condition=%inner_cond, body=%inner_body
  %wx = f32[8]{0} get-tuple-element(%w), index=1
  %o1 = s32[] constant(1)
  %oi1 = s32[] add(%oi, %o1)
  ROOT %ot = (s32[], f32[8]{0}) tuple(%oi1, %wx)
}

%outer_cond (oc: (s32[], f32[8])) -> pred[] {
  %oc = (s32[], f32[8]{0}) parameter(0)
  %oci = s32[] get-tuple-element(%oc), index=0
  %olim = s32[] constant(99)
  ROOT %olt = pred[] compare(%oci, %olim), direction=LT
}

%tbranch (tp: f32[4,4]) -> f32[4,4] {
  %tp = f32[4,4]{1,0} parameter(0)
  ROOT %a2a = f32[4,4]{1,0} all-to-all(%tp), channel_id=5, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
}

%fbranch (fp: f32[4,4]) -> f32[4,4] {
  %fp = f32[4,4]{1,0} parameter(0)
  ROOT %self = f32[4,4]{1,0} all-reduce(%fp), channel_id=6, replica_groups={{0},{1},{2},{3},{4},{5},{6},{7}}, to_apply=%add
}

ENTRY %main (p: f32[8], q: bf16[16,32], r: f32[4,4]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %q = bf16[16,32]{1,0} parameter(1)
  %r = f32[4,4]{1,0} parameter(2)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8]{0}) tuple(%zero, %p)
  %loop = (s32[], f32[8]{0}) while(%init), condition=%outer_cond, body=%outer_body, backend_config={"known_trip_count":{"n":"4"}}
  %ags = (f32[4,4]{1,0}, f32[16,4]{1,0}) all-gather-start(%r), channel_id=2, replica_groups=mesh['a'=2,'b'=4] {'b'}, dimensions={0}, use_global_device_ids=true
  %agd = f32[16,4]{1,0} all-gather-done(%ags)
  %rss = ((bf16[16,32]{1,0}), bf16[4,32]{1,0}) async-start(%q), calls=%rs_comp
  %rsd = bf16[4,32]{1,0} async-done(%rss), calls=%rs_comp
  %cps = (f32[4,4]{1,0}, f32[4,4]{1,0}, u32[], u32[]) collective-permute-start(%r), channel_id=4, source_target_pairs={{0,4},{4,0},{1,5},{5,1}}, metadata={op_name="odd}{,(\\"name"}
  %cpd = f32[4,4]{1,0} collective-permute-done(%cps)
  %pr = pred[] constant(true)
  %cond = f32[4,4]{1,0} conditional(%pr, %r, %r), true_computation=%tbranch, false_computation=%fbranch
  ROOT %out = f32[8]{0} get-tuple-element(%loop), index=1
}
"""


def test_handwritten_module_async_forms_nested_loops_and_branches():
    m = make_mesh((2, 4), ("a", "b"))
    cols = hlo.parse_collectives(HANDWRITTEN, m)
    got = {c.name: (c.kind, c.axes, c.group_size, c.bytes, c.count, c.dtype) for c in cols}
    assert got == {
        "rs": ("reduce-scatter", ("b",), 4, 16 * 32 * 2, 1, "bf16"),
        "ars": ("all-reduce", ("a",), 2, 8 * 4, 4 * 3, "f32"),
        "a2a": ("all-to-all", ("a", "b"), 8, 64, 1, "f32"),
        "self": ("all-reduce", (), 1, 64, 1, "f32"),
        "ags": ("all-gather", ("b",), 4, 4 * 64, 1, "f32"),
        "cps": ("collective-permute", ("a",), 2, 64, 1, "f32"),
    }
    assert [c.axes for c in hlo.parse_collectives(HANDWRITTEN, None)] == [None] * 6


# ---------------------------------------------------------------- flops and memory


def test_flops_per_device_of_sharded_matmul():
    m = make_mesh((8,), ("d",))
    mm, k, n = 256, 64, 32
    s = hlo.compile_summary(jnp.matmul, jnp.ones((mm, k)), jnp.ones((k, n)), mesh=m,
                            in_shardings=(NamedSharding(m, P("d")), NamedSharding(m, P())),
                            out_shardings=NamedSharding(m, P("d")))
    assert s.collectives == ()
    assert s.flops == pytest.approx(2 * mm * k * n / 8, rel=0.01)  # exact on CPU: 131072
    assert s.flops_with_trip_counts == s.flops


def test_memory_analysis_per_device():
    m = make_mesh((8,), ("d",))
    s = hlo.compile_summary(lambda x: x * 2.0, jnp.ones((256, 64)), mesh=m, in_shardings=NamedSharding(m, P("d")),
                            out_shardings=NamedSharding(m, P("d")))
    mem = s.memory
    for key in ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "generated_code_bytes", "peak_bytes",
                "total_bytes"):
        assert key in mem and mem[key] >= 0
    assert mem["argument_bytes"] == 256 * 64 * 4 // 8
    assert mem["output_bytes"] == 256 * 64 * 4 // 8
    assert mem["total_bytes"] == mem["argument_bytes"] + mem["output_bytes"] + mem["temp_bytes"] - mem["alias_bytes"]
    assert mem["argument_bytes"] <= mem["peak_bytes"] <= mem["total_bytes"]


def test_to_dict_is_json_ready():
    s = mlp_summary(make_mesh((2, 4), ("rows", "cols")), P(None, "cols"), P("cols", None), P("rows", None))
    d = json.loads(json.dumps(s.to_dict()))
    assert sum(c["total_bytes"] for c in d["collectives"]) == sum(e["bytes"] for e in d["bytes_by"])
    assert d["flops"] == s.flops and d["memory"] == s.memory


def test_unknown_trip_count_warns_and_counts_once():
    text = HANDWRITTEN.replace("%lim = s32[] constant(3)", "%lim = s32[] get-tuple-element(%cp), index=0")
    with pytest.warns(UserWarning, match="unknown trip count"):
        cols = {c.name: c.count for c in hlo.parse_collectives(text, None)}
    assert cols["ars"] == 4 and cols["rs"] == 1
