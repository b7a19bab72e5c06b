"""Import a JAX or Flax function as a named-dimension graph: :func:`from_jax`.

The function is traced to a jaxpr (:mod:`.trace`), composite ops are recognized (:mod:`.patterns`) and
each primitive is translated into IR ops over dims named from the caller's ``dims``
(:mod:`.translate`, :mod:`.labels`). The result is a forward graph with the function's scalar output as
its loss: ``ls.estimate``, ``ls.search`` and ``Plan.compile`` take it like a zoo model's.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from layoutsearch.errors import GraphError
from layoutsearch.importer import patterns
from layoutsearch.importer.trace import Node, Var, flatten
from layoutsearch.importer.translate import BLOCK_PATTERN, Translator, block_of
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Layout


def from_jax(fn: Callable[..., Any], *args: Any, dims: Any, params_argnums: Sequence[int] = (0,),
             splits: Mapping[str, Sequence[str]] | None = None, name: str | None = None) -> Graph:
    """The forward graph of ``fn(*args)``, which returns a scalar loss (or a tuple whose first item is).

    ``dims`` is a pytree like ``args`` (a tuple with one entry per argument) whose leaves are tuples of
    dim names, one per axis of the matching array, e.g. ``({"w1": ("d_model", "d_ff")}, ("batch",
    "d_model"))``; a leaf may be None (names derived for its axes) and a subtree may be None (the same
    for all its arrays). Float arrays of the arguments in ``params_argnums`` are the parameters; the
    other arrays are inputs (integer arrays: ids and labels). ``splits`` names the dims a reshape splits
    a dim into, e.g. ``{"d_model": ("heads", "d_kv")}`` (default ``d_model_0``, ``d_model_1``).

    Raises :class:`~layoutsearch.errors.GraphError` naming the primitive, its source line and the dims
    of its operands when the function uses something the importer cannot translate.
    """
    if not isinstance(args, tuple) or not args:
        raise GraphError("from_jax needs example arguments: from_jax(fn, params, batch, dims=...)")
    leaves = _named_leaves(args, dims, set(params_argnums), _arg_names(fn, len(args)))
    program, _ = flatten(fn, args)
    if len(leaves) != len(program.inputs):
        raise GraphError(f"internal: {len(leaves)} argument arrays for {len(program.inputs)} jaxpr inputs")
    loss = program.outputs[0] if program.outputs else None
    if not isinstance(loss, Var) or loss.shape != () or loss.dtype not in ("float32", "bfloat16", "float16"):
        raise GraphError("the function must return a scalar float loss (or a tuple whose first item is one)")
    nodes = patterns.rewrite(_needed(program.nodes, loss))
    tr = Translator(splits)
    for var, (path, names, role) in zip(program.inputs, leaves, strict=True):
        tr.source(var, path, names, role)
    tr.run(nodes, block_of)
    title = name or getattr(fn, "__qualname__", None) or "imported"
    return tr.graph(re.sub(r"[^\w.\-]+", "_", title), loss, {"imported_from": getattr(fn, "__qualname__", "?")})


def partition_specs(layout: Layout, graph: Graph, tree: Any, arg: int = 0, name: str | None = None) -> Any:
    """PartitionSpecs laying out ``tree`` (argument ``arg`` of the function ``graph`` was imported from,
    e.g. a Flax ``params`` dict or an ``nnx.State``) as ``layout`` lays out the graph's tensors: a pytree
    like ``tree`` to pass to ``jax.device_put`` (with ``NamedSharding``) or ``jax.jit(in_shardings=...)``.
    Arrays the graph does not read (dead code) are replicated."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    specs = []
    for path, _ in flat:
        key = _path_name(path) or name or f"arg{arg}"
        t = graph.tensors.get(key)
        specs.append(layout.partition_spec(t) if t is not None else jax.sharding.PartitionSpec())
    return jax.tree_util.tree_unflatten(treedef, specs)


