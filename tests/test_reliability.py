"""Bad input is one clear error of the library's own class (the CLI: one line, exit 2), never an internal error
nor a silent wrong answer: the cases of the reliability issue, each with the error class and the field it names.
Size bounds keep every count exact (memory figures compared with hand-computed values near the bounds)."""

import copy
import json

import pytest
from clirun import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import mutated_document

import layoutsearch as ls
from layoutsearch import zoo
from layoutsearch.costdag import CostDAG, Edge, Node, load_costdag
from layoutsearch.costmodel import memory
from layoutsearch.errors import (
    CostDAGError,
    GraphError,
    GraphFormatError,
    HardwareError,
    LayoutSearchError,
    MeshError,
)
from layoutsearch.hwprofile import hardware_to_json
from layoutsearch.ir import (
    Dim,
    Einsum,
    Elementwise,
    GraphBuilder,
    LayerNorm,
    Reshape,
    Tensor,
    graph_from_json,
    load_graph,
    strictjson,
)
from layoutsearch.ir.dims import MAX_DIM_SIZE, MAX_GRAPH_ELEMENTS, MAX_TENSOR_ELEMENTS
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh, hardware
from layoutsearch.units import parse_bytes

BASE = json.loads((zoo.JSON_DIR / "mtf-ffn.json").read_text())


def mutated(change):
    d = copy.deepcopy(BASE)
    change(d)
    return json.dumps(d)


def op(d, name):
    return next(o for o in d["ops"] if o["name"] == name)


def fails(text, cls, *fragments):
    """Reading ``text`` as a graph raises ``cls`` whose message names the file and every fragment."""
    with pytest.raises(cls) as e:
        graph_from_json(text, "bad.json")
    msg = str(e.value)
    assert msg.startswith("bad.json: "), msg
    for f in fragments:
        assert f in msg, msg
    assert "\n" not in msg
    return msg


# -- graph files: bytes, JSON, nesting, numbers ---------------------------------------------------------------------

def test_non_utf8_bytes_name_the_file_and_the_offset(tmp_path):
    p = tmp_path / "bad.json"
    p.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(GraphFormatError, match=r"bad.json: not UTF-8 text: byte 0xe9 at offset 13"):
        load_graph(p)
    fails(b'{"name": "\xff"}', GraphFormatError, "not UTF-8 text", "offset 10")


def test_a_utf8_bom_is_dropped(tmp_path):
    p = tmp_path / "bom.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(BASE).encode())
    assert load_graph(p).name == "mtf-ffn"


def test_deep_nesting_is_one_error():
    fails("[" * 100_000 + "]" * 100_000, GraphFormatError, "nested deeper than 64 levels")
    deep = mutated(lambda d: d.__setitem__("meta", {"a": json.loads("[" * 100 + "]" * 100)}))
    fails(deep, GraphFormatError, "graph.meta.a[0][0]", "nested deeper than 64 levels")


def test_a_50_megabyte_number_is_out_of_range_not_a_crash():
    text = json.dumps(BASE).replace('"batch": 16', '"batch": ' + "9" * 50_000_000, 1)
    fails(text, GraphFormatError, "graph.dims.batch", "an integer of 50,000,000 digits is out of range")


def test_files_over_64_mib_are_refused(tmp_path):
    p = tmp_path / "huge.json"
    p.write_bytes(b" " * (64 * 2**20 + 1))
    with pytest.raises(GraphFormatError, match="huge.json: larger than 64 MiB"):
        load_graph(p)


@pytest.mark.parametrize("text, fragment", [
    ('{"name": "a", "name": "b"}', "top level: duplicate key 'name'"),
    (json.dumps(BASE).replace('"dims": {', '"dims": {"batch": 3, ', 1), "graph.dims: duplicate key 'batch'"),
    (json.dumps(BASE).replace('"role": "input"', '"role": "input", "role": "parameter"', 1),
     "tensors[0]: duplicate key 'role'"),
])
def test_duplicate_keys_are_refused_with_their_path(text, fragment):
    fails(text, GraphFormatError, fragment)


@pytest.mark.parametrize("literal, fragment", [
    ("NaN", "NaN is not a JSON number"), ("Infinity", "Infinity is not a JSON number"),
    ("-Infinity", "-Infinity is not a JSON number"), ("1e999", "beyond the range of a float"),
])
def test_non_json_numbers_are_refused_anywhere(literal, fragment):
    text = json.dumps({**BASE, "meta": {"x": 1}}).replace('"x": 1', f'"x": {literal}')
    fails(text, GraphFormatError, "graph.meta.x", fragment)


# -- graph files: types of fields -----------------------------------------------------------------------------------

@pytest.mark.parametrize("change, fragments", [
    (lambda d: d["tensors"][0].__setitem__("name", {"a": 1}), ["tensors[0].name", "expected str, got dict"]),
    (lambda d: d["tensors"][0].__setitem__("name", ["x"]), ["tensors[0].name", "expected str, got list"]),
    (lambda d: d["tensors"][0].__setitem__("dims", [["batch"], "io"]), ["tensors[0].dims", "dim names"]),
    (lambda d: d["tensors"][0].__setitem__("dims", "batch"), ["tensors[0].dims", "expected list, got str"]),
    (lambda d: d["tensors"][0].__setitem__("dtype", ["float32"]), ["tensors[0].dtype", "expected str"]),
    (lambda d: d["tensors"][0].__setitem__("updates", ["w"]), ["tensors[0].updates", "expected str"]),
    (lambda d: d.__setitem__("loss", ["loss"]), ["graph.loss", "expected str/NoneType, got list"]),
    (lambda d: d.__setitem__("name", 3), ["graph.name", "expected str, got int"]),
    (lambda d: d["ops"][0].__setitem__("output", ["h"]), ["ops[0].output", "expected str, got list"]),
    (lambda d: d["ops"][0].__setitem__("inputs", [["x"], "w"]), ["ops[0].inputs", "list of tensor names"]),
    (lambda d: d["ops"][0].__setitem__("phase", {"p": 1}), ["ops[0].phase", "expected str, got dict"]),
    (lambda d: d["ops"][0].__setitem__("kind", ["einsum"]), ["ops[0].kind", "expected str, got list"]),
])
def test_a_list_or_dict_where_a_name_is_expected_names_the_field(change, fragments):
    fails(mutated(change), GraphFormatError, *fragments)


def test_inputs_given_as_a_string_are_refused_not_split_into_letters():
    d = copy.deepcopy(BASE)
    d["tensors"] += [{"name": "a", "dims": ["batch", "io"], "role": "input"}]
    op(d, "h")["inputs"] = "xw"
    fails(json.dumps(d), GraphFormatError, "ops[0].inputs: expected a list of tensor names, got 'xw'")
    with pytest.raises(GraphError, match="einsum op 'h': inputs must be a list of tensor names, got 'xw'"):
        Einsum(name="h", inputs="xw", output="h")


