"""Compare what MaxText builds for an exported config (:func:`layoutsearch.maxtext.runner.probe`'s result)
with the plan it was exported from: every parameter's shape and PartitionSpec, the activations MaxText
constrains, and the parameters held per device."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Layout
from layoutsearch.maxtext.tensors import (
    ACTIVATIONS,
    LAYERS,
    PARAMS,
    STACK,
    Counterpart,
    decoder_block,
    zoo_dims,
    zoo_tensors,
)

Spec = tuple[tuple[str, ...], ...]
_UNSCANNED = re.compile(r"/layers_(\d+)/")
_PIPELINED = re.compile(r"/pipeline_module/layers/layers_(\d+)/")


@dataclass
class RoundTrip:
    """The comparison: ``mismatches`` (one line each: the MaxText tensor, what differs, plan vs MaxText), the
    tensors compared, and the parameter elements per device by MaxText and by the plan."""

    mismatches: list[str] = field(default_factory=list)
    params_compared: int = 0
    activations_compared: list[str] = field(default_factory=list)
    params_per_device_maxtext: int = 0
    params_per_device_plan: int = 0

    @property
    def exact(self) -> bool:
        return not self.mismatches and self.params_per_device_maxtext == self.params_per_device_plan


def _norm(spec: Any, rank: int, sizes: Mapping[str, int]) -> Spec:
    entries = list(spec or [])
    entries += [None] * (rank - len(entries))
    out = []
    for e in entries:
        axes = () if e is None else (e,) if isinstance(e, str) else tuple(e)
        out.append(tuple(a for a in axes if sizes.get(a, 1) != 1))
    return tuple(out)


def _expected(layout: Layout, graph: Graph, c: Counterpart, names: Mapping[str, str], sizes: Mapping[str, int],
              tensor_index: int | None) -> tuple[tuple[int, ...], Spec, list[str]] | None:
    """(shape, spec) of MaxText tensor ``c`` by the plan (``tensor_index``: one layer of an unscanned model),
    and the zoo tensors behind it; None if the graph lacks them."""
    tensors = list(zoo_tensors(graph, c))
    if not tensors:
        return None
    stacked = len(c.zoo)
    layers = len(tensors) // stacked
    if tensor_index is not None:
        tensors = [t for t in tensors if t.name.startswith(f"layer.{tensor_index}/")]
    dims = zoo_dims(graph, c)
    specs = set()
    for t in tensors:
        lay = layout.dim_layout(t)
        specs.add(tuple(tuple(names[a] for d in zd for a in lay.get(d, ()) if sizes.get(names[a], 1) != 1)
                        for zd in dims))
    shape = []
    for a, zd in zip(c.dims, dims):
        if a == LAYERS:
            if tensor_index is None:
                shape.append(layers)
        elif a == STACK:
            shape.append(stacked)
        else:
            shape.append(math.prod(graph.dims[d] for d in zd))
    spec = specs.pop() if len(specs) == 1 else None
    if tensor_index is not None:
        spec = tuple(s for s, a in zip(spec, c.dims) if a != LAYERS) if spec is not None else None
    return tuple(shape), spec, [t.name for t in tensors]


def _pipelined_expected(layout: Layout, graph: Graph, c: Counterpart, names: Mapping[str, str],
                        sizes: Mapping[str, int], j: int, stages: int
                        ) -> tuple[tuple[int, ...], Spec | None, list[str]] | None:
    """(shape, spec) of sub-layer ``j`` of MaxText's pipeline (``[stages, ...]``, stage ``s`` holding layer
    ``s * per_stage + j``) by the plan, and the zoo tensors behind it."""
    exp = _expected(layout, graph, c, names, sizes, 0)
    if exp is None:
        return None
    shape, _, _ = exp
    per_stage = int(graph.meta["layers"]) // stages
    specs, zoo = set(), []
    for s in range(stages):
        e = _expected(layout, graph, c, names, sizes, s * per_stage + j)
        specs.add(e[1])
        zoo += e[2]
    spec = specs.pop() if len(specs) == 1 else None
    return (stages, *shape), (((("stage",),) + spec) if spec is not None else None), zoo


def compare(result: Mapping[str, Any], layout: Layout, graph: Graph, names: Mapping[str, str],
            stage_axis: str | None = None) -> RoundTrip:
    """Compare probe ``result`` (one case of :func:`layoutsearch.maxtext.runner.probe`) with the plan's
    ``layout`` of ``graph``; ``names``: the plan's mesh axis -> MaxText mesh axis (as exported); ``stage_axis``:
    a pipelined plan's stage axis (its stages as MaxText's pipeline runs them: the layers in equal stages, the
    other parameters on every stage, the logits' batch over the stage axis too)."""
    rt = RoundTrip()
    if "error" in result:
        rt.mismatches.append(f"MaxText refused the config: {result['error']}")
        return rt
    block = decoder_block(graph)
    if block is None:
        rt.mismatches.append(f"model {graph.name!r} has no MaxText decoder block")
        return rt
    sizes = result["mesh"]
    by_path = {c.maxtext: c for c in PARAMS[block]}
    seen: set[str] = set()
    stages = sizes.get("stage", 1) if stage_axis is not None else 1
    for p in result["params"]:
        path = p["path"].removesuffix("/value")
        piped = _PIPELINED.search(path)
        m = piped or _UNSCANNED.search(path)
        index = int(m.group(1)) if m else None
        key = (_PIPELINED if piped else _UNSCANNED).sub("/layers/", path)
        c = by_path.get(key)
        shape, spec = tuple(p["shape"]), _norm(p["spec"], len(p["shape"]), sizes)
        rt.params_per_device_maxtext += math.prod(shape) // math.prod(sizes.get(a, 1) for e in spec for a in e)
        if c is None:
            rt.mismatches.append(f"{path}: a MaxText parameter the plan's graph has no counterpart for")
            continue
        exp = (_pipelined_expected(layout, graph, c, names, sizes, index, stages) if piped
               else _expected(layout, graph, c, names, sizes, index))
        if exp is None:
            rt.mismatches.append(f"{path}: the plan's graph lacks {', '.join(c.zoo)}")
            continue
        want_shape, want_spec, zoo = exp
        seen.update(zoo)
        rt.params_compared += 1
        if want_shape != shape:
            rt.mismatches.append(f"{path} ({zoo[0]}): shape {list(want_shape)} in the plan, {list(shape)} in MaxText")
        if want_spec is None:
            rt.mismatches.append(f"{path} ({zoo[0]}): the plan lays out its zoo tensors differently")
        elif want_spec != spec:
            rt.mismatches.append(f"{path} ({zoo[0]}): spec {_show(want_spec)} in the plan, {_show(spec)} in MaxText")
    params = [t for t in graph.tensors.values() if t.role == "parameter"]
    for t in params:
        if t.name not in seen:
            rt.mismatches.append(f"{t.name}: a parameter of the plan MaxText has no counterpart for")
    rt.params_per_device_plan = sum(math.prod(layout.local_shape(t)) // (stages if t.name.startswith("layer.") else 1)
                                    for t in params)  # (a stage holds its layers; the rest is on every stage)
    acts = {c.maxtext: c for c in ACTIVATIONS[block]}
    observed = [(a["site"], a["aval"], a["spec"]) for a in result["activations"] if a["logical"]]
    observed.append(("logits", None, result["logits"]["spec"]))
    for site, aval, got in observed:
        c = acts.get(site)
        if c is None:
            continue
        exp = _expected(layout, graph, c, names, sizes, None)
        if exp is None:
            continue
        want_shape, want_spec, zoo = exp
        if stages > 1 and site == "logits" and want_spec is not None:  # outside the stages: batch over 'stage' too
            want_spec = (tuple(a for a in result["mesh"] if a == "stage" or a in want_spec[0]),) + want_spec[1:]
        spec = _norm(got, len(want_shape), sizes)
        if aval is not None:
            shape = tuple(int(x) for x in aval[aval.index("[") + 1:-1].split(",")) if "[" in aval else ()
            if math.prod(shape[1:]) != math.prod(want_shape[1:]):
                rt.mismatches.append(f"activation {site} ({zoo[0]}): shape {list(want_shape)} in the plan, {aval} in MaxText")
        if want_spec is None or want_spec != spec:
            rt.mismatches.append(f"activation {site} ({zoo[0]}): spec {_show(want_spec) if want_spec else '(mixed)'} "
                                 f"in the plan, {_show(spec)} in MaxText")
        if site not in rt.activations_compared:
            rt.activations_compared.append(site)
    return rt


def _show(spec: Spec) -> str:
    return "P(" + ", ".join("None" if not e else repr(e[0]) if len(e) == 1 else repr(e) for e in spec) + ")"
