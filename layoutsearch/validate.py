"""Predicted against compiled (and, on an accelerator, measured) for one model and layout.

:func:`compiled_costs` reads what XLA compiles for a layout's training step:
collective payloads by kind and mesh axes and FLOPs per device from the
program compiled without fusion (XLA's fusion recomputes cheap producers in
every consumer, trading FLOPs for memory traffic; partitioning and
collectives are the same), memory per device (arguments + outputs +
temporaries - aliased) from the default program with the updated parameters
and optimizer state donated, as a training loop runs it.

:func:`validate` puts the cost model's predictions beside them. The collective
and memory predictions are made for the backend that compiled the program
(on CPU: all-reduce + slice instead of reduce-scatter, one combined gradient
all-reduce: see :class:`~layoutsearch.mesh.Hardware`); times for the
hardware asked for. On a GPU or TPU it also times the step (median of
``steps`` runs after one warm-up); on CPU it does not (simulated devices share
the host's cores: their wall time says nothing about the layout).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from layoutsearch.costmodel.report import estimate
from layoutsearch.costmodel.reshape import reshape_layout
from layoutsearch.costmodel.step import training_step
from layoutsearch.devices import jax_devices
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.ops import Reshape
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.layout import Layout
from layoutsearch.mesh import BACKEND_BEHAVIOUR, Hardware
from layoutsearch.mesh import hardware as _hardware

COMPILED_ATTENTION = "standard"
"""The attention of the program :func:`validate` compiles: the training graph's own ops, whose backward pass
reads the scores the forward pass kept (``auto`` would price a flash kernel on GPU/TPU presets)."""


def compiled_costs(graph: Graph, layout: Layout, *, memory: bool = True) -> dict[str, Any]:
    """Collectives (by kind and axes), FLOPs and memory per device of the compiled training step
    (``memory=False``: no memory, and one compilation instead of two). Both programs are compiled with
    LLVM at -O0 (:data:`~layoutsearch.backend.sharding.FAST_COMPILE`: the same HLO, a faster compile)."""
    from layoutsearch.backend.hlo import summarize
    from layoutsearch.backend.program import jax_dtype
    from layoutsearch.backend.sharding import FAST_COMPILE, UNFUSED, compile_step, feed_names

    jax_devices(layout.mesh.size)
    import jax

    feeds = {k: jax.ShapeDtypeStruct(tuple(d.size for d in graph.tensors[k].dims), jax_dtype(graph.tensors[k]))
             for k in feed_names(graph)}
    program, mesh = compile_step(graph, layout, feeds, compiler_options={**UNFUSED, **FAST_COMPILE})
    s = summarize(program, mesh)
    by: dict[tuple[str, tuple[str, ...] | None], int] = defaultdict(int)
    for (kind, axes), nbytes in s.bytes_by().items():
        by[(kind, tuple(axes) if axes is not None else None)] += nbytes
    total = None
    if memory:
        fused, mesh = compile_step(graph, layout, feeds, compiler_options=FAST_COMPILE, donate=True)
        total = summarize(fused, mesh).memory.get("total_bytes")
    return {"collectives": [{"kind": k, "axes": list(a) if a is not None else None, "bytes": b}
                            for (k, a), b in sorted(by.items(), key=str)],
            "comm_bytes": sum(by.values()), "flops": s.flops, "memory_bytes": total,
            "platform": next(iter(mesh.devices.flat)).platform}


GPU_FLOPS_NOTE = ("not compared: XLA:GPU's cost analysis leaves out the matmuls it hands to cuBLAS (on an H200, "
                  "0.19 of the predicted FLOPs, bench/RESULTS_device.md)")
"""Why ``validate`` gives no FLOP ratio on a GPU."""

CPU_BF16_NOTE = ("XLA:CPU emulates bf16 (converts around every bf16 op), which the compiled FLOPs and memory "
                 "include (tests/test_xla_mixed.py lists the ratios); --precision fp32 compares like with like")
"""Why ``validate`` on CPU with a bf16 precision policy shows FLOPs and memory below the compiled program's."""