def scale_op(d, params):
    o = op(d, "h_relu")
    o.update(fn="scale", params=params)


@pytest.mark.parametrize("params, fragments", [
    ({"factor": "x"}, ["ops[1].params.factor", "expected a number, got 'x'"]),
    ({"factor": True}, ["ops[1].params.factor", "expected a number, got True"]),
    ({"factor": None}, ["ops[1].params.factor", "expected a number, got None"]),
    ({"factor": [1]}, ["ops[1].params.factor", "expected a number"]),
    ([1, 2], ["ops[1].params[0]", "expected a pair [name, number], got 1"]),
    ([["factor"]], ["ops[1].params[0]", "expected a pair"]),
    ([["factor", "x"]], ["ops[1].params[0][1]", "expected a number, got 'x'"]),
    ([[3, 1.0]], ["ops[1].params[0]", "expected a pair"]),
    ([["factor", 1.0], ["factor", 2.0]], ["params names an attribute twice"]),
    ("abc", ["ops[1].params", "expected an object of numbers"]),
    (3, ["ops[1].params", "expected an object of numbers"]),
])
def test_elementwise_params_of_the_wrong_shape_or_type(params, fragments):
    d = copy.deepcopy(BASE)
    scale_op(d, params)
    fails(json.dumps(d), GraphError, *fragments)


def test_elementwise_params_in_python_are_checked_too():
    with pytest.raises(GraphError, match=r"elementwise op 's': params.factor: expected a number, got 'x'"):
        Elementwise(name="s", inputs=("x",), output="s", fn="scale", params={"factor": "x"})
    with pytest.raises(GraphError, match=r"params.factor: expected a finite number"):
        Elementwise(name="s", inputs=("x",), output="s", fn="scale", params={"factor": float("inf")})
    with pytest.raises(GraphError, match=r"params.factor: expected a finite number"):
        Elementwise(name="s", inputs=("x",), output="s", fn="scale", params={"factor": 10**400})
    with pytest.raises(GraphError, match=r"fn must be a string"):
        Elementwise(name="s", inputs=("x",), output="s", fn=["scale"])


def reshape_doc(groups):
    d = copy.deepcopy(BASE)
    d["dims"]["io2"] = 32
    d["tensors"].append({"name": "xr", "dims": ["batch", "io2"]})
    d["ops"].append({"kind": "reshape", "name": "xr", "inputs": ["x"], "output": "xr", "groups": groups})
    d["tensors"].append({"name": "xr_sum", "dims": []})
    d["ops"].append({"kind": "reduce", "name": "xr_sum", "inputs": ["xr"], "output": "xr_sum"})
    return json.dumps(d)


@pytest.mark.parametrize("groups, fragment", [
    ([["io"]], "ops[6].groups[0]"),
    ([["io", "io2"]], "ops[6].groups[0]"),
    ([[1, 2]], "ops[6].groups[0]"),
    ([[["io"], ["io2"], ["x"]]], "ops[6].groups[0]"),
    ([[["io"], [3]]], "ops[6].groups[0]"),
    ("io", "ops[6].groups: expected a list"),
    ({"io": "io2"}, "ops[6].groups: expected a list"),
])
def test_malformed_reshape_groups(groups, fragment):
    assert graph_from_json(reshape_doc([[["io"], ["io2"]]])).op("xr").groups == ((("io",), ("io2",)),)
    fails(reshape_doc(groups), GraphFormatError, fragment)
    with pytest.raises(GraphError, match="groups must be a list of"):
        Reshape(name="r", inputs=("x",), output="r", groups=groups)


def test_an_op_block_that_is_a_list_is_refused_on_load_not_in_estimate():
    fails(mutated(lambda d: op(d, "h").__setitem__("block", ["layer.0"])), GraphFormatError,
          "ops[0].block", "or null, got ['layer.0']")
    fails(mutated(lambda d: op(d, "h").__setitem__("block", "")), GraphFormatError, "ops[0].block")
    with pytest.raises(GraphError, match="block must be a block name"):
        Einsum(name="h", inputs=("x", "w"), output="h", block={"b": 1})


def layer_norm_doc(**fields):
    d = copy.deepcopy(BASE)
    d["tensors"].append({"name": "xn", "dims": ["batch", "io"]})
    d["ops"].append({"kind": "layer_norm", "name": "xn", "inputs": ["x"], "output": "xn", "dim": "io", **fields})
    d["tensors"].append({"name": "xn_sum", "dims": []})
    d["ops"].append({"kind": "reduce", "name": "xn_sum", "inputs": ["xn"], "output": "xn_sum"})
    return json.dumps(d)


@pytest.mark.parametrize("eps, fragment", [
    ("x", "expected a number, got 'x'"), (True, "expected a number, got True"), ([1e-5], "expected a number"),
    (None, "expected a number, got None"),
])
def test_eps_is_type_checked(eps, fragment):
    assert graph_from_json(layer_norm_doc(eps=1e-6)).op("xn").eps == 1e-6
    fails(layer_norm_doc(eps=eps), GraphFormatError, "ops[6].eps", fragment)
    fails(layer_norm_doc(eps=-1.0), GraphError, "eps must be >= 0")
    with pytest.raises(GraphError, match="eps: expected a"):
        LayerNorm(name="n", inputs=("x",), output="n", dim="io", eps=eps)


@pytest.mark.parametrize("name, fragment", [
    (3, "expected str, got int"), (["h"], "expected str, got list"), ("", "non-empty string of printable"),
    ("a\nb", "non-empty string of printable"), ("\ud800", "non-empty string of printable"),
])
def test_op_and_tensor_names_are_type_checked(name, fragment):
    fails(mutated(lambda d: op(d, "h").__setitem__("name", name)), GraphFormatError, "ops[0].name", fragment)
    fails(mutated(lambda d: d["tensors"][0].__setitem__("name", name)), GraphFormatError, "tensors[0].name",
          fragment)


def test_unknown_top_level_and_tensor_fields_are_refused_like_op_fields():
    fails(mutated(lambda d: d.__setitem__("extra", 1)), GraphFormatError,
          "top level: unknown field 'extra' (known: format, version, name, dims, tensors, ops, loss, meta)")
    fails(mutated(lambda d: d["tensors"][1].__setitem__("shape", [1])), GraphFormatError,
          "tensors[1]: unknown field 'shape' (known: name, dims, dtype, role, updates)")
    fails(mutated(lambda d: op(d, "h").__setitem__("foo", 1)), GraphFormatError,
          "ops[0]: bad fields for einsum op", "unexpected keyword argument 'foo'")


