"""A layout in the terms JAX and Flax programs use: every tensor's ``PartitionSpec`` entries
(:func:`partition_specs`), Flax Linen ``logical_axis_rules`` (:func:`flax_logical_axis_rules`), the rules
Flax NNX applies to ``nnx.Variable`` ``out_sharding`` metadata (:func:`nnx_logical_axis_rules`), and a
paste-able Python snippet building the mesh and one ``NamedSharding`` per tensor (:func:`python_snippet`).

Rule precedence is the same in layoutsearch and in Flax Linen (rules in order; a rule applies to a
tensor when its dim is still unassigned and none of its mesh axes is used yet; a rule with no axes,
``d_model:-``, claims the dim unsplit), so Linen rules are the layout's rules unchanged.

Flax NNX is different (flax 0.12.8, ``flax/nnx/spmd.py: get_var_pspec`` and
``flax/core/spmd.py: from_sharding_rules``): it turns the rules into a dict and looks each logical name
of a Variable's ``out_sharding`` up in it, with no precedence, no fallback (of two rules for a name the
last wins) and no check that a mesh axis is used once; a name without a rule is kept as it is, i.e. taken
as a mesh axis name. The NNX export therefore gives every dim of the graph exactly one value, the one it
has in every parameter, and refuses a layout in which a dim needs two values in two parameters.
"""

from __future__ import annotations

from layoutsearch.errors import LayoutError
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Axes, Layout, SpecEntry

# -- PartitionSpecs and Flax Linen ------------------------------------------------------------------------------------

def partition_specs(layout: Layout, graph: Graph) -> dict[str, tuple[SpecEntry, ...]]:
    """Tensor name -> PartitionSpec entries (None, an axis, or a tuple of axes per dim).

    Checks the layout against ``graph`` first (LayoutError if it does not fit)."""
    layout.check(graph)
    return {t.name: layout.spec(t) for t in graph.tensors.values()}


def logical_rules(layout: Layout) -> tuple[tuple[str, Axes], ...]:
    """The layout's rules, which apply exactly as Flax applies logical axis rules."""
    if layout.tensors:
        names = ", ".join(repr(n) for n, _ in layout.tensors)
        raise LayoutError(f"layout has per-tensor entries ({names}), which logical axis rules cannot express; "
                          "export it with partition_specs or python_snippet instead")
    return layout.rules


def _entry(axes: Axes) -> str | tuple[str, ...] | None:
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def flax_logical_axis_rules(layout: Layout) -> list[tuple[str, str | tuple[str, ...] | None]]:
    """The global rules as Flax ``logical_axis_rules``: ``[("batch", "data"), ("embed", ("data", "fsdp")), ...]``.

    Logical axis names are the graph's dim names. Raises LayoutError for a
    layout with per-tensor entries (rules cannot express them)."""
    return [(dim, _entry(axes)) for dim, axes in logical_rules(layout)]


def without_stage_rules(layout: Layout, stage_axis: str | None) -> Layout:
    """The layout inside a pipeline stage: rules naming the stage axis dropped (as the pipeline cost model does)."""
    if stage_axis is None:
        return layout
    layout.mesh.axis_size(stage_axis)  # a clear error for an axis the mesh lacks
    return Layout(layout.mesh, tuple((d, a) for d, a in layout.rules if stage_axis not in a), layout.tensors)


# -- Flax NNX ---------------------------------------------------------------------------------------------------------

