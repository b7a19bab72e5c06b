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


class _DonatingStep:
    """``step(feeds)`` over a jitted ``f(donated, kept)``: the parameters and
    optimizer state the step replaces are donated (their buffers may hold the
    new values, as in a training loop); ``lower(feeds)`` lowers it."""

    def __init__(self, jitted: Any, donated: Sequence[str]) -> None:
        self.jitted = jitted
        self.donated = frozenset(donated)

    def _split(self, fed: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        return ({k: v for k, v in fed.items() if k in self.donated},
                {k: v for k, v in fed.items() if k not in self.donated})

    def __call__(self, fed: Mapping[str, Any]) -> Arrays:
        return self.jitted(*self._split(fed))

    def lower(self, fed: Mapping[str, Any]) -> Any:
        return self.jitted.lower(*self._split(fed))


def sharded_step(graph: Graph, layout: Layout, outputs: Sequence[str] | None = None,
                 devices: Sequence[jax.Device] | None = None, *,
                 donate: bool = False) -> tuple[Callable[[Mapping[str, jax.Array]], Arrays], dict[str, NamedSharding]]:
    """A jitted ``step(feeds) -> {output: array}`` running ``graph`` under ``layout``.

    Returns the function (it has ``.lower(feeds)``) and the shardings of every
    tensor (use them to ``jax.device_put`` the feeds). ``donate``: the fed
    tensors that the step's outputs update (``Tensor.updates``: parameters and
    optimizer state) are donated, so XLA may write the new values into their
    buffers (what the memory model assumes); donated arrays are invalid after
    the call."""
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

    out_sh = {k: sh[k] for k in outs}
    if not donate:
        return jax.jit(step, in_shardings=({k: sh[k] for k in feeds},), out_shardings=out_sh), sh
    updated = {graph.tensors[k].updates for k in outs} & set(feeds)
    donated = [k for k in feeds if k in updated]
    kept = [k for k in feeds if k not in updated]
    jitted = jax.jit(lambda d, k: step({**d, **k}), in_shardings=({k: sh[k] for k in donated}, {k: sh[k] for k in kept}),
                     out_shardings=out_sh, donate_argnums=(0,))
    return _DonatingStep(jitted, donated), sh


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


BF16_SHARD_MAP_ON_CPU: dict[str, Any] = {"xla_disable_hlo_passes": "all-reduce-promotion"}
"""Compiler options for a ``shard_map`` program on CPU devices whose bfloat16 inputs are replicated over a mesh
axis (the pipeline executor's parameters under the ``bf16`` policy): the transpose of such an input sums its
cotangent with an all-reduce whose reduction JAX ends in a ``copy`` (``psum_invariant``), and XLA:CPU's
``AllReducePromotion``, which runs bfloat16 all-reduces in float32, aborts the process on it ("Invalid binary
instruction opcode copy", JAX 0.10.2 and 0.11.2). Without the pass those all-reduces run in bfloat16."""


def merge_compiler_options(*options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Compiler options combined, later ones winning, except ``xla_disable_hlo_passes``, whose passes add up."""
    out: dict[str, Any] = {}
    for opts in options:
        for k, v in (opts or {}).items():
            out[k] = f"{out[k]},{v}" if k == "xla_disable_hlo_passes" and k in out else v
    return out


FAST_COMPILE: dict[str, Any] = {"xla_backend_optimization_level": 0}
"""Compiler options for programs compiled to be inspected (tests, validation):
LLVM at -O0 compiles 2-3x faster and changes nothing XLA's HLO passes decide
(partitioning, collectives, FLOP counts, buffer assignment), only the speed of
the generated code. Combine with :data:`UNFUSED` as ``{**UNFUSED, **FAST_COMPILE}``."""


def compile_step(graph: Graph, layout: Layout, feeds: Mapping[str, Any],
                 outputs: Sequence[str] | None = None,
                 compiler_options: Mapping[str, Any] | None = None, *,
                 donate: bool = False) -> tuple[Any, jax.sharding.Mesh]:
    """The compiled XLA executable of one step under ``layout`` and its JAX mesh.

    ``feeds`` gives shapes and dtypes only (arrays or ``jax.ShapeDtypeStruct``);
    ``compiler_options`` are XLA debug options for this compilation, e.g.
    :data:`UNFUSED`; ``donate``: see :func:`sharded_step`. The executable is
    callable on feeds placed with the shardings of :func:`sharded_step` (with
    ``donate``, as ``(donated, kept)`` dicts: use the step itself to run)."""
    step, sh = sharded_step(graph, layout, outputs, donate=donate)
    args = {k: jax.ShapeDtypeStruct(np.shape(feeds[k]), feeds[k].dtype, sharding=sh[k]) for k in feed_names(graph)}
    compiled = step.lower(args).compile(compiler_options=dict(compiler_options) if compiler_options else None)
    return compiled, next(iter(sh.values())).mesh