def test_updates_null_means_no_update():
    g = graph_from_json(mutated(lambda d: d["tensors"][0].__setitem__("updates", None)))
    assert g.tensors["x"].updates is None


def test_version_true_is_not_version_1():
    fails(mutated(lambda d: d.__setitem__("version", True)), GraphFormatError, "version: unsupported version True")


# -- sizes ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size, fragment", [
    (2**63, "must be at most 2**40"), (10**30, "must be at most 2**40"), (MAX_DIM_SIZE + 1, "must be at most 2**40"),
    (0, "must be a positive integer"), (-3, "must be a positive integer"), (8.0, "must be a positive integer"),
])
def test_dim_sizes_beyond_the_bound_are_refused(size, fragment):
    fails(mutated(lambda d: d["dims"].__setitem__("batch", size)), GraphError, "dim 'batch'", fragment)
    with pytest.raises(GraphError, match=f"dim 'batch' has invalid size .*{fragment.replace('*', '.')}"):
        Dim("batch", size)


def test_tensor_and_graph_element_bounds():
    d = copy.deepcopy(BASE)
    d["dims"].update(batch=2**25, io=2**25, hidden=2**26)  # w[io, hidden]: 2**51 elements
    fails(json.dumps(d), GraphError, "tensor 'w' has", "more than the limit of 2**50")
    assert Tensor("t", (Dim("a", 2**25), Dim("b", 2**25))).num_elements == MAX_TENSOR_ELEMENTS
    with pytest.raises(GraphError, match="tensor 't' has 2,251,799,813,685,248 elements"):
        Tensor("t", (Dim("a", 2**25), Dim("b", 2**26)))


def inputs_graph(count, elements_each=2**50, name="wide"):
    """``count`` unused inputs of ``elements_each`` elements and a tiny loss: weighted elements count*each + 2."""
    b = GraphBuilder(name)
    a, c = b.dim("a", elements_each // 2**20), b.dim("c", 2**20)
    one = b.dim("one", 1)
    for k in range(count):
        b.input(f"z{k}", [a, c])
    p = b.parameter("p", [one])
    return b.build(b.reduce(b.square(p), [], fn="sum", name="loss"))


def test_the_graph_bound_is_inclusive_and_counts_reads():
    g = inputs_graph(63)
    assert g.weighted_elements() == 63 * 2**50 + 1 + 2 + 1 + 1  # p read once, square read once, loss
    with pytest.raises(GraphError, match=r"graph 'wide' is too large: its tensors hold .* elements, counted once "
                                         r"plus once per read by an op, more than the limit of 2\*\*56"):
        inputs_graph(64)
    assert MAX_GRAPH_ELEMENTS == 2**56


def test_zoo_sizes_are_bounded_like_graph_dims():
    with pytest.raises(GraphError, match=r"override 'batch=99999999999999999999': batch must be at most 2\*\*40"):
        zoo.parse_overrides(["batch=99999999999999999999"])
    with pytest.raises(GraphError, match=r"override batch=...: an integer of 5,000 digits is out of range"):
        zoo.parse_overrides(["batch=" + "9" * 5000])
    with pytest.raises(GraphError, match=r"model 'mtf-ffn': batch must be at most 2\*\*40"):
        zoo.build("mtf-ffn", batch=10**20)
    with pytest.raises(GraphError, match=r"model 'gpt': batch must be at most 2\*\*40"):
        zoo.build("gpt", batch="99999999999999999999")
    with pytest.raises(GraphError, match=r"override 'layers=100000': layers must be at most 10,000"):
        zoo.parse_overrides(["layers=100000"])
    from layoutsearch.zoo.mtf_ffn import mtf_ffn
    with pytest.raises(GraphError, match=r"model 'mtf-ffn': io must be at most 2\*\*40"):
        mtf_ffn(io=2**41)
    with pytest.raises(GraphError, match=r"tensor 'w' has 1,000,000,000,000,000,000 elements"):
        zoo.build("mtf-ffn", io=10**9, hidden=10**9)


# -- exact counts near the bounds -----------------------------------------------------------------------------------

def big_graph(extra_inputs=8):
    """x[a, b] (just under 2**50 elements), ``extra_inputs`` more of its size (fed, unused), w[b], y = x.w, loss."""
    a, b = 2**30 - 2, 2**20 - 1
    B = GraphBuilder("big")
    da, db = B.dim("a", a), B.dim("b", b)
    x = B.input("x", [da, db])
    for k in range(extra_inputs):
        B.input(f"z{k}", [da, db])
    w = B.parameter("w", [db])
    return B.build(B.reduce(B.einsum([x, w], [da], name="y"), [], fn="sum", name="loss")), a, b


def test_a_layout_near_the_bounds_gets_an_exact_positive_memory_figure():
    g, a, b = big_graph()
    r = ls.estimate(g, Layout.from_rules(Mesh.parse("data:2"), ""), "cpu-sim", optimizer="sgd", precision="fp32")
    # fp32, SGD, nothing split: the peak is at grad/w = einsum(grad/y, x): the 9 inputs, w, the loss (kept to the
    # end), grad/y[a] and grad/w[b] (y died after the loss; grad/loss after grad/y)
    expected = 9 * 4 * a * b + 4 * b + 4 + 4 * a + 4 * b
    assert r.memory.peak_op == "grad/w"
    assert r.memory.peak_bytes == expected == r.to_dict()["memory_bytes"]
    assert isinstance(r.memory.peak_bytes, int) and 2**55 < expected < 2**63
    assert int(float(expected)) != expected  # beyond float64's precision: exact only as an integer
    assert all(isinstance(v, int) and 0 <= v < 2**63 for v in r.memory.timeline)


def test_the_mtf_ffn_of_the_report_near_the_bound_is_priced_positively():
    g = zoo.build("mtf-ffn", io=2**25, hidden=2**25, batch=1024)
    r = ls.estimate(g, Layout.from_rules(Mesh.parse("data:2"), "io:data,hidden:data"), "tpu-v4", remat="selective")
    # parameters w[io, hidden], v[hidden, io] split in two over io, mixed precision Adam: 2 (bf16) + 2 (gradient)
    # + 4 + 4 + 4 (master, m, v) bytes per element, 2**49 elements each per device
    params = 2 * 16 * 2**49
    assert params < r.memory.peak_bytes < params + 2**40 and not r.fits
    d = r.to_dict()
    assert 0 < d["memory_bytes"] < 2**63


def test_the_largest_allowed_graph_keeps_every_count_below_2_63():
    g = inputs_graph(63)
    r = ls.estimate(g, Layout.from_rules(Mesh.parse("data:8"), "a:data"), "h100")
    assert r.memory.breakdown["inputs"] == 63 * 2**50 * 2 // 8  # bfloat16 under mixed precision, split in 8
    assert r.memory.peak_bytes == sum(r.memory.breakdown.values())

    def walk(v):
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)
        elif isinstance(v, int | float) and not isinstance(v, bool):
            assert abs(v) < 2**63 and v == v and abs(v) != float("inf"), v
    walk(r.to_dict())
    json.dumps(r.to_dict(), allow_nan=False)