def flax_dims(tree: Any) -> Any:
    """The dim names Flax metadata gives ``tree``'s arrays, as ``from_jax`` takes them: the logical names
    of ``nn.with_logical_partitioning`` (Linen, boxed variables) or of ``nnx.with_partitioning`` /
    ``nnx.Param(sharding=...)`` (an ``nnx.State``); None for arrays without names."""
    import flax.linen as nn

    def names(spec: Any) -> tuple[str | None, ...] | None:
        if not isinstance(spec, jax.sharding.PartitionSpec) or not len(spec):
            return None
        return tuple(n if isinstance(n, str) else None for n in spec)

    if any(isinstance(x, nn.LogicallyPartitioned) for x in jax.tree_util.tree_leaves(
            tree, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))):
        specs = nn.get_partition_spec(tree)
    else:
        from flax import nnx

        specs = nnx.get_partition_spec(tree)
    return jax.tree_util.tree_map(names, specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def _needed(nodes: list[Node], loss: Var) -> list[Node]:
    """The nodes the loss depends on, in order."""
    want = {loss}
    keep: list[Node] = []
    for n in reversed(nodes):
        if any(o in want for o in n.outs):
            keep.append(n)
            want.update(v for v in n.ins if isinstance(v, Var))
    return keep[::-1]


def _arg_names(fn: Callable[..., Any], n: int) -> list[str]:
    """The names of ``fn``'s first ``n`` positional parameters (``arg0``... where unknown)."""
    try:
        ps = [p.name for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        ps = []
    return [ps[k] if k < len(ps) else f"arg{k}" for k in range(n)]


def _named_leaves(args: tuple[Any, ...], dims: Any, params: set[int], arg_names: list[str]) -> list[tuple[str, Any, str]]:
    """(tensor name, dim names or None, role) per array leaf of ``args``, in jaxpr input order."""
    if not isinstance(dims, tuple | list) or len(dims) != len(args):
        raise GraphError(f"dims must have one entry per argument ({len(args)}), got {type(dims).__name__}"
                         + (f" of {len(dims)}" if isinstance(dims, tuple | list) else ""))
    out: list[tuple[str, Any, str]] = []
    for k, (arg, sub) in enumerate(zip(args, dims, strict=True)):
        flat, _ = jax.tree_util.tree_flatten_with_path(arg)
        for path, leaf in flat:
            name = _path_name(path) or arg_names[k]
            names = _lookup(sub, path, name)
            is_float = jax.numpy.issubdtype(jax.numpy.result_type(leaf), jax.numpy.floating)
            out.append((name, names, "parameter" if k in params and is_float else "input"))
    return out


def _lookup(dims: Any, path: tuple[Any, ...], name: str) -> Sequence[str | None] | None:
    node = dims
    for key in path:
        if node is None or _is_leaf(node):
            break
        k = getattr(key, "key", getattr(key, "idx", getattr(key, "name", None)))
        try:
            node = node[k]
        except (KeyError, IndexError, TypeError):
            if not isinstance(k, str) or not hasattr(node, k):
                raise GraphError(f"dims has no entry for argument array {name!r}") from None
            node = getattr(node, k)  # an attribute: a dataclass field, a Flax Variable's value
    if node is not None and not _is_leaf(node):
        raise GraphError(f"dims for {name!r} must be a tuple of dim names, got {type(node).__name__}")
    return node


def _is_leaf(x: Any) -> bool:
    return isinstance(x, tuple | list) and all(n is None or isinstance(n, str) for n in x)


def _path_name(path: tuple[Any, ...]) -> str:
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.GetAttrKey) and key.name == "value":
            continue  # a Flax NNX Variable's array: name it after the variable
        k = getattr(key, "key", getattr(key, "idx", getattr(key, "name", key)))
        parts.append(str(k))
    return "/".join(parts)


__all__ = ["BLOCK_PATTERN", "flax_dims", "from_jax", "partition_specs"]
