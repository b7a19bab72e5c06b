"""Run an IR graph under a layout on a device mesh.

Every tensor the graph holds gets the ``NamedSharding`` its layout gives:
fed tensors through ``in_shardings``, produced tensors through
``with_sharding_constraint`` (the mesh uses ``AxisType.Auto``, so these steer
XLA's partitioner rather than assert). XLA therefore compiles the layout the
cost model is asked about, not one of its own choosing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding

from layoutsearch.backend.program import Arrays, run_graph
from layoutsearch.errors import LayoutError
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh


def jax_mesh(mesh: Mesh, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """A ``jax.sharding.Mesh`` (Auto axes) with the shape and axis names of ``mesh``."""
    devs = list(devices if devices is not None else jax.devices())
    if len(devs) < mesh.size:
        raise LayoutError(f"mesh {mesh} needs {mesh.size} devices, JAX has {len(devs)} "
                          f"(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={mesh.size})")
    arr = np.array(devs[: mesh.size], dtype=object).reshape([s for _, s in mesh.axes])
    return jax.sharding.Mesh(arr, mesh.names, axis_types=(AxisType.Auto,) * len(mesh.axes))


def named_shardings(graph: Graph, layout: Layout, mesh: jax.sharding.Mesh) -> dict[str, NamedSharding]:
    """The NamedSharding of every tensor of ``graph`` under ``layout``."""
    return {name: NamedSharding(mesh, layout.partition_spec(t)) for name, t in graph.tensors.items()}


def step_outputs(graph: Graph) -> list[str]:
    """What a step returns: the loss and every tensor that updates a parameter or state."""
    out = [graph.loss] if graph.loss else []
    return out + [t.name for t in graph.tensors.values() if t.updates is not None]


def feed_names(graph: Graph) -> list[str]:
    return [t.name for t in graph.fed]


def sharded_step(graph: Graph, layout: Layout, outputs: Sequence[str] | None = None,
                 devices: Sequence[jax.Device] | None = None) -> tuple[Callable[[Mapping[str, jax.Array]], Arrays], dict[str, NamedSharding]]:
    """A jitted ``step(feeds) -> {output: array}`` running ``graph`` under ``layout``.

    Returns the function and the shardings of every tensor (use them to
    ``jax.device_put`` the feeds)."""
    layout.check(graph)
    mesh = jax_mesh(layout.mesh, devices)
    sh = named_shardings(graph, layout, mesh)
    outs = list(outputs) if outputs is not None else step_outputs(graph)
    feeds = feed_names(graph)

    def constrain(name: str, x: jax.Array) -> jax.Array:
        return jax.lax.with_sharding_constraint(x, sh[name])

    def step(fed: Mapping[str, jax.Array]) -> Arrays:
        env = run_graph(graph, fed, constrain)
        return {k: env[k] for k in outs}

    jitted = jax.jit(step, in_shardings=({k: sh[k] for k in feeds},), out_shardings={k: sh[k] for k in outs})
    return jitted, sh


def run_sharded(graph: Graph, layout: Layout, feeds: Mapping[str, Any],
                outputs: Sequence[str] | None = None) -> Arrays:
    """Run ``graph`` once under ``layout``; returns the outputs (default :func:`step_outputs`)."""
    step, sh = sharded_step(graph, layout, outputs)
    fed = {k: jax.device_put(feeds[k], sh[k]) for k in feed_names(graph)}
    return step(fed)


UNFUSED: dict[str, Any] = {"xla_disable_hlo_passes": "fusion"}
"""Compiler options for a program whose FLOPs the cost model predicts op by op:
XLA's instruction fusion recomputes cheap elementwise producers inside every
consumer fusion (a code-generation choice trading FLOPs for memory traffic, not
a layout effect); without it the compiled program counts each op once
(partitioning, collectives and CSE are unchanged)."""


def compile_step(graph: Graph, layout: Layout, feeds: Mapping[str, Any],
                 outputs: Sequence[str] | None = None,
                 compiler_options: Mapping[str, Any] | None = None) -> tuple[Any, jax.sharding.Mesh]:
    """The compiled XLA executable of one step under ``layout`` and its JAX mesh.

    ``feeds`` gives shapes and dtypes only (arrays or ``jax.ShapeDtypeStruct``);
    ``compiler_options`` are XLA debug options for this compilation, e.g.
    :data:`UNFUSED`. The executable is callable on feeds placed with the
    shardings of :func:`sharded_step`."""
    step, sh = sharded_step(graph, layout, outputs)
    args = {k: jax.ShapeDtypeStruct(np.shape(feeds[k]), feeds[k].dtype, sharding=sh[k]) for k in feed_names(graph)}
    compiled = step.lower(args).compile(compiler_options=dict(compiler_options) if compiler_options else None)
    return compiled, next(iter(sh.values())).mesh
