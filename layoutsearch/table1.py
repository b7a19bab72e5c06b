"""Table 1 of the Mesh-TensorFlow paper, predicted and compiled side by side.

Shazeer et al. 2018, "Mesh-TensorFlow: Deep Learning for Supercomputers",
Table 1: the two fully-connected layers of ``mtf-ffn`` (``h = relu(x·w)``,
``y = h·v``) on ``n = r·c`` processors, four layouts:

==============  =======================  =====================================
layout          rules                    communication per device per step
==============  =======================  =====================================
replicated      (none)                   0
data-parallel   batch:rows+cols          all-reduce 2·io·h·4 (+4: the loss)
model-parallel  hidden:rows+cols         all-reduce b·io·4
2-D             batch:rows,hidden:cols   all-reduce b/r·io·4 over cols
                                         + all-reduce 2·io·h/c·4 (+4) over rows
==============  =======================  =====================================

Bytes are the collective payloads of this project's conventions
(:mod:`layoutsearch.costmodel.collectives`: an all-reduce's operand bytes per
device), float32, for the whole training step with SGD (the paper's
setting): data parallelism all-reduces the gradients of ``w[io, h]`` and
``v[h, io]``; splitting ``hidden`` all-reduces the partial sums of ``y``
(forward; the backward needs none since ``x`` takes no gradient); the 2-D
layout does both on smaller pieces. Matmul FLOPs per device are
``10·b·io·h / n`` in every split layout (forward ``x·w`` and ``h·v``: 4·b·io·h;
backward ``dv``, ``dh`` and ``dw``: 6·b·io·h; ``dx`` is not needed),
elementwise ops and SGD add a little.

:func:`table1` computes the formulas, the cost model's predictions
(:func:`~layoutsearch.costmodel.estimate` on the ``cpu-sim`` preset, which
like XLA on CPU all-reduces instead of reduce-scattering) and the numbers
read from the program XLA compiles for the same layout
(:func:`layoutsearch.backend.hlo.summarize`): collective payloads by kind and
mesh axes, FLOPs per device (``cost_analysis``) and memory per device. The
compiled program needs ``r·c`` JAX devices: on CPU, :func:`~layoutsearch.devices.jax_devices` asks
for simulated ones (``XLA_FLAGS=--xla_force_host_platform_device_count``),
which only works before JAX's backend starts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from layoutsearch.costmodel.report import estimate
from layoutsearch.errors import MeshError
from layoutsearch.ir.training import training_graph
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh
from layoutsearch.validate import compiled_costs

DEFAULT_SIZES = {"batch": 64, "io": 64, "hidden": 256}
"""Default sizes: small enough to compile in a second on CPU, divisible by 8."""

DEFAULT_MESH = "rows:2,cols:4"


@dataclass(frozen=True)
class _Row:
    name: str
    rules: Callable[[str, str], str]
    comm: str
    comm_bytes: Callable[[int, int, int, int, int], int]
    flops: str
    split: Callable[[int, int], int]  # processors the matmul work is divided over


_ROWS = (
    _Row("replicated", lambda r, c: "", "0", lambda b, io, h, r, c: 0, "10·b·io·h", lambda r, c: 1),
    _Row("data-parallel", lambda r, c: f"batch:{r}+{c}", "2·io·h·4 + 4",
         lambda b, io, h, r, c: 2 * io * h * 4 + 4, "10·b·io·h/n", lambda r, c: r * c),
    _Row("model-parallel", lambda r, c: f"hidden:{r}+{c}", "b·io·4",
         lambda b, io, h, r, c: b * io * 4, "10·b·io·h/n", lambda r, c: r * c),
    _Row("2-D", lambda r, c: f"batch:{r},hidden:{c}", "b/r·io·4 (cols) + 2·io·h/c·4 + 4 (rows)",
         lambda b, io, h, r, c: b // r * io * 4 + 2 * io * h // c * 4 + 4, "10·b·io·h/n", lambda r, c: r * c),
)


def table1(batch: int = DEFAULT_SIZES["batch"], io: int = DEFAULT_SIZES["io"], hidden: int = DEFAULT_SIZES["hidden"],
           mesh: Mesh | str = DEFAULT_MESH, compiled: bool = True) -> dict[str, Any]:
    """Table 1 for ``mtf-ffn`` at the given sizes on a 2-axis ``mesh`` (rows, cols):
    per layout, the symbolic formulas, their values, the cost model's predictions
    and (``compiled``) what XLA compiles. JSON-ready."""
    from layoutsearch import zoo

    m = Mesh.of(mesh)
    if len(m.axes) != 2:
        raise MeshError(f"table1 needs a 2-D mesh 'rows:R,cols:C' (batch on rows, hidden on cols), got {m}")
    (ra, r), (ca, c) = m.axes
    graph = training_graph(zoo.build("mtf-ffn", batch=batch, io=io, hidden=hidden, dtype="float32"), "sgd")
    rows = []
    for row in _ROWS:
        layout = Layout.from_rules(m, row.rules(ra, ca)).check(graph)
        rep = estimate(graph, layout, "cpu-sim")
        pred: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
        for coll in rep.collectives:
            pred[(coll.kind, coll.axes)] += coll.bytes
        entry: dict[str, Any] = {
            "layout": row.name, "rules": layout.describe(),
            "comm_formula": row.comm, "comm_formula_bytes": row.comm_bytes(batch, io, hidden, r, c),
            "flops_formula": row.flops + " + elementwise",
            "matmul_flops_formula": 10 * batch * io * hidden // row.split(r, c),
            "predicted": {
                "comm_bytes": sum(pred.values()),
                "collectives": [{"kind": k, "axes": list(a), "bytes": b} for (k, a), b in sorted(pred.items(), key=str)],
                "flops": rep.flops_per_device, "memory_bytes": rep.memory_bytes, "step_s": rep.step_s,
            },
        }
        if compiled:
            entry["compiled"] = compiled_costs(graph, layout)
            entry["comm_match"] = entry["compiled"]["collectives"] == entry["predicted"]["collectives"]
        rows.append(entry)
    return {"model": "mtf-ffn", "sizes": {"batch": batch, "io": io, "hidden": hidden}, "mesh": str(m),
            "r": r, "c": c, "n": m.size, "dtype": "float32", "optimizer": "sgd", "hardware": "cpu-sim",
            "rows": rows}


__all__ = ["DEFAULT_MESH", "DEFAULT_SIZES", "table1"]