def _backend_hardware(hw: Hardware, platform: str) -> Hardware:
    """``hw`` with the compiler behaviour of the backend that compiled the program."""
    if platform == "cpu":
        cpu = _hardware("cpu-sim")
        return hw.replace(**{k: getattr(cpu, k) for k in BACKEND_BEHAVIOUR})
    return hw


def _measure(graph: Graph, layout: Layout, steps: int) -> float:
    import jax

    from layoutsearch.backend.program import init_params, random_inputs
    from layoutsearch.backend.sharding import feed_names, sharded_step

    step, sh = sharded_step(graph, layout)
    feeds = {**init_params(graph), **random_inputs(graph)}
    fed = {k: jax.device_put(feeds[k], sh[k]) for k in feed_names(graph)}
    jax.block_until_ready(step(fed))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(step(fed))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def validate(graph: Graph, layout: Layout, hardware: Hardware | str = "cpu-sim", *, optimizer: str = "adam",
             precision: Precision | str = DEFAULT_PRECISION, steps: int = 10, memory: bool = True) -> dict[str, Any]:
    """Predicted vs compiled collectives, FLOPs and memory per device (and measured
    vs predicted step time on an accelerator) for ``graph``'s training step under ``layout``
    with the ``precision`` policy (``memory=False``: no memory row, one compilation)."""
    g = training_step(graph, optimizer, precision)
    layout.check(g)
    hw = _hardware(hardware)
    compiled = compiled_costs(g, layout, memory=memory)
    platform = compiled["platform"]
    rep = estimate(g, layout, _backend_hardware(hw, platform), attention=COMPILED_ATTENTION)
    pred: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    for c in rep.collectives:
        pred[(c.kind, c.axes)] += c.bytes
    comp = {(c["kind"], tuple(c["axes"]) if c["axes"] is not None else None): c["bytes"]
            for c in compiled["collectives"]}
    rows = [{"what": f"{kind} over {'+'.join(axes) if axes else '?'} (bytes)", "predicted": pred.get((kind, axes), 0),
             "compiled": comp.get((kind, axes), 0)} for kind, axes in sorted(set(pred) | set(comp), key=str)]
    flops = {"what": "FLOPs per device", "predicted": rep.flops_per_device, "compiled": compiled["flops"]}
    rows.append(flops)
    if memory:
        rows.append({"what": "memory per device (bytes)", "predicted": rep.memory_bytes,
                     "compiled": compiled["memory_bytes"]})
    for r in rows:
        p, c = r["predicted"], r["compiled"]
        r["ratio"] = (p / c) if c else (1.0 if not p else None)
    if platform == "gpu":
        flops.update(ratio=None, note=GPU_FLOPS_NOTE)
    elif platform == "cpu" and Precision.of(precision).name != "fp32":
        flops["note"] = CPU_BF16_NOTE
    timed = estimate(g, layout, hw, attention=COMPILED_ATTENTION)
    out: dict[str, Any] = {"model": graph.name, "mesh": str(layout.mesh), "layout": layout.describe(),
                           "precision": timed.precision, "hardware": hw.name, "platform": platform, "rows": rows,
                           "predicted_step_s": timed.step_s}
    if platform != "cpu":
        out["measured_step_s"] = _measure(g, layout, steps)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The property check: random layouts of every zoo model against the compiled program

PROPERTY_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "mtf-ffn": ("mtf-ffn", {"batch": 16, "io": 32, "hidden": 64}),
    "mlp": ("mlp", {"batch": 16, "features": 32, "hidden": 64, "classes": 16, "layers": 3}),
    "mtf-transformer": ("mtf-transformer", {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8,
                                            "d_kv": 8, "d_ff": 64, "layers": 1}),
    "gpt": ("gpt", {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "layers": 1}),
    "gpt-llama": ("gpt", {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "kv_heads": 2, "d_kv": 8,
                          "d_ff": 64, "layers": 1, "mlp": "swiglu", "norm": "rmsnorm", "position": "rotary",
                          "bias": 0, "tie_embeddings": 0}),
    "gpt-palm": ("gpt", {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "layers": 1,
                         "parallel_block": 1}),
    "gpt-mqa": ("gpt", {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 4, "kv_heads": 1, "layers": 1,
                        "mlp": "relu", "position": "none"}),
    "moe": ("moe", {"batch": 8, "seq": 16, "d_model": 32, "d_ff": 64, "experts": 8, "capacity": 4, "layers": 1}),
}
"""The models :func:`draw_layouts` lays out: every zoo model (and the ``gpt`` architecture options) at small
sizes whose dims are powers of two, so that most splits over 2, 4 or 8 devices divide, and XLA:CPU compiles a
training step in about a second."""

