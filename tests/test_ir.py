"""The IR: validation of graphs, the builder, and exact JSON round trips."""

import json

import pytest

from layoutsearch.errors import GraphError, GraphFormatError
from layoutsearch.ir import (
    Dim,
    Einsum,
    Elementwise,
    Graph,
    GraphBuilder,
    Tensor,
    graph_from_json,
    graph_to_json,
    load_graph,
)


def ffn() -> Graph:
    b = GraphBuilder("ffn")
    batch, io, hidden = b.dim("batch", 8), b.dim("io", 4), b.dim("hidden", 16)
    x, t = b.input("x", [batch, io]), b.input("target", [batch, io])
    w, v = b.parameter("w", [io, hidden]), b.parameter("v", [hidden, io])
    with b.block("layer.0"):
        h = b.relu(b.einsum([x, w], [batch, hidden], name="h"))
        y = b.einsum([h, v], [batch, io], name="y")
    loss = b.reduce(b.square(y - t), [], fn="mean", name="loss")
    return b.build(loss, meta={"model": "ffn"})


def test_builder_builds_valid_graph_with_blocks_and_topological_order():
    g = ffn()
    assert g.dims == {"batch": 8, "io": 4, "hidden": 16}
    assert g.op("layer.0/h").block == "layer.0"
    assert g.op("layer.0/h").reduced_dims(g.tensors) == ("io",)
    assert [op.name for op in g.ops][:2] == ["layer.0/h", "layer.0/relu_1"]
    assert g.producer("x") is None and [o.name for o in g.consumers["x"]] == ["layer.0/h"]
    assert len(g.parameters) == 2


def test_json_round_trip_is_exact():
    g = ffn()
    text = graph_to_json(g)
    g2 = graph_from_json(text)
    assert g2 == g
    assert graph_to_json(g2) == text


def test_ops_are_reordered_topologically():
    x = Tensor("x", (Dim("a", 2),), role="input")
    y = Tensor("y", (Dim("a", 2),))
    z = Tensor("z", (Dim("a", 2),))
    ops = [Elementwise(name="second", inputs=("y",), output="z", fn="relu"),
           Elementwise(name="first", inputs=("x",), output="y", fn="neg")]
    assert [o.name for o in Graph("g", [x, y, z], ops).ops] == ["first", "second"]


def doc(**changes):
    d = json.loads(graph_to_json(ffn()))
    d.update(changes)
    return d


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["ops"].__setitem__(0, {**d["ops"][0], "kind": "conv"}), "unknown op kind 'conv'"),
    (lambda d: d["tensors"][0].__setitem__("dims", ["batch", "nope"]), "unknown dim 'nope'"),
    (lambda d: d.pop("ops"), "missing field 'ops'"),
    (lambda d: d["tensors"].append({"name": "orphan", "dims": ["batch"], "role": "activation"}),
     r"'orphan' \(role activation\) is produced by no op"),
    (lambda d: d["ops"][0].__setitem__("inputs", ["x", "ghost"]), "unknown tensor 'ghost'"),
    (lambda d: d["tensors"][0].__setitem__("dtype", "float128"), "unknown dtype"),
    (lambda d: d.__setitem__("dims", {**d["dims"], "io": 0}), "invalid size 0"),
])
def test_malformed_graph_documents_get_clear_errors(mutate, message):
    d = doc()
    mutate(d)
    with pytest.raises(GraphError, match=message):
        graph_from_json(json.dumps(d))


def test_malformed_json_names_the_file_and_position(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"name": "x", "dims": {')
    with pytest.raises(GraphFormatError, match=r"bad.json: not valid JSON: .* line 1"):
        load_graph(p)


def test_dim_with_two_sizes_is_rejected():
    t1 = Tensor("a", (Dim("batch", 2),), role="input")
    t2 = Tensor("b", (Dim("batch", 3),), role="input")
    with pytest.raises(GraphError, match="dim 'batch' has two sizes: 2 in tensor 'a' and 3 in tensor 'b'"):
        Graph("g", [t1, t2], [])


def test_cycle_is_rejected_with_its_ops():
    a = Dim("a", 2)
    ts = [Tensor("x", (a,)), Tensor("y", (a,))]
    ops = [Elementwise(name="f", inputs=("y",), output="x", fn="neg"),
           Elementwise(name="g", inputs=("x",), output="y", fn="neg")]
    with pytest.raises(GraphError, match="cycle: (f -> g -> f|g -> f -> g)"):
        Graph("cyc", ts, ops)


def test_shape_mismatches_are_rejected():
    a, b, c = Dim("a", 2), Dim("b", 3), Dim("c", 4)
    x, w = Tensor("x", (a, b), role="input"), Tensor("w", (b,), role="parameter")
    with pytest.raises(GraphError, match="output dims \\['c'\\] appear in no input"):
        Graph("g", [x, w, Tensor("y", (a, c))], [Einsum(name="e", inputs=("x", "w"), output="y")])
    with pytest.raises(GraphError, match="input 'x' has dims \\['b'\\] missing from the output"):
        Graph("g", [x, w, Tensor("y", (a,))], [Elementwise(name="e", inputs=("x", "w"), output="y", fn="add")])


def test_tensor_produced_twice_and_fed_tensor_written_are_rejected():
    a = Dim("a", 2)
    x, y = Tensor("x", (a,), role="input"), Tensor("y", (a,))
    with pytest.raises(GraphError, match="produced by two ops"):
        Graph("g", [x, y], [Elementwise(name="f", inputs=("x",), output="y", fn="neg"),
                            Elementwise(name="g", inputs=("x",), output="y", fn="relu")])
    with pytest.raises(GraphError, match="must be fed in"):
        Graph("g", [x, y], [Elementwise(name="f", inputs=("y",), output="x", fn="neg")])


def test_builder_rejects_unknown_dims_and_duplicate_names():
    b = GraphBuilder("g")
    with pytest.raises(GraphError, match="unknown dim 'batch'"):
        b.input("x", ["batch"])
    b.dim("batch", 2)
    b.input("x", ["batch"])
    with pytest.raises(GraphError, match="'x' is used twice"):
        b.input("x", ["batch"])
    with pytest.raises(GraphError, match="two sizes"):
        b.dim("batch", 3)


def test_loss_must_be_scalar():
    b = GraphBuilder("g")
    x = b.input("x", [b.dim("a", 2)])
    with pytest.raises(GraphError, match="must be a scalar"):
        b.build(b.relu(x))


def test_with_sizes_resizes_a_dim_everywhere():
    g = ffn().with_sizes({"batch": 2})
    assert g.tensors["x"].dims[0].size == 2 and g.tensors["layer.0/h"].dims[0].size == 2
    assert g.dims["batch"] == 2 and g.ops == ffn().ops
    with pytest.raises(GraphError, match="unknown dim 'nope'"):
        ffn().with_sizes({"nope": 2})


def test_the_graph_format_page_lists_every_op_kind_and_elementwise_function():
    """docs/graph-format.md names every op kind and every elementwise function the IR accepts."""
    import re
    from pathlib import Path

    from layoutsearch.ir.ops import ELEMENTWISE_FNS, OP_KINDS

    text = (Path(__file__).resolve().parent.parent / "docs" / "graph-format.md").read_text()
    named = set(re.findall(r"`(\w+)`", text))
    assert set(OP_KINDS) - named == set()
    assert set(ELEMENTWISE_FNS) - named == set()