def test_the_python_integer_path_of_the_memory_simulation_agrees(monkeypatch):
    g, _, _ = big_graph(extra_inputs=3)
    layout = Layout.from_rules(Mesh.parse("data:2"), "a:data")
    fast = ls.estimate(g, layout, "cpu-sim", optimizer="sgd", precision="fp32").memory
    monkeypatch.setattr(memory, "_magnitude_bound", lambda *args: 2**63)
    exact = ls.estimate(g, layout, "cpu-sim", optimizer="sgd", precision="fp32").memory
    assert exact == fast and exact.timeline == fast.timeline
    assert all(type(v) is int for v in (exact.peak_bytes, *exact.breakdown.values(), *exact.timeline))


# -- cost DAGs ------------------------------------------------------------------------------------------------------

def dag_file(tmp_path, nodes, edges=()):
    p = tmp_path / "dag.json"
    p.write_text(json.dumps({"nodes": nodes, "edges": list(edges)}))
    return p


@pytest.mark.parametrize("node, fragment", [
    ({"name": "a", "compute_s": 1, "memory_bytes": 10**30}, "nodes[0].memory_bytes must be at most 2**62"),
    ({"name": "a", "compute_s": 1, "memory_bytes": 10**40}, "nodes[0].memory_bytes: an integer of 41 digits is out"),
    ({"name": "a", "compute_s": 1, "memory_bytes": 1e300}, "nodes[0].memory_bytes must be at most 2**62"),
    ({"name": "a", "compute_s": 1, "activation_bytes": -1}, "nodes[0].activation_bytes must be an integer"),
    ({"name": "a", "compute_s": 1e300}, "nodes[0].compute_s must be at most 1e+12 seconds"),
    ({"name": "a", "compute_s": "1"}, "nodes[0].compute_s must be a finite number"),
    ({"name": ["a"], "compute_s": 1}, "nodes[0].name: expected a non-empty string"),
    ({"name": "a", "compute_s": 1, "layer": [0]}, "nodes[0].layer: expected an integer or null"),
])
def test_cost_dag_fields_are_checked_and_named(tmp_path, node, fragment):
    with pytest.raises(CostDAGError) as e:
        load_costdag(dag_file(tmp_path, [node]))
    assert str(e.value).startswith(str(tmp_path / "dag.json")) and fragment in str(e.value), str(e.value)


def test_cost_dag_edges_with_a_list_as_src(tmp_path):
    nodes = [{"name": "a", "compute_s": 1}, {"name": "b", "compute_s": 1}]
    with pytest.raises(CostDAGError, match=r"edges\[0\].src: expected a non-empty string"):
        load_costdag(dag_file(tmp_path, nodes, [{"src": ["a"], "dst": "b", "transfer_s": 0}]))
    with pytest.raises(CostDAGError, match=r"edges\[0\].tensor: expected a non-empty string or null"):
        load_costdag(dag_file(tmp_path, nodes, [{"src": "a", "dst": "b", "transfer_s": 0, "tensor": [1]}]))
    with pytest.raises(CostDAGError, match="src and dst must be node names"):
        CostDAG((Node("a", 1), Node("b", 1)), (Edge(["a"], "b"),))


def test_cost_dag_totals_stay_in_int64(tmp_path):
    nodes = [{"name": n, "compute_s": 1, "memory_bytes": 2**61 + 1} for n in "ab"]
    with pytest.raises(CostDAGError, match=r"the nodes' memory_bytes add up to .* more than 2\*\*62"):
        load_costdag(dag_file(tmp_path, nodes))


def test_cost_dag_json_is_read_strictly(tmp_path):
    p = tmp_path / "dag.json"
    p.write_text('{"nodes": [{"name": "a", "compute_s": 1, "compute_s": 2}]}')
    with pytest.raises(CostDAGError, match=r"nodes\[0\]: duplicate key 'compute_s'"):
        load_costdag(p)
    p.write_text('{"nodes": [{"name": "a", "compute_s": NaN}]}')
    with pytest.raises(CostDAGError, match=r"nodes\[0\].compute_s: NaN is not a JSON number"):
        load_costdag(p)
    p.write_bytes(b'{"nodes": [{"name": "\xfe"}]}')
    with pytest.raises(CostDAGError, match="not UTF-8 text: byte 0xfe at offset 21"):
        load_costdag(p)
    p.write_text('{"nodes": [{"name": "a", "compute_s": 1, "memory_bytes": ' + "1" * 5000 + "}]}")
    with pytest.raises(CostDAGError, match=r"nodes\[0\].memory_bytes: an integer of 5,000 digits is out of range"):
        load_costdag(p)


# -- hardware figures, meshes, byte sizes ---------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, fragment", [
    ("peak_flops", float("inf"), "peak_flops=inf must be a finite number"),
    ("peak_flops", "inf", "peak_flops='inf' must be a finite number"),
    ("peak_flops", float("nan"), "peak_flops=nan must be a finite number"),
    ("hbm_bytes", 10**400, "hbm_bytes=(an integer of 1329 bits) is not a valid float"),
    ("fast_link_bandwidth", 1e-300, "fast_link_bandwidth=1e-300 is out of range"),
    ("matmul_efficiency", 1e-300, "matmul_efficiency=1e-300 is out of range"),
    ("devices_per_node", 10**400, "devices_per_node=(an integer of 1329 bits) is not a valid int"),
    ("memory_reserved", float("-inf"), "memory_reserved=-inf must be a finite number"),
    ("peak_flops", 1e31, "peak_flops=1e+31 is out of range"),
])
def test_hardware_overrides_must_be_finite(key, value, fragment):
    with pytest.raises(HardwareError) as e:
        hardware("h100", **{key: value})
    assert fragment in str(e.value), str(e.value)


def test_hardware_overrides_on_the_command_line_are_one_line_exit_2(capsys):
    for hw in ("peak_flops=inf", "peak_flops=nan", "fast_link.bandwidth=1e-300", "hbm_bytes=1" + "0" * 400):
        code, out, err = run(capsys, "cost", "mtf-ffn", "--mesh", "data:2", "--hardware", "h100", "--hw", hw,
                             "--json")
        assert code == 2 and out == "" and err.count("\n") == 1 and "hardware figure" in err, err