PROPERTY_MESHES: dict[int, tuple[tuple[int, ...], ...]] = {
    1: ((8,), (4,), (2,)),
    2: ((2, 4), (4, 2), (2, 2), (8, 1)),
    3: ((2, 2, 2), (2, 1, 4), (1, 2, 2)),
}
"""Mesh shapes by number of axes (at most 8 devices; a few with an axis of size 1)."""

PROPERTY_AXES = ("a", "b", "c")
"""Axis names of the drawn meshes (major first): names mean nothing to the cost model or to XLA."""

BYTES_RTOL = 0.02
"""Collective payload bytes per (kind, mesh axes) agree within 2% of the compiled program: the tolerance of the
hand-picked agreement cases (``tests/test_xla_agreement.py``), where every case is exact."""

FLOPS_RTOL = 0.02
"""FLOPs per device agree within 2% of the program compiled without fusion (same tolerance and reason)."""


@dataclass(frozen=True)
class Drawn:
    """One drawn layout: a :data:`PROPERTY_MODELS` name, a mesh, global rules and an optimizer."""

    model: str
    mesh: str
    rules: str
    optimizer: str = "sgd"

    def graph(self) -> Graph:
        name, sizes = PROPERTY_MODELS[self.model]
        return _zoo_graph(name, tuple(sorted(sizes.items())))

    def layout(self) -> Layout:
        return Layout.from_rules(self.mesh, self.rules)

    def command(self) -> str:
        """The ``layoutsearch validate`` command line that shows this comparison."""
        name, sizes = PROPERTY_MODELS[self.model]
        sets = " ".join(f"--set {k}={v}" for k, v in sizes.items())
        return (f"layoutsearch validate {name} {sets} --mesh {self.mesh} --layout '{self.rules}' "
                f"--precision fp32 --optimizer {self.optimizer}")

    def __str__(self) -> str:
        return f"{self.model} mesh={self.mesh} rules={self.rules or '(none)'} {self.optimizer}"


@functools.cache
def _zoo_graph(name: str, sizes: tuple[tuple[str, Any], ...]) -> Graph:
    from layoutsearch import zoo

    return zoo.build(name, **dict(sizes))


def _draw_rules(rng: random.Random, dims: dict[str, int], axes: list[tuple[str, int]], disjoint: bool) -> str:
    rules: list[str] = []
    names = [a for a, _ in axes]
    free = list(names)
    for dim in rng.sample(sorted(dims), len(dims)):
        r = rng.random()
        if r < 0.45:
            continue  # no rule: unsplit
        if r < 0.5:
            rules.append(f"{dim}:-")
            continue
        pool = free if disjoint else names
        if not pool:
            continue
        k = 2 if len(pool) > 1 and rng.random() < 0.25 else 1
        chosen = rng.sample(pool, k)
        rules.append(f"{dim}:{'+'.join(chosen)}")
        if disjoint:
            free = [a for a in free if a not in chosen]
        elif rng.random() < 0.15:  # a fallback rule over one axis
            rules.append(f"{dim}:{rng.choice(names)}")
    return ",".join(rules)


LAYOUT_KINDS = ("uniform", "free")
"""What :func:`draw_layouts` draws: ``uniform``: each mesh axis in at most one rule (no fallback rules: every
tensor splits each of its dims the same way), and no reshape that regroups a split dim
(:func:`nonuniform_splits` is empty: no tensor is resharded); ``free``: any axis in any number of rules,
fallback rules, so that Flax precedence splits a dim differently from tensor to tensor (FSDP-like layouts and
stranger ones)."""


