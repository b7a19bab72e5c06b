"""The property check: random layouts of every zoo model against what XLA compiles (issue 13, item 6).

:func:`layoutsearch.validate.draw_layouts` draws layouts with a seed (the models of ``PROPERTY_MODELS`` in turn,
meshes of 1-3 axes on the 8 simulated CPU devices, rules over the model's dims, SGD or Adam, float32) and
:func:`layoutsearch.validate.check_layout` compares the predicted collective bytes per (kind, mesh axes) and FLOPs
per device with the program XLA compiles, within the tolerances of the hand-picked agreement cases
(``tests/test_xla_agreement.py``: 2% for both, where every case there is exact).

What is claimed, and checked here:

* a **uniform** layout (every dim split one way in every tensor and op, every reshape carrying its input's
  split over: no tensor is resharded; ``kind="uniform"``) agrees, always: collective bytes and FLOPs within 2%;
* any layout's disagreement comes from XLA resharding a tensor between two layouts its rules give it (Flax
  precedence splits a dim in one tensor and not in another, or moves an axis between dims, or a reshape
  regroups a split dim): its class (:func:`layoutsearch.validate.classify`) is never ``uniform-layout``, and
  reshards XLA compiles alone are the rules' (:data:`RESHARDS`); the classes are documented in
  ``docs/cost-model.md`` ("The property check"), and ``bench/bench_xla_property.py`` lists every disagreement
  of a larger sample (``bench/RESULTS_xla_property.txt``).

The default tier draws a few layouts (about 30 s on 2 cores); ``-m slow`` a few hundred.
"""

from __future__ import annotations

import pytest

from layoutsearch.costmodel.ops import OpRules
from layoutsearch.costmodel.step import training_step
from layoutsearch.layout import Layout
from layoutsearch.validate import (
    DISAGREEMENT_CLASSES,
    PROPERTY_MODELS,
    Drawn,
    check_layout,
    classify,
    draw_layouts,
    nonuniform_splits,
)

FAST_UNIFORM = 8  # one per model
FAST_FREE = 4
SLOW_UNIFORM = 120
SLOW_FREE = 200


def _uniform_agrees(drawn: Drawn) -> None:
    g = training_step(drawn.graph(), drawn.optimizer, "fp32")
    assert not nonuniform_splits(g, drawn.layout()), drawn  # the premise: one split per dim everywhere
    _, bad = check_layout(drawn)
    assert not bad, "\n".join(map(str, bad)) + f"\n{drawn.command()}"


def _free_explained(drawn: Drawn) -> None:
    _, bad = check_layout(drawn)
    if bad:
        cls = classify(drawn, bad)
        assert cls in DISAGREEMENT_CLASSES and cls != "uniform-layout", "\n".join(map(str, bad))


def test_draws_are_reproducible_valid_and_cover_every_model():
    a, b = draw_layouts(24, seed=5), draw_layouts(24, seed=5)
    assert a == b and a != draw_layouts(24, seed=6)
    assert {d.model for d in a} == set(PROPERTY_MODELS)
    assert {len(d.layout().mesh.axes) for d in a} == {1, 2, 3}
    for d in a + draw_layouts(24, seed=5, kind="uniform"):
        d.layout().check(d.graph())
        assert d.layout().mesh.size <= 8
    free = [d for d in a if nonuniform_splits(training_step(d.graph(), d.optimizer, "fp32"), d.layout())]
    assert len(free) >= 8  # the free draws do exercise Flax precedence (non-uniform splits)


@pytest.mark.parametrize("drawn", draw_layouts(FAST_UNIFORM, seed=0, kind="uniform"), ids=str)
def test_uniform_random_layouts_agree(drawn: Drawn):
    _uniform_agrees(drawn)


@pytest.mark.parametrize("drawn", draw_layouts(FAST_FREE, seed=0), ids=str)
def test_free_random_layouts_disagree_only_where_xla_reshards(drawn: Drawn):
    _free_explained(drawn)


@pytest.mark.slow
@pytest.mark.parametrize("drawn", draw_layouts(SLOW_UNIFORM, seed=1, kind="uniform"), ids=str)
def test_many_uniform_random_layouts_agree(drawn: Drawn):
    _uniform_agrees(drawn)


@pytest.mark.slow
@pytest.mark.parametrize("drawn", draw_layouts(SLOW_FREE, seed=1), ids=str)
def test_many_free_random_layouts_disagree_only_where_xla_reshards(drawn: Drawn):
    _free_explained(drawn)


# ------------------------------------------------------------------ the fixes the property check led to

def test_hybrid_fsdp_gradients_all_reduce_over_the_kept_axis_first():
    """Issue 13's layout (FSDP over ``fsdp``, data parallel over ``data``, tensor parallel over ``model``): XLA:CPU
    all-reduces a weight gradient over ``fsdp`` (the axis its stored slice keeps), slices it, and all-reduces the
    slice over ``data`` (was predicted: all of it over data+fsdp, 36,292 bytes against 7,620). Every all-reduce
    over the data-parallel axes now agrees exactly; what still differs is listed in docs/cost-model.md (XLA
    gathers some FSDP weights again for the backward pass; the embedding lookup is resharded through a
    collective-permute, with XLA's "involuntary full rematerialization" warning)."""
    d = Drawn("gpt", "data:2,fsdp:2,model:2", "batch:data+fsdp,d_model:fsdp,heads:model,d_ff:model,vocab:model")
    result, bad = check_layout(d)
    rows = {r["what"]: r for r in result["rows"]}
    for what in ("all-reduce over data (bytes)", "all-reduce over fsdp (bytes)", "all-reduce over data+fsdp (bytes)"):
        assert rows[what]["predicted"] == rows[what]["compiled"] > 0, rows[what]
    assert rows["FLOPs per device"]["ratio"] == pytest.approx(1.0, abs=0.02)
    assert classify(d, bad) == "xla-permute-reshard"