def test_hardware_name_override_renames_and_is_checked():
    hw = hardware("h100", name="my-h100", peak_flops=1e15)  # `name` is positional only: no collision
    assert (hw.name, hw.peak_flops) == ("my-h100", 1e15)
    with pytest.raises(HardwareError, match="hardware name must be a non-empty string"):
        hardware("h100", name=3)


def test_json_output_is_strict_json():
    # what the tool writes never holds NaN/Infinity (not JSON): a non-finite number is written as null
    text = strictjson.dumps({"a": float("inf"), "b": [float("nan"), 1.5, (float("-inf"),)], "c": {"d": 2}})
    assert json.loads(text) == {"a": None, "b": [None, 1.5, [None]], "c": {"d": 2}}
    assert "Infinity" not in text and "NaN" not in text


def test_hardware_profiles_with_infinity_or_duplicates_are_refused(tmp_path):
    doc = {"hardware": hardware_to_json(hardware("h100"))}
    p = tmp_path / "hw.json"
    p.write_text(json.dumps(doc).replace('"peak_flops": 989000000000000.0', '"peak_flops": Infinity'))
    with pytest.raises(HardwareError, match=r"hardware profile .*hw.json: hardware.peak_flops: Infinity is not a "
                                            r"JSON number"):
        hardware(str(p))
    p.write_text(json.dumps(doc).replace('"peak_flops": 989000000000000.0', '"peak_flops": 1, "peak_flops": 2'))
    with pytest.raises(HardwareError, match=r"hardware: duplicate key 'peak_flops'"):
        hardware(str(p))
    p.write_text(json.dumps(doc).replace('"peak_flops": 989000000000000.0', '"peak_flops": 1e-300'))
    with pytest.raises(HardwareError, match=r"hardware.peak_flops = 1e-300 is out of range"):
        hardware(str(p))


@pytest.mark.parametrize("text, fragment", [
    ("data:" + "9" * 5000, "a mesh has at most 2**20"),
    ("data:99999999999999999999", "a mesh has at most 2**20"),
    ("data:1024,model:2048", "has 2,097,152 devices"),
    ("data:2\n", None),
    ("data:2,model:٣", "bad mesh axis"),
])
def test_mesh_sizes_are_bounded(text, fragment):
    if fragment is None:
        assert Mesh.parse(text).size == 2
        return
    with pytest.raises(MeshError) as e:
        Mesh.parse(text)
    assert fragment in str(e.value)


def test_mesh_axes_are_type_checked():
    with pytest.raises(MeshError, match="invalid mesh axis name"):
        Mesh(((["data"], 2),))
    with pytest.raises(MeshError, match="mesh axes must be"):
        Mesh(("data", 2))


@pytest.mark.parametrize("text", ["1e308TiB", "9" * 5000, pytest.param(10**5000, id="huge-int"), 2**62 + 1, "5e18",
                                  float("inf")])
def test_byte_sizes_are_bounded(text):
    with pytest.raises(LayoutSearchError, match="bad byte size"):
        parse_bytes(text)
    assert parse_bytes("4611686018427387904") == 2**62


# -- the command line: exit 2, one line -----------------------------------------------------------------------------

