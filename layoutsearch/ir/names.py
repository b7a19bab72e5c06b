"""The naming conventions of the IR, in one place: scoped names, repeated blocks and derived tensors.

Names carry structure that other modules rely on; they are written and read
only through this module:

* **Scopes.** :meth:`GraphBuilder.block` prefixes every op and tensor name in
  block ``B`` with ``B/`` (:func:`scoped`); blocks nest (``layer.3/attn``), the
  outermost one is the *top-level block* (:func:`top_block`).
* **Repeated blocks.** The zoo, the importer and the pipeline executor name the
  repeated layers of a model ``layer.0 .. layer.{L-1}`` (:func:`block_name`,
  :func:`block_index`); a cause or tensor name with its block numbers folded
  (``layer.3/ff_in`` -> ``layer.*/ff_in``, :func:`fold_block_numbers`) stands
  for every layer.
* **Derived tensors** (:mod:`layoutsearch.ir.training`, whose docstring tells the
  rules): ``grad/T`` is the gradient of ``T`` (:func:`grad_name`),
  ``grad/<op>/<i>`` a contribution to it and ``grad/T/add<k>`` a partial sum;
  ``adam_m/P``, ``adam_v/P`` and ``master/P`` are optimizer state
  (:func:`state_name`); ``new/X`` is the value replacing ``X`` after the step
  (:func:`new_name`).
* **Imported arrays.** A graph imported from a JAX function names the tensor of each array of its
  arguments after the array's pytree path (:func:`pytree_key`: ``transformer/h/0/attn/c_attn/kernel``); a
  tensor read as one slice of a scanned stack is ``KEY[i]``, as a static slice ``KEY[0:16, 0:512]``
  (:func:`leaf_tensors` finds them from the key).

The module imports nothing from the package, so every layer can use it.
"""

from __future__ import annotations

import re

SEP = "/"
"""Separates a scope from the name inside it."""

BLOCK_PREFIX = "layer"
"""The prefix of repeated blocks: ``layer.0``, ``layer.1``, ..."""

GRAD = "grad"
NEW = "new"
MASTER = "master"
ADAM_M, ADAM_V = "adam_m", "adam_v"
"""Adam's state per parameter (first and second moment); also the names of their update functions."""
ADAM_STATES = (ADAM_M, ADAM_V)

_NUMBERED = re.compile(r"(?<=[A-Za-z_])\.\d+(?=/)")


# -- scopes and blocks ----------------------------------------------------------------------------------------------

def scoped(scope: str | None, name: str) -> str:
    """``name`` inside ``scope`` (``scope/name``); ``name`` itself without a scope."""
    return f"{scope}{SEP}{name}" if scope else name


def scope_prefix(scope: str) -> str:
    """What every name inside ``scope`` starts with (``scope/``)."""
    return scope + SEP


def top_block(block: str) -> str:
    """The outermost block of a (nested) block name: ``layer.3`` for ``layer.3/attn``."""
    return block.split(SEP)[0]


def block_name(i: int | str, prefix: str = BLOCK_PREFIX) -> str:
    """The name of repeated block ``i``: ``layer.i`` (``i`` a number, or a placeholder such as ``N-1`` in
    messages)."""
    return f"{prefix}.{i}"


def block_index(block: str | None, prefix: str = BLOCK_PREFIX) -> int | None:
    """``i`` when the top-level block of ``block`` is repeated block ``prefix.i``, else None."""
    m = re.fullmatch(rf"{re.escape(prefix)}\.(\d+)", top_block(block or ""))
    return int(m.group(1)) if m else None


def fold_block_numbers(name: str) -> str:
    """``name`` with the numbers of numbered scopes folded: ``layer.3/ff_in`` -> ``layer.*/ff_in``."""
    return _NUMBERED.sub(".*", name)


# -- derived tensors (the training graph) ---------------------------------------------------------------------------