def draw_layouts(n: int, seed: int = 0, models: Sequence[str] | None = None, kind: str = "free") -> list[Drawn]:
    """``n`` random valid layouts (every split divides its dim), drawn with ``seed``: the models in turn
    (:data:`PROPERTY_MODELS`, or ``models``), a mesh of 1 to 3 axes (:data:`PROPERTY_MESHES`), rules over the
    model's dims in a random order (each dim: no rule, unsplit, or one or two axes; ``kind``: see
    :data:`LAYOUT_KINDS`) and SGD or Adam."""
    from layoutsearch.errors import LayoutSearchError

    if kind not in LAYOUT_KINDS:
        raise ValueError(f"kind must be one of {LAYOUT_KINDS}, got {kind!r}")
    names = list(models or PROPERTY_MODELS)
    rng = random.Random(seed)
    out: list[Drawn] = []
    for i in range(n):
        model = names[i % len(names)]
        g = Drawn(model, "a:1", "").graph()
        for _ in range(200):
            shape = rng.choice(PROPERTY_MESHES[rng.randint(1, 3)])
            axes = list(zip(PROPERTY_AXES, shape, strict=False))
            mesh = ",".join(f"{a}:{s}" for a, s in axes)
            rules = _draw_rules(rng, dict(g.dims), axes, kind == "uniform")
            try:
                lay = Layout.from_rules(mesh, rules).check(g)
            except LayoutSearchError:
                continue
            if kind == "uniform" and nonuniform_splits(training_step(g, "sgd", "fp32"), lay):
                continue
            out.append(Drawn(model, mesh, rules, rng.choice(("sgd", "adam"))))
            break
    return out


@dataclass(frozen=True)
class Disagreement:
    """A row of :func:`validate` outside its tolerance for a drawn layout."""

    drawn: Drawn
    what: str
    predicted: float
    compiled: float
    xla_warnings: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.drawn}: {self.what}: predicted {self.predicted:.0f}, compiled {self.compiled:.0f}"


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """The lines written to file descriptor 2 inside the block (XLA's C++ warnings), kept from the terminal."""
    lines: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())


def check_layout(drawn: Drawn, *, bytes_rtol: float = BYTES_RTOL,
                 flops_rtol: float = FLOPS_RTOL) -> tuple[dict[str, Any], list[Disagreement]]:
    """:func:`validate` (float32, no memory row) of one drawn layout and its rows outside the tolerances: every
    collective (kind, mesh axes) within ``bytes_rtol`` of the compiled bytes, FLOPs within ``flops_rtol``. The
    disagreements carry XLA's warnings about the compilation (e.g. the SPMD partitioner's "involuntary full
    rematerialization")."""
    with _captured_stderr() as err:
        result = validate(drawn.graph(), drawn.layout(), "cpu-sim", optimizer=drawn.optimizer, precision="fp32",
                          memory=False)
    warned = tuple(dict.fromkeys(re.sub(r"^.*\] ", "", line)[:160] for line in err if "] [SPMD]" in line))
    bad = []
    for row in result["rows"]:
        p, c = row["predicted"], row["compiled"]
        rtol = flops_rtol if row["what"].startswith("FLOPs") else bytes_rtol
        if abs(p - c) > rtol * c:
            bad.append(Disagreement(drawn, row["what"], p, c, warned))
    return result, bad


