"""Exports of layouts: PartitionSpecs, Flax logical_axis_rules, MaxText overrides, Python snippet."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layoutsearch import zoo
from layoutsearch.errors import LayoutError
from layoutsearch.export import flax_logical_axis_rules, maxtext_overrides, partition_specs, python_snippet
from layoutsearch.layout import Layout

GPT = zoo.build("gpt")
MESH = "data:2,model:4"


def flax_logical_to_mesh_axes(dim_names, rules):
    """Flax's ``_logical_to_mesh_axes`` (flax/linen/spmd.py), restated: rules in order; a rule claims a
    still-unassigned dim when none of its mesh axes is taken yet (a rule with no axes claims it unsplit)."""
    unassigned = object()
    result = [unassigned] * len(dim_names)
    for name, mesh_axes in rules:
        if name not in dim_names:
            continue
        pos = dim_names.index(name)
        new = set() if mesh_axes is None else {mesh_axes} if isinstance(mesh_axes, str) else set(mesh_axes)
        taken = {a for r in result if r is not unassigned and r is not None
                 for a in ([r] if isinstance(r, str) else r)}
        if not (new & taken) and result[pos] is unassigned:
            result[pos] = mesh_axes
    return tuple(None if r is unassigned else r for r in result)


def test_partition_specs_give_every_tensor_its_layout_spec():
    layout = Layout.from_rules(MESH, "batch:data,d_ff:model,heads:model")
    specs = partition_specs(layout, GPT)
    assert set(specs) == set(GPT.tensors)
    assert specs["layer.0/wi"] == (None, "model")
    assert specs["ids"] == ("data", None)
    assert specs["loss"] == ()


def test_partition_specs_check_the_layout_first():
    with pytest.raises(LayoutError, match="not divisible"):
        partition_specs(Layout.from_rules("data:3", "batch:data"), GPT)


def test_partition_specs_include_per_tensor_entries():
    layout = Layout.from_rules(MESH, "batch:data").with_tensor("embed", {"d_model": "model"})
    assert partition_specs(layout, GPT)["embed"] == (None, "model")


def test_flax_rules_use_one_axis_a_tuple_of_axes_or_none():
    layout = Layout.from_rules(MESH, "batch:data+model,d_ff:model,d_model:-")
    assert flax_logical_axis_rules(layout) == [("batch", ("data", "model")), ("d_ff", "model"), ("d_model", None)]


def test_an_empty_rule_claims_its_dim_as_in_flax():
    layout = Layout.from_rules(MESH, "d_ff:-,batch:data,d_ff:model")
    assert flax_logical_axis_rules(layout) == [("d_ff", None), ("batch", "data"), ("d_ff", "model")]
    assert "model" not in layout.spec(GPT.tensors["layer.0/ff_in"])
    t = GPT.tensors["layer.0/ff_in"]
    assert flax_logical_to_mesh_axes(list(t.dim_names), flax_logical_axis_rules(layout)) == layout.spec(t)


def test_rules_cannot_express_per_tensor_entries():
    layout = Layout.from_rules(MESH, "batch:data").with_tensor("embed", {"d_model": "model"})
    with pytest.raises(LayoutError, match="per-tensor"):
        flax_logical_axis_rules(layout)
    with pytest.raises(LayoutError, match="per-tensor"):
        maxtext_overrides(layout)


_DIMS = sorted(GPT.dims)
_AXES = st.lists(st.sampled_from(["data", "model", "fsdp"]), unique=True, max_size=2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_DIMS), _AXES), max_size=6))
def test_flax_applies_exported_rules_like_layoutsearch(rules):
    layout = Layout.from_rules("data:2,model:2,fsdp:2", rules)
    exported = flax_logical_axis_rules(layout)
    for t in GPT.tensors.values():
        assert flax_logical_to_mesh_axes(list(t.dim_names), exported) == layout.spec(t), t.name


def test_maxtext_overrides_are_plain_yaml_able_lists():
    layout = Layout.from_rules("data:2,fsdp:2,model:2", "batch:data+fsdp,d_ff:model,d_model:-")
    cfg = maxtext_overrides(layout)
    assert cfg == {
        "mesh_axes": ["data", "fsdp", "model"],
        "logical_axis_rules": [["batch", ["data", "fsdp"]], ["d_ff", ["model"]], ["d_model", []]],
        "ici_data_parallelism": 2, "ici_fsdp_parallelism": 2,
    }
    assert json.loads(json.dumps(cfg)) == cfg


def test_maxtext_overrides_rename_dims_to_maxtext_logical_axes():
    layout = Layout.from_rules(MESH, "batch:data,d_ff:model")
    cfg = maxtext_overrides(layout, {"batch": ["activation_batch"], "d_ff": ["mlp", "activation_mlp"]})
    assert cfg["logical_axis_rules"] == [["activation_batch", ["data"]], ["mlp", ["model"]],
                                         ["activation_mlp", ["model"]]]


def test_python_snippet_runs_and_rebuilds_every_partition_spec():
    layout = Layout.from_rules(MESH, "batch:data+model,d_ff:model,heads:model")
    code = python_snippet(layout, GPT)
    namespace: dict = {}
    exec(compile(code, "<snippet>", "exec"), namespace)  # noqa: S102 -- the snippet is ours; running it is the test
    assert dict(namespace["mesh"].shape) == {"data": 2, "model": 4}
    assert namespace["partition_specs"] == {t.name: layout.partition_spec(t) for t in GPT.tensors.values()}
    assert set(namespace["shardings"]) == set(GPT.tensors)
    assert namespace["logical_axis_rules"] == flax_logical_axis_rules(layout)


def test_python_snippet_of_a_per_tensor_layout_has_no_rules():
    layout = Layout.from_rules(MESH, "batch:data").with_tensor("embed", {"d_model": "model"})
    code = python_snippet(layout, GPT)
    assert "'embed': P(None, 'model')" in code
    assert "logical_axis_rules" not in code