def test_scatter_add_keeps_its_updates_layout():
    """An embedding gradient whose updates are split over ``d_model`` and whose table is stored split over
    ``vocab`` on the same axis: XLA scatters into a zero table laid out like the updates and moves the result
    with one all-to-all (2,048 bytes), where the rules gathered the updates (16,384 bytes)."""
    d = Drawn("gpt", "a:4", "vocab:a,d_model:a,d_ff:a")
    result, bad = check_layout(d)
    assert not bad, bad
    assert {r["what"]: r["compiled"] for r in result["rows"]}["all-to-all over a (bytes)"] == 2048


def test_collectives_name_real_device_groups():
    """A collective's axes come in mesh order (``heads:b+a`` all-reduces over the group a+b, as XLA names it),
    and axes of size 1 are left out: a group of one device exchanges nothing (XLA emits nothing)."""
    g = training_step(Drawn("gpt", "a:1", "").graph(), "sgd", "fp32")
    for mesh, rules in (("a:2,b:4", "heads:b+a,d_ff:b+a"), ("a:2,b:1,c:4", "heads:b,batch:c+b,d_ff:a+b")):
        lay = Layout.from_rules(mesh, rules)
        names = lay.mesh.names
        for cost in OpRules(g, lay.mesh, reduce_scatter=False).step_costs(lay):
            for c in cost.comms:
                assert c.axes and all(lay.mesh.axis_size(a) > 1 for a in c.axes), c
                assert list(c.axes) == sorted(c.axes, key=names.index), c


RESHARDS = (  # mesh, tensor [8, 16, 32] stored as src, wanted as dst: XLA's collectives (kind, axes, bytes)
    ("a:8", {"d0": ("a",)}, {"d1": ("a",)}, [("all-to-all", ("a",), 2048)]),
    ("a:2,c:4", {"d0": ("a",)}, {"d1": ("c",)}, [("all-gather", ("a",), 16384)]),
    ("a:2,c:4", {"d0": ("a",)}, {"d0": ("a", "c")}, []),
    ("a:2,c:4", {"d0": ("a",)}, {"d0": ("c",)}, [("collective-permute", ("a", "c"), 4096)]),
    ("a:2,c:4", {"d0": ("a",)}, {"d0": ("c",), "d1": ("a",)}, [("collective-permute", ("a", "c"), 2048)]),
    ("a:2,b:2,c:2", {"d0": ("a",), "d1": ("b",)}, {"d0": ("c",), "d1": ("a",)},
     [("collective-permute", ("a", "b", "c"), 4096)]),
    ("a:2,b:2,c:2", {"d1": ("b",)}, {"d0": ("a",), "d1": ("c",)}, [("collective-permute", ("b", "c"), 4096)]),
)
"""Reshards measured on XLA:CPU, each the rules' prediction exactly: an axis moving between dims is one
all-to-all, an axis dropped one all-gather, an axis added a free slice, and blocks that only change devices
(each new block inside an old one, not the device's own) one collective-permute. Reshards XLA does otherwise
are listed in docs/cost-model.md ("The property check")."""


@pytest.mark.parametrize("mesh, src, dst, want", RESHARDS, ids=[f"{s}->{d}@{m}" for m, s, d, _ in RESHARDS])
def test_reshards_are_the_collectives_xla_compiles(mesh, src, dst, want):
    import jax
    import numpy as np
    from jax.sharding import NamedSharding

    from layoutsearch.backend.hlo import summarize
    from layoutsearch.backend.sharding import FAST_COMPILE, jax_mesh
    from layoutsearch.costmodel.ops import reshard
    from layoutsearch.ir.dims import Dim
    from layoutsearch.ir.tensor import Tensor
    from layoutsearch.mesh import Mesh

    m = Mesh.parse(mesh)
    t = Tensor("x", (Dim("d0", 8), Dim("d1", 16), Dim("d2", 32)))
    lay = lambda dl: Layout.from_rules(m, list(dl.items())).partition_spec(t)  # noqa: E731
    jm = jax_mesh(m)
    f = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, NamedSharding(jm, lay(dst))) + 1,
                in_shardings=NamedSharding(jm, lay(src)), out_shardings=NamedSharding(jm, lay(dst)))
    compiled = f.lower(jax.ShapeDtypeStruct((8, 16, 32), np.float32)).compile(compiler_options=FAST_COMPILE)
    got = [(c.kind, c.axes, c.total_bytes) for c in summarize(compiled, jm).collectives]
    assert got == want
    assert [(c.kind, c.axes, c.bytes) for c in reshard(t, src, dst, m, "")] == want