def nonuniform_splits(graph: Graph, layout: Layout) -> list[str]:
    """Why ``layout`` does not split ``graph`` (a training graph) uniformly: each mesh axis that splits different
    dims in different tensors or op computation layouts, and each dim split over different axes in different
    places (axes of size 1 left out). With Flax rule precedence a rule applies only where its axes are still
    free, so a dim may fall to a fallback rule, or stay unsplit, in some tensors: tensors then move axes between
    dims (all-to-all), or split and gather a dim (all-gather); and each reshape whose output is not its input's
    split carried over (``d_kv`` split 4 ways into ``rope_out`` of size 2: gathered, or permuted). Empty when
    every dim has one split wherever it is present and every reshape carries it over."""
    dims_of: dict[str, set[str]] = defaultdict(set)
    splits: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    lays = [(t.dim_names, layout.dim_layout(t)) for t in graph.tensors.values()]
    lays += [(dims, layout.rules_layout(dims)) for dims in (op.iteration_dims(graph.tensors) for op in graph.ops)]
    for names, lay in lays:
        for d in names:
            axes = tuple(a for a in lay.get(d, ()) if layout.mesh.axis_size(a) > 1)
            splits[d].add(axes)
            for a in axes:
                dims_of[a].add(d)
    out = ([f"axis {a} splits {', '.join(sorted(ds))}" for a, ds in sorted(dims_of.items()) if len(ds) > 1]
           + [f"dim {d} split as {' / '.join(sorted('+'.join(x) or '-' for x in ways))}"
              for d, ways in sorted(splits.items()) if len(ways) > 1])
    real = lambda lay: {d: ax for d, a in lay.items() if (ax := tuple(x for x in a if layout.mesh.axis_size(x) > 1))}  # noqa: E731
    for op in graph.ops:  # a reshape that cannot carry its input's split over to its output reshards
        if isinstance(op, Reshape):
            src = real(layout.dim_layout(graph.tensors[op.inputs[0]]))
            produced, need = reshape_layout(op, src, graph, layout.mesh)
            if real(need) != src or real(produced) != real(layout.dim_layout(graph.tensors[op.output])):
                out.append(f"reshape {op.name} regroups a split dim")
    return out


DISAGREEMENT_CLASSES: dict[str, str] = {
    "xla-involuntary-remat": "XLA's SPMD partitioner cannot reshard a tensor between two layouts efficiently, warns "
                             "'Involuntary full rematerialization' and replicates it then slices",
    "xla-permute-reshard": "XLA reshards by reassigning shards between mesh axes of the same size (collective-"
                           "permute), alone or after an all-to-all, where the rules all-gather or all-to-all",
    "xla-unaligned-groups": "XLA runs a collective over device groups that are no set of mesh axes (an "
                            "intermediate layout of its resharding)",
    "xla-computation-layout": "XLA partitions some op's work otherwise than the rules' computation layout (FLOPs "
                              "per device differ), with other collectives",
    "xla-reshard-choice": "XLA reshards with the kinds of collectives the rules predict, but not the same ones: "
                          "it re-does a reshard the rules share between two ops (or shares one they repeat), "
                          "slices before an all-to-all, gathers a dim's whole axis group, so payloads differ",
    "uniform-layout": "a disagreement in a layout that splits every dim one way everywhere (no resharding "
                      "between tensors): not explained by XLA's resharding; a cost-model error",
}
"""Every class :func:`classify` gives, with what it means (``docs/cost-model.md``, "The property check")."""


def classify(drawn: Drawn, bad: Sequence[Disagreement]) -> str:
    """The class of a drawn layout's disagreements (:data:`DISAGREEMENT_CLASSES`), from the evidence, in order:
    a uniform layout (:func:`nonuniform_splits` empty: nothing of XLA's resharding explains it), XLA's warning,
    collective-permutes, groups that are no mesh axes, FLOPs, else XLA's choice of reshards."""
    from layoutsearch.costmodel.step import training_step

    g = training_step(drawn.graph(), drawn.optimizer, "fp32")
    if not nonuniform_splits(g, drawn.layout()):
        return "uniform-layout"
    if any("Involuntary full rematerialization" in w for x in bad for w in x.xla_warnings):
        return "xla-involuntary-remat"
    if any(x.what.startswith("collective-permute") and x.compiled > x.predicted for x in bad):
        return "xla-permute-reshard"
    if any(" over ? " in x.what for x in bad):
        return "xla-unaligned-groups"
    if any(x.what.startswith("FLOPs") for x in bad):
        return "xla-computation-layout"
    return "xla-reshard-choice"
