"""A forward graph cut for a pipeline and its layers placed on stages: the pre ops, one template layer and
the post ops (:func:`split_graph`), the layers of each (virtual) stage (:func:`stage_counts`) and the layer in
each parameter slot of a device (:func:`slot_mask`, :func:`slot_layers`); the executor is
:mod:`~layoutsearch.backend.pipeline`.

The graph's repeated blocks ``layer.0 .. layer.{L-1}`` (ops tagged
``block="layer.i"``, tensors named ``layer.i/<name>``) must be structurally
identical: the same ops and tensors after the prefix, one activation entering
and one leaving each block with the same dims, and parameters of their own.
Stage ``s`` of ``K`` holds a contiguous run of ``layers_per_stage[s]`` layers
(any partition the search picks; default ``L/K`` each). With ``interleaved:V``
each device holds ``V`` chunks of contiguous layers, chunk ``c`` of device
``k`` being virtual stage ``c K + k``: ``layers_per_stage`` then gives the
``K V`` chunks' layers in virtual-stage order (any contiguous partition; a
chunk may hold none, e.g. where the search gave a chunk the embedding alone;
default ``L/(K V)`` each).

One SPMD program gives every device the same local shapes, so a device's layer parameters take
``V x S`` slots (``S``: the largest chunk's layers); a chunk with fewer layers leaves padding slots,
which the executor skips (the module docstring of :mod:`~layoutsearch.backend.pipeline` says why and
what it costs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from layoutsearch.errors import GraphError
from layoutsearch.ir import ops as O
from layoutsearch.ir.dims import Dim
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import BLOCK_PREFIX, block_index, block_name, scope_prefix
from layoutsearch.ir.tensor import Tensor

IN = "__in__"
"""Name of the activation entering a block, in the template layer graph."""


@dataclass(frozen=True)
class PipelineParts:
    """A forward graph cut for pipelining (batch dims already resized).

    ``pre`` computes ``entry`` (the activation entering ``layer.0``) from the
    inputs on a local batch; ``layer`` is one block with template names (its
    input is :data:`IN`, its output ``layer_out``) on a micro-batch; ``post``
    computes the loss from ``exit`` (the activation leaving the last block).
    ``layer_params`` are the template parameter names, ``outer_params`` the
    parameters of ``pre`` and ``post``; ``layer_names`` maps template names to
    those of ``layer.0``.
    """

    pre: Graph
    layer: Graph
    post: Graph
    entry: str
    exit: str
    layer_out: str
    layers: int
    layer_params: tuple[str, ...]
    outer_params: tuple[str, ...]
    layer_names: dict[str, str]


def _subgraph(graph: Graph, name: str, ops: list[O.Op], rename: Mapping[str, str], batch_dim: str, batch: int,
              loss: str | None = None) -> Graph:
    """The graph of ``ops`` (tensors renamed, ``batch_dim`` resized to ``batch``); tensors read but not
    produced by ``ops`` become fed inputs (parameters stay parameters)."""
    produced = {op.output for op in ops}
    used = dict.fromkeys(t for op in ops for t in (*op.inputs, op.output))
    tensors = []
    for t in (graph.tensors[n] for n in used):
        dims = tuple(Dim(d.name, batch) if d.name == batch_dim else d for d in t.dims)
        role = t.role if t.name in produced or t.role == "parameter" else "input"
        role = "loss" if t.name == loss else ("activation" if role == "loss" else role)
        tensors.append(Tensor(rename.get(t.name, t.name), dims, t.dtype, role))
    new_ops = [dataclasses.replace(op, name=rename.get(op.name, op.name), output=rename.get(op.output, op.output),
                                   inputs=tuple(rename.get(t, t) for t in op.inputs), block=None) for op in ops]
    return Graph(name, tensors, new_ops, loss=rename.get(loss, loss) if loss else None)


def check_batch_local(graph: Graph, ops: list[O.Op], batch_dim: str, allowed: str | None, where: str) -> None:
    """Every op reading a batch-carrying tensor keeps the batch dim (examples stay independent)."""
    for op in ops:
        if op.output != allowed and any(batch_dim in graph.tensors[t].dim_names for t in op.inputs) \
                and batch_dim not in graph.tensors[op.output].dim_names:
            raise GraphError(f"{where}: op {op.name!r} mixes examples (drops dim {batch_dim!r}); "
                             "pipelining splits the batch into micro-batches and needs examples independent")


def split_graph(graph: Graph, stages: int, microbatches: int, data: int = 1, batch_dim: str = "batch",
                block_prefix: str = BLOCK_PREFIX) -> PipelineParts:
    """Cut ``graph`` into pre / one template layer / post; GraphError says what does not fit."""
    if graph.loss is None:
        raise GraphError(f"graph {graph.name!r} has no loss to pipeline")
    B = graph.dim(batch_dim).size
    if B % (data * microbatches):
        raise GraphError(f"batch {B} is not divisible by data {data} x microbatches {microbatches}")
    blocks: dict[int, list[O.Op]] = {}
    for op in graph.ops:
        if (i := block_index(op.block, block_prefix)) is not None:
            blocks.setdefault(i, []).append(op)
    L = len(blocks)
    if L == 0 or sorted(blocks) != list(range(L)):
        raise GraphError(f"graph {graph.name!r} needs blocks {block_name(0, block_prefix)} .. "
                         f"{block_name('N-1', block_prefix)}, found {sorted(blocks)}")
    in_block = {op.name for ops in blocks.values() for op in ops}
    templates, entries, exits, canon = [], [], [], []
    for i in range(L):
        block = block_name(i, block_prefix)
        ops, pre = blocks[i], scope_prefix(block)
        produced = {op.output for op in ops}
        external = list(dict.fromkeys(t for op in ops for t in op.inputs if t not in produced))
        acts = [t for t in external if graph.tensors[t].role != "parameter"]
        foreign = [t for t in external if graph.tensors[t].role == "parameter" and not t.startswith(pre)]
        names = {op.name for op in ops}
        outs = [t for t in produced if t == graph.loss or any(c.name not in names for c in graph.consumers[t])]
        if len(acts) != 1 or len(outs) != 1 or foreign:
            raise GraphError(f"block {block} must read one activation and its own parameters and produce "
                             f"one activation; it reads {acts + foreign} and produces {outs}")
        if i and acts[0] != exits[-1]:
            raise GraphError(f"block {block} reads {acts[0]!r}, not the output of the previous block")
        entries.append(acts[0])
        exits.append(outs[0])
        rename = {n: n.removeprefix(pre) for n in [*produced, *external, *(op.name for op in ops)]}
        rename[acts[0]] = IN
        g = _subgraph(graph, f"{graph.name}/layer", ops, rename, batch_dim, B // (data * microbatches))
        templates.append((g, {v: k for k, v in rename.items()}))
        canon.append(([dataclasses.replace(op, block=None) for op in g.ops], g.tensors, rename[outs[0]]))
    for i in range(1, L):
        if canon[i] != canon[0]:
            raise GraphError(f"block {block_name(i, block_prefix)} differs from {block_name(0, block_prefix)} "
                             "(ops, shapes or names); "
                             "pipelining needs identical layers")
    layer, layer_names = templates[0]
    act_in, act_out = layer.tensors[IN], layer.tensors[canon[0][2]]
    if act_in.dims != act_out.dims or act_in.dtype != act_out.dtype or batch_dim not in act_in.dim_names:
        raise GraphError(f"the activation entering a block {act_in.dims} and leaving it {act_out.dims} must have "
                         f"the same dims, including {batch_dim!r}")
    check_batch_local(graph, [op for ops in blocks.values() for op in ops], batch_dim, None, "layers")
    downstream = set()
    for op in graph.ops:
        if op.name in in_block or any(t in downstream or t == exits[-1] for t in op.inputs):
            downstream.add(op.output)
    pre_ops = [op for op in graph.ops if op.name not in in_block and op.output not in downstream]
    post_ops = [op for op in graph.ops if op.name not in in_block and op.output in downstream]
    if data > 1:  # pre and post run on a data shard of the batch
        check_batch_local(graph, pre_ops + post_ops, batch_dim, graph.loss, "ops outside the layers")
    local = B // data
    pre_g = _subgraph(graph, f"{graph.name}/pre", pre_ops, {}, batch_dim, local)
    post_g = _subgraph(graph, f"{graph.name}/post", post_ops, {}, batch_dim, local, loss=graph.loss)
    outer = tuple(dict.fromkeys(t.name for g in (pre_g, post_g) for t in g.parameters))
    return PipelineParts(pre_g, layer, post_g, entries[0], exits[-1], canon[0][2], L,
                         tuple(t.name for t in layer.parameters), outer, layer_names)


def stage_counts(layers: int, stages: int, given: Sequence[int] | None, chunks: int = 1) -> list[int]:
    """Layers per virtual stage: ``given`` (a contiguous partition into ``stages x chunks`` virtual stages, in
    their order: counts summing to the layers, each at least one with one chunk per device; with several, a
    chunk may have none, as when the search gives a chunk the embedding alone), or equal ones."""
    n = stages * chunks
    if given is None:
        if layers % n:
            what = f"{stages} equal stages" if chunks == 1 else f"{n} equal chunks ({stages} stages x {chunks})"
            raise GraphError(f"{layers} layers do not split into {what}; choose stages dividing {layers} or give "
                             "layers_per_stage")
        return [layers // n] * n
    counts = [int(n) for n in given]
    least = 1 if chunks == 1 else 0
    if len(counts) != n or min(counts) < least or sum(counts) != layers:
        what = f"each of the {stages} stages at least one layer" if chunks == 1 else \
            f"the layers of each of the {n} chunks ({stages} stages x {chunks}, in virtual-stage order)"
        raise GraphError(f"layers_per_stage {list(given)} must give {what} and sum to the {layers} layers")
    return counts


def slot_mask(counts: Sequence[int], stages: int, chunks: int = 1) -> np.ndarray:
    """``[stages, chunks x slots]``: whether slot ``c slots + j`` of device ``k`` holds a layer (of its chunk
    ``c``, virtual stage ``c stages + k``), ``slots`` being the largest of ``counts`` (layers per virtual
    stage, in virtual-stage order)."""
    slots = max(counts)
    per_device = np.array(counts).reshape(chunks, stages).T  # [stages, chunks]
    return (np.arange(slots)[None, None, :] < per_device[:, :, None]).reshape(stages, -1)


def slot_layers(counts: Sequence[int], stages: int, chunks: int = 1) -> list[list[int]]:
    """Per device, the layer in each of its slots (``chunks`` chunks of ``max(counts)`` slots; padding slots
    repeat their chunk's first layer, or the last layer for a chunk without one; the executor skips them
    and drops their gradients)."""
    slots = max(counts)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    last = sum(counts) - 1
    return [[min(int(first[c * stages + k]) + (j if j < counts[c * stages + k] else 0), last)
             for c in range(chunks) for j in range(slots)] for k in range(stages)]