def grad_name(t: str, *parts: str | int) -> str:
    """The gradient of tensor ``t`` (``grad/t``), or with ``parts`` a name under it: ``grad/<op>/<i>``
    (a contribution from input ``i`` of op ``<op>``), ``grad/t/add<k>`` (a partial sum), helpers."""
    return SEP.join((GRAD, t, *map(str, parts)))


def is_grad(name: str) -> bool:
    """Whether ``name`` was written by the backward pass under the ``grad/`` scope."""
    return name.startswith(GRAD + SEP)


def is_grad_sum(name: str, t: str) -> bool:
    """Whether ``name`` is the gradient of ``t`` or one of the partial sums adding up to it
    (``grad/t/add<k>``)."""
    g = grad_name(t)
    return name == g or name.startswith(g + SEP + "add")


def new_name(t: str) -> str:
    """The value replacing ``t`` after the optimizer step: ``new/t``."""
    return scoped(NEW, t)


def is_new(name: str) -> bool:
    """Whether ``name`` is an optimizer update's result (``new/...``)."""
    return name.startswith(NEW + SEP)


def state_name(kind: str, p: str) -> str:
    """Optimizer state ``kind`` (``adam_m``, ``adam_v``, ``master``) of parameter ``p``: ``kind/p``."""
    return scoped(kind, p)


def is_adam_state(name: str) -> bool:
    """Whether ``name`` is Adam state of a parameter (``adam_m/P``, ``adam_v/P``)."""
    return name.startswith(tuple(scope_prefix(k) for k in ADAM_STATES))


def is_derived(name: str) -> bool:
    """Whether ``name`` is a gradient, a new value or Adam state: what the training derivation adds beside
    master weights."""
    return is_grad(name) or is_new(name) or is_adam_state(name)


__all__ = [
    "ADAM_M", "ADAM_STATES", "ADAM_V", "BLOCK_PREFIX", "GRAD", "MASTER", "NEW", "SEP", "block_index", "block_name",
    "fold_block_numbers", "grad_name", "is_adam_state", "is_derived", "is_grad", "is_grad_sum", "is_new",
    "new_name", "scope_prefix", "scoped", "state_name", "top_block",
]


def pytree_key(path: tuple[object, ...]) -> str:
    """The name of a pytree leaf from its path (``jax.tree_util.tree_flatten_with_path``): the keys joined by
    ``/``, a Flax NNX Variable's ``.value`` left out."""
    parts = []
    for key in path:
        if type(key).__name__ == "GetAttrKey" and getattr(key, "name", None) == "value":
            continue  # a Flax NNX Variable's array: name it after the variable
        k = getattr(key, "key", getattr(key, "idx", getattr(key, "name", key)))
        parts.append(str(k))
    return SEP.join(parts)


Index = tuple[int | slice, ...]
"""Where a tensor lies in its array: the indices (a scan's slice) and slices (a static slice) to apply."""

_PART = re.compile(r"\[(\d+)\]|\[((?:\d+:\d+)(?:, \d+:\d+)*)\]")


def leaf_tensors(tensors: object, key: str) -> list[tuple[str, Index]]:
    """The tensors of ``tensors`` (names) read from the array named ``key``, each with where it lies in the
    array: ``key`` itself (``()``), a scanned stack's slices ``key[i]`` (``(i,)``), static slices
    ``key[a:b, c:d]`` (``(slice(a, b), slice(c, d))``), or slices of those."""
    out = []
    for name in tensors:  # type: ignore[attr-defined]
        if not isinstance(name, str) or not name.startswith(key):
            continue
        rest, index = name[len(key):], []
        while rest:
            m = _PART.match(rest)
            if m is None:
                break
            if m.group(1) is not None:
                index.append(int(m.group(1)))
            else:
                index.extend(slice(*map(int, b.split(":"))) for b in m.group(2).split(", "))
            rest = rest[m.end():]
        if not rest:
            out.append((name, tuple(index)))
    return out