@pytest.mark.parametrize("make, argv, fragment", [
    (lambda p: p.write_bytes(b'{"name": "\x80"}'), [], "not UTF-8 text"),
    (lambda p: p.write_text("[" * 100_000), [], "nested deeper"),
    (lambda p: p.write_text(mutated(lambda d: op(d, "h").__setitem__("block", ["b"]))), [], "ops[0].block"),
    (lambda p: p.write_text(mutated(lambda d: d["dims"].__setitem__("batch", 2**64))), [], "must be at most 2**40"),
    (lambda p: p.write_text(mutated(lambda d: op(d, "h").__setitem__("inputs", "xw"))), [], "ops[0].inputs"),
    (lambda p: p.write_text(json.dumps(BASE).replace('"dims": {', '"dims": {"batch": 3, ', 1)), [],
     "duplicate key 'batch'"),
])
def test_bad_graph_files_exit_2_with_one_line(capsys, tmp_path, make, argv, fragment):
    p = tmp_path / "bad.json"
    make(p)
    code, out, err = run(capsys, "cost", p, "--mesh", "data:2", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and fragment in err, err


@pytest.mark.parametrize("argv, fragment", [
    (["--set", "batch=99999999999999999999"], "batch must be at most 2**40"),
    (["--set", "io=1000000000", "--set", "hidden=1000000000", "--layout", "io:data,hidden:data",
      "--hardware", "tpu-v4", "--remat", "selective"], "tensor 'w' has"),
])
def test_huge_sizes_on_the_command_line_exit_2(capsys, argv, fragment):
    code, out, err = run(capsys, "cost", "mtf-ffn", "--mesh", "data:2", *argv, "--json")
    assert code == 2 and out == "" and err.count("\n") == 1 and fragment in err, err


# -- found outside the readers (reported to their owners): strict xfails, so a fix shows up ------------------------

def test_a_block_cut_off_from_the_loss_is_priced():
    """Flash attention (h100: attention auto = flash) in layers whose outputs reach no loss: their forward ops
    are priced, and nothing is recomputed for a backward pass they do not have (was a StopIteration)."""
    d = json.loads((zoo.JSON_DIR / "gpt.json").read_text())
    final = op(d, "final_ln_scaled")
    final["inputs"][0] = "embedded"  # the layers now reach no loss: they have no backward ops
    g = graph_from_json(json.dumps(d))
    rep = ls.estimate(g, Layout.from_rules(Mesh.parse("data:2"), "batch:data"), "h100")
    assert rep.attention == "flash" and rep.step_s > 0
    layers = [o for o in rep.ops if (o.block or "").startswith("layer.")]
    assert any(o.phase == "forward" and o.matmul for o in layers)  # their forward pass is priced
    assert not any(o.phase in ("backward", "recompute") and o.kind != "elementwise" for o in layers)  # zero grads
    assert not any(o.phase == "recompute" for o in rep.ops)
    whole = ls.estimate(graph_from_json((zoo.JSON_DIR / "gpt.json").read_text()),
                        Layout.from_rules(Mesh.parse("data:2"), "batch:data"), "h100")
    assert any(o.phase == "recompute" for o in whole.ops)  # the intact model recomputes its attention


def test_partition_memory_does_not_wrap_around():
    from layoutsearch.errors import PartitionError
    from layoutsearch.solvers.partition import partition

    dag = CostDAG(tuple(Node(n, 1.0, activation_bytes=2**59) for n in "abc"), (Edge("a", "b"), Edge("b", "c")))
    # every 2-stage split has a stage of two nodes: 2 * 8 * 2**59 = 2**63 bytes > the limit
    with pytest.raises(PartitionError, match="no partition"):
        partition(dag, 2, microbatches=8, memory_limit=2**62, solver="dp")


# -- issue 33: placement instances, huge counts ----------------------------------------------------------------------

INSTANCE = {"maxSizePerFPGA": 1000, "maxFPGAs": 2, "maxCPUs": 1,
            "nodes": [{"id": 1, "name": "a", "supportedOnFpga": True, "cpuLatency": 5, "fpgaLatency": 1},
                      {"id": 2, "name": "b", "supportedOnFpga": False, "cpuLatency": 2},
                      {"id": 3, "name": "c", "supportedOnFpga": 1, "cpuLatency": 5, "fpgaLatency": 1}],
            "edges": [{"sourceId": 1, "destId": 2, "cost": 1}, {"sourceId": 2, "destId": 3, "cost": 1}]}


def instance(tmp_path, change=None, name="inst.json"):
    d = copy.deepcopy(INSTANCE)
    if change is not None:
        change(d)
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def refused(capsys, *argv):
    """``layoutsearch ARGV``: exit 2, nothing on stdout, one line on stderr; that line."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("layoutsearch: error: "), (code, err)
    return err


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d["edges"][0].__setitem__("sourceId", [1]), "edges[0].sourceId must be a node id (an integer), got [1]"),
    (lambda d: d["edges"][1].__setitem__("destId", {"a": 1}), "edges[1].destId must be a node id"),
    (lambda d: d["edges"][0].__setitem__("sourceId", 1.0), "edges[0].sourceId must be a node id"),
    (lambda d: d["nodes"][0].__setitem__("id", -1), "nodes[0].id must be an integer from 0 to 2**63 - 1"),
    (lambda d: d["nodes"][0].__setitem__("id", 2**64), "nodes[0].id must be an integer from 0 to 2**63 - 1"),
    (lambda d: d["nodes"][1].__setitem__("supportedOnFpga", "false"),
     "nodes[1].supportedOnFpga must be true or false (or 1 or 0), got 'false'"),
    (lambda d: d["nodes"][0].__setitem__("isBackwardNode", "false"), "nodes[0].isBackwardNode must be true or false"),
    (lambda d: d["nodes"][0].__setitem__("isBackwardNode", 2), "nodes[0].isBackwardNode must be true or false"),
    (lambda d: d["nodes"][0].__setitem__("colorClass", [1]), "nodes[0].colorClass must be an integer or a string"),
    (lambda d: d["nodes"][0].__setitem__("name", ["a"]), "nodes[0].name must be a string"),
    (lambda d: d["nodes"][0].__setitem__("layerId", "1"), "nodes[0].layerId must be an integer"),
])
def test_placement_instance_ids_and_flags_are_type_checked(capsys, tmp_path, change, fragment):
    err = refused(capsys, "partition", instance(tmp_path, change))
    assert "inst.json: " + fragment in err, err


def test_a_cpu_only_node_stays_off_the_accelerators(capsys, tmp_path):
    part = json.loads(run(capsys, "partition", instance(tmp_path), "--json")[1])
    assert [s for s in part["stages"] if "b" in s["nodes"]][0]["device"].startswith("cpu")


def test_an_infeasible_expert_split_is_an_error_not_inf_units(capsys, tmp_path):
    expert = tmp_path / "expert.json"
    expert.write_text(json.dumps({"fpgas": [{"nodes": [1, 2, 3]}], "cpus": []}))
    err = refused(capsys, "partition", instance(tmp_path), "--expert", expert)
    assert "the expert split is infeasible: it places node 'b' on accelerator 0, where it cannot run" in err


@pytest.mark.parametrize("flags, fragment", [
    (["--stages", "1000000000"], "must be an integer from 1 to 4096, got 1000000000"),
    (["--stages", "1000000000", "--at-most"], "must be an integer from 1 to 4096"),
    (["--stages", "1000000000", "--objective", "gpipe"], "must be an integer from 1 to 4096"),
    (["--stages", "5"], "cannot split 3 nodes of cost DAG 'dag' into 5 non-empty stages"),
    (["--stages", "2", "--microbatches", "1000000000"],
     "microbatches must be an integer from 1 to 65536, got 1000000000"),
])
def test_stage_and_microbatch_counts_are_bounded(capsys, tmp_path, flags, fragment):
    dag = tmp_path / "inst.json"
    dag.write_text(json.dumps({"format": "layoutsearch.costdag", "version": 1,
                               "nodes": [{"name": n, "compute_s": 1} for n in "abc"],
                               "edges": [{"src": "a", "dst": "b", "transfer_s": 0.1},
                                         {"src": "b", "dst": "c", "transfer_s": 0.1}]}))
    assert fragment in refused(capsys, "partition", dag, *flags)


def test_at_most_more_stages_than_nodes_uses_at_most_one_per_node(capsys, tmp_path):
    part = json.loads(run(capsys, "partition", instance(tmp_path), "--stages", "4096", "--at-most", "--json")[1])
    assert part["num_stages"] <= 3


# -- issue 33: plan files are read field by field, their figures priced again; run's counts are bounded -------------

@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A rules plan and a per-op plan of mtf-ffn on data:2 (cpu-sim), as saved documents."""
    d = tmp_path_factory.mktemp("plans")
    g = zoo.build("mtf-ffn")
    ls.search(g, "data:2", hardware="cpu-sim", baselines=False).save(d / "rules.json")
    ls.search(g, "data:2", hardware="cpu-sim", space="ops", baselines=False).save(d / "ops.json")
    return {k: json.loads((d / f"{k}.json").read_text()) for k in ("rules", "ops")}


def tampered(plans, tmp_path, kind, change, name="plan.json"):
    doc = copy.deepcopy(plans[kind])
    change(doc)
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def put(path, value):
    """A change setting ``doc[path[0]][path[1]]... = value``."""
    def change(doc):
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value
    return change


@pytest.mark.parametrize("kind, change, fragment", [
    ("rules", put(["plan", "step_s"], "fast"), "plan.step_s: expected a finite number >= 0, got 'fast'"),
    ("ops", put(["plan", "step_s"], -1.0), "plan.step_s: expected a finite number >= 0, got -1.0"),
    ("ops", put(["plan", "memory_bytes"], 1e15 + 0.5), "plan.memory_bytes: expected an integer"),
    ("ops", put(["plan", "layout", "mesh"], "data:4"),
     "plan.mesh 'data:2' (2 devices) is not the layout's mesh 'data:4'"),
    ("rules", put(["plan", "devices"], 4), "is not the layout's mesh"),
    ("rules", put(["plan", "optimal"], "yes"), "plan.optimal: expected true or false, got 'yes'"),
    ("rules", put(["plan", "gap"], -3), "plan.gap: expected a finite number >= 0 or null, got -3"),
    ("rules", put(["plan", "gap"], 2.0), "plan.gap: expected at most 1"),
    ("rules", put(["plan", "cut_short"], "abc"), "plan.cut_short: expected a list, got 'abc'"),
    ("rules", put(["plan", "cut_short"], [3]), "plan.cut_short[0]: expected a string, got 3"),
    ("rules", put(["plan", "runner_ups"], [{"name": "#2"}]), "plan.runner_ups[0].rules: missing"),
    ("rules", put(["plan", "decisions", 0, "fits"], "true"), "plan.decisions[0].fits: expected true or false"),
    ("rules", put(["plan", "microbatches"], 0), "plan.microbatches: expected an integer from 1"),
    ("rules", put(["plan", "hardware"], "h100"), "plan.hardware 'h100' is not the hardware's name 'cpu-sim'"),
    ("rules", put(["plan", "model"], "gpt"), "plan.model 'gpt' is not the model's name 'mtf-ffn'"),
    ("ops", put(["plan", "layout", "iteration", "h"], {"nope": ["data"]}), "plan.layout.iteration"),
    ("ops", put(["plan", "layout", "iteration", "h"], {"batch": ["model"]}), "plan.layout.iteration"),
])
def test_a_tampered_plan_file_is_refused_naming_the_field(capsys, plans, tmp_path, kind, change, fragment):
    p = tampered(plans, tmp_path, kind, change)
    with pytest.raises(LayoutSearchError) as e:
        ls.Plan.load(p)
    assert str(e.value).startswith(f"{p}: ") and fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert fragment in refused(capsys, "export", p, "--format", "specs")


@pytest.mark.parametrize("kind", ["rules", "ops"])
def test_saved_figures_are_priced_again_not_trusted(plans, tmp_path, kind):
    saved = plans[kind]["plan"]
    p = tampered(plans, tmp_path, kind, lambda d: d["plan"].update(step_s=123.0, memory_bytes=10**15, fits=True))
    plan = ls.Plan.load(p)
    assert plan.step_s == pytest.approx(saved["step_s"]) and plan.memory_bytes == saved["memory_bytes"]
    assert plan.chosen.fits


def test_a_plan_named_as_a_preset_with_other_figures_is_labelled_modified(plans, tmp_path):
    h100 = json.loads(json.dumps(hardware_to_json(hardware("h100"))))
    p = tampered(plans, tmp_path, "rules", lambda d: (d["hardware"].update(name="h100"),
                                                      d["plan"].update(hardware="h100")))
    assert ls.Plan.load(p).hardware.name == "h100 (modified)"
    p = tampered(plans, tmp_path, "rules", lambda d: (d.__setitem__("hardware", h100),
                                                      d["plan"].update(hardware="h100")))
    assert ls.Plan.load(p).hardware.name == "h100"


def test_run_of_a_plan_whose_arrays_cannot_fit_the_host_is_refused_before_allocating(capsys, plans, tmp_path):
    p = tampered(plans, tmp_path, "rules", put(["model", "dims", "batch"], 2**40))
    assert "of host memory (its parameters, optimizer state and batch drawn on the host)" in \
        refused(capsys, "run", p, "--steps", "2")


@pytest.mark.parametrize("argv, fragment", [
    (["--steps", "1000000000000"], "--steps must be an integer from 1 to 1,000,000, got 1,000,000,000,000"),
    (["--seed", "-1"], "--seed must be an integer from 0 to 2**32 - 1, got -1"),
    (["--steps", "1000000", "--max-time", "0.001"], "1,000,000 steps are predicted to take"),
])
def test_run_counts_are_bounded(capsys, plans, tmp_path, argv, fragment):
    p = tampered(plans, tmp_path, "rules", lambda d: None)
    assert fragment in refused(capsys, "run", p, *argv)


def test_run_of_a_missing_file_says_so(capsys):
    assert "'nope.json': no such file" in refused(capsys, "run", "nope.json", "--steps", "2")


def test_more_simulated_devices_than_the_bound_are_refused_before_starting_them(capsys, tmp_path):
    err = refused(capsys, "run", "mtf-ffn", "--mesh", "data:1000000")
    assert "a mesh of 1,000,000 devices needs 1,000,000 accelerators" in err and "at most 4096 simulated" in err
    err = refused(capsys, "calibrate", "--mesh", "data:1000000", "--quick", "--out", tmp_path / "p.json")
    assert "at most 4096 simulated CPU devices are started" in err and not (tmp_path / "p.json").exists()


# -- issue 33: the command line on large or odd requests -------------------------------------------------------------

def test_graph_of_many_layers_folds_the_repeated_parameters(capsys):
    code, out, err = run(capsys, "graph", "gpt", "--set", "layers=200")
    assert code == 0 and "layer.*/wo_ff (x200)" in out and "layer.7/" not in out
    assert len(out.splitlines()) < 60


def test_a_mesh_axis_that_divides_no_dim_is_noted(capsys):
    code, out, err = run(capsys, "search", "gpt", "--mesh", "data:2,model:3", "--json")
    assert code == 0 and json.loads(out)["devices"] == 6
    assert "layoutsearch: note: mesh axis 'model' (3) divides no dim of 'gpt': no layout rule can split over it" in err


def test_an_enumeration_too_large_for_a_float_is_refused_readably(capsys):
    code, out, err = run(capsys, "search", "gpt", "--mesh", "data:2,model:4", "--space", "ops", "--solver", "enumerate")
    last = err.splitlines()[-1]  # (after the search's progress lines, on a slow machine)
    assert code == 2 and out == "" and last.startswith("layoutsearch: error: enumeration would evaluate about 10**")


def test_an_enumeration_too_large_is_refused_before_the_space_is_priced(monkeypatch, capsys):
    from layoutsearch.solvers import build

    add_op_items = build._Builder.add_op_items

    def priced(self):
        assert self.kind != "ops", "the ops space was priced before the size check"
        add_op_items(self)

    monkeypatch.setattr(build._Builder, "add_op_items", priced)
    code, _, err = run(capsys, "search", "mtf-ffn", "--mesh", "data:2,model:2", "--space", "ops",
                       "--solver", "enumerate")
    assert code == 2 and err.splitlines()[-1].startswith("layoutsearch: error: enumeration would evaluate 1.65e+33")


# -- issue 33: import specs and user code that exits or prints -------------------------------------------------------

IMPORT_SPEC = {"args": [{"w": {"dims": ["d_model", "d_ff"], "shape": [8, 16]}},
                        {"dims": ["batch", "d_model"], "shape": [4, 8]}]}
LOSS = "import jax.numpy as jnp\n\ndef loss(p, x):\n    return jnp.mean(jnp.tanh(x @ p['w']))\n"


def user_module(tmp_path, monkeypatch, name, text, spec=None):
    """``name.py`` and ``spec.json`` in ``tmp_path``, the current directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{name}.py").write_text(text)
    (tmp_path / "spec.json").write_text(json.dumps(spec or IMPORT_SPEC))
    return f"{name}:loss"


@pytest.mark.parametrize("argnums", [[5], [-1]])
def test_params_argnums_out_of_range_are_refused(capsys, tmp_path, monkeypatch, argnums):
    target = user_module(tmp_path, monkeypatch, f"argnums{abs(argnums[0])}", LOSS,
                         {**IMPORT_SPEC, "params_argnums": argnums})
    err = refused(capsys, "import", target, "--dims", "spec.json")
    assert f"spec.json: params_argnums: {argnums[0]} is not an argument index (the spec gives 2 arguments" in err
    with pytest.raises(GraphError, match="params_argnums: 5 is not an argument index"):
        from layoutsearch.importer import from_jax
        from_jax(lambda p, x: (p * x).sum(), 1.0, 2.0, dims=(None, None), params_argnums=(5,))


@pytest.mark.parametrize("name, text, call", [
    ("exits_at_import", "import sys\nsys.exit(3)\n", "sys.exit(3) at exits_at_import.py:2"),
    ("exits_when_traced", LOSS.replace("    return", "    import sys; sys.exit(3)\n    return"),
     "sys.exit(3) at exits_when_traced.py:4"),
    ("os_exits_at_import", "import os\nos._exit(7)\n", "os._exit(7) at os_exits_at_import.py:2"),
    ("os_exits_when_traced", LOSS.replace("    return", "    import os; os._exit(7)\n    return"),
     "os._exit(7) at os_exits_when_traced.py:4"),
])
def test_user_code_that_exits_is_one_message_naming_its_line(capsys, tmp_path, monkeypatch, name, text, call):
    target = user_module(tmp_path, monkeypatch, name, text)
    err = refused(capsys, "import", target, "--dims", "spec.json")
    assert f"{target}: the user's code called {call} while imported or traced" in err, err


def test_user_code_that_prints_leaves_the_json_output_intact(capsys, tmp_path, monkeypatch):
    target = user_module(tmp_path, monkeypatch, "chatty", "print('importing')\n" + LOSS.replace(
        "    return", "    print('tracing')\n    return"))
    code, out, err = run(capsys, "import", target, "--dims", "spec.json", "--json")
    assert code == 0 and json.loads(out)["target"] == target and "importing" in err and "tracing" in err


def test_an_out_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """An interrupted write leaves the old file (or none): the text goes to a temporary file, renamed over it."""
    from layoutsearch.ir import strictjson

    target = tmp_path / "plan.json"
    target.write_text("old\n")

    def fail(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(strictjson.os, "replace", fail)
    with pytest.raises(KeyboardInterrupt):
        strictjson.write_text(target, "new\n")
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    monkeypatch.undo()
    strictjson.write_text(target, "new\n")
    assert target.read_text() == "new\n"


# -- Ctrl-C at any moment -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("delay", [0.05, 0.3, 1.0])
def test_ctrl_c_while_modules_import_is_one_line_and_exit_130(delay):
    """SIGINT early in a command that imports JAX (`run`): while the command's modules and JAX import, and
    whatever else is under way by then, it is one line and status 130, never a traceback (the delays count
    from the interpreter's start, the moment the console script imports `layoutsearch.cli`)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    code = ("import sys\n"
            "print('started', file=sys.stderr, flush=True)\n"
            "sys.argv[0] = 'layoutsearch'\n"
            "from layoutsearch.cli import run\n"
            "run()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, "run", "mtf-ffn", "--mesh", "data:2", "--steps", "3000"],
                            cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr.readline() == "started\n"
        time.sleep(delay)
        if proc.poll() is not None:
            pytest.skip(f"the command had ended after {delay} s")  # a fast machine: nothing to interrupt
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == "layoutsearch: interrupted", err
    assert err.count("interrupted") == 1, err
    assert out == ""


# -- issue 33: one property test per reader (plan files, placement instances, import specs; graph files, cost DAGs
# and hardware profiles are fuzzed in test_fuzz.py): malformed documents raise only LayoutSearchErrors, one line,
# naming the file they came from -------------------------------------------------------------------------------------

READER_EXAMPLES = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


def refused_naming(error, source):
    msg = str(error)
    assert isinstance(error, LayoutSearchError) and msg.startswith(f"{source}: ") and "\n" not in msg, msg


@READER_EXAMPLES
@given(st.data())
def test_mutated_plan_files_raise_only_layoutsearch_errors_naming_the_file(plans, data):
    text = mutated_document(data, plans[data.draw(st.sampled_from(["rules", "ops"]))])
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    try:
        plan = ls.Plan.from_json(text, "fuzz-plan.json")
    except LayoutSearchError as e:
        refused_naming(e, "fuzz-plan.json")
        return
    assert plan.step_s >= 0 and plan.memory_bytes >= 0  # what loads is priced again: its own figures are sane


@READER_EXAMPLES
@given(st.data())
def test_mutated_placement_instances_raise_only_layoutsearch_errors_naming_the_file(data):
    from layoutsearch.costdag.tarnawski import read_tarnawski
    from layoutsearch.ir import strictjson
    from layoutsearch.solvers.partition import partition

    text = mutated_document(data, INSTANCE)
    try:
        dag = read_tarnawski(strictjson.loads(text, "fuzz-instance.json", CostDAGError), "fuzz-instance.json")
    except LayoutSearchError as e:
        refused_naming(e, "fuzz-instance.json")
        return
    try:
        partition(dag, data.draw(st.integers(1, 3)))
    except LayoutSearchError as e:
        assert "\n" not in str(e), str(e)


@pytest.fixture(scope="module")
def user_loss(tmp_path_factory):
    d = tmp_path_factory.mktemp("user_loss")
    (d / "fuzzloss.py").write_text(LOSS)
    return d


@READER_EXAMPLES
@given(st.data())
def test_mutated_import_specs_raise_only_layoutsearch_errors_naming_the_file(user_loss, monkeypatch, data):
    from layoutsearch.importer import from_spec_file

    text = mutated_document(data, {**IMPORT_SPEC, "params_argnums": [0]})
    spec = user_loss / "fuzz-spec.json"
    spec.write_bytes(text if isinstance(text, bytes) else text.encode())
    monkeypatch.chdir(user_loss)  # (MODULE:FUNCTION targets are imported from the current directory)
    try:
        graph = from_spec_file("fuzzloss:loss", spec)
    except LayoutSearchError as e:
        assert (str(spec) in str(e) or str(e).startswith("fuzzloss:loss")) and "\n" not in str(e), str(e)
        return
    assert graph.ops