def nnx_values(layout: Layout, graph: Graph) -> tuple[dict[str, SpecEntry], dict[str, list[str]]]:
    """Dim -> its one NNX value, and dim -> the non-parameter tensors in which the layout gives it another."""
    specs = partition_specs(layout, graph)
    order = [d for d, _ in layout.rules if d in graph.dims]
    order += [d for d in graph.dims if d not in order]
    order = list(dict.fromkeys(order))
    first_rule = {}
    for d, axes in layout.rules:
        first_rule.setdefault(d, _entry(axes))
    param_value: dict[str, tuple[SpecEntry, str]] = {}
    for t in graph.tensors.values():
        if t.role not in ("parameter", "optimizer_state"):
            continue
        for d, s in zip(t.dim_names, specs[t.name], strict=True):
            if d not in param_value:
                param_value[d] = (s, t.name)
            elif param_value[d][0] != s:
                other_spec, other = param_value[d]
                raise LayoutError(
                    f"Flax NNX gives a logical axis one mesh-axes value, but this layout splits dim {d!r} as "
                    f"{other_spec!r} in {other!r} and as {s!r} in {t.name!r}; export it as 'flax' (Linen rules, "
                    "which nn.logical_to_mesh_axes applies with precedence) or 'specs' instead")
    values: dict[str, SpecEntry] = {}
    for d in order:
        values[d] = param_value[d][0] if d in param_value else first_rule.get(d)
    differ: dict[str, list[str]] = {}
    for t in graph.tensors.values():
        for d, s in zip(t.dim_names, specs[t.name], strict=True):
            if s != values[d]:
                differ.setdefault(d, []).append(t.name)
    return values, differ


def nnx_logical_axis_rules(layout: Layout, graph: Graph) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """The rules Flax NNX needs: ``(("batch", "data"), ("d_model", None), ...)``, one pair per dim of ``graph``.

    Use with ``nnx.logical_axis_rules(rules)`` (or a Variable's ``sharding_rules`` metadata) and Variables
    whose ``out_sharding`` holds the graph's dim names; ``nnx.get_partition_spec`` then gives every
    parameter the layout's PartitionSpec. NNX looks names up without precedence, so each dim gets the
    one value it has in every parameter (LayoutError if two parameters need two values); dims in no
    parameter get their first rule's axes. Activations in which the layout splits a dim otherwise are
    reported by :func:`~layoutsearch.export.export`'s ``nnx`` text; constrain them with the ``specs`` export."""
    values, _ = nnx_values(layout, graph)
    return tuple(values.items())


# -- Python snippet ---------------------------------------------------------------------------------------------------

def _spec_source(spec: tuple[SpecEntry, ...]) -> str:
    parts = []
    for s in spec:
        if s is None:
            parts.append("None")
        elif isinstance(s, str):
            parts.append(repr(s))
        else:
            parts.append("(" + ", ".join(repr(a) for a in s) + ")")
    return "P(" + ", ".join(parts) + ")"


def _mesh_source(layout: Layout) -> list[str]:
    mesh = layout.mesh
    return [
        "# Auto axes: XLA propagates shardings through every op (jax.make_mesh's default, Explicit axes,",
        "# rejects e.g. a matmul whose contracted dim is split).",
        f"mesh = jax.make_mesh({tuple(s for _, s in mesh.axes)!r}, {tuple(mesh.names)!r},",
        f"                     axis_types=(jax.sharding.AxisType.Auto,) * {len(mesh.axes)})",
    ]


def python_snippet(layout: Layout, graph: Graph) -> str:
    """Paste-able Python: the mesh (Auto axes), ``partition_specs`` (one ``PartitionSpec`` per tensor),
    ``shardings`` (``NamedSharding`` per tensor) and, for a rules-only layout, ``logical_axis_rules``."""
    specs = partition_specs(layout, graph)
    mesh = layout.mesh
    rules = layout.describe() or "replicated"
    lines = [
        f"# layoutsearch: model {graph.name!r} on mesh {mesh} (rules: {rules})",
        "import jax",
        "from jax.sharding import NamedSharding",
        "from jax.sharding import PartitionSpec as P",
        "",
        *_mesh_source(layout),
        "partition_specs = {",
        *(f"    {name!r}: {_spec_source(spec)}," for name, spec in specs.items()),
        "}",
        "shardings = {name: NamedSharding(mesh, spec) for name, spec in partition_specs.items()}",
    ]
    if not layout.tensors:
        lines.append(f"logical_axis_rules = {flax_logical_axis_rules(layout)!r}  # Flax nn.logical_axis_rules")
    return "\n".join(lines) + "\n"
