"""Activation rematerialization policies: their names, what each recomputes, and which contain which.

* ``none``: every activation the backward pass reads is kept from the forward pass;
* ``selective``: every block keeps its inputs and the outputs of its projections (matmuls with a parameter
  operand) and recomputes the rest (Korthikanti et al. 2022, "Reducing activation recomputation in large
  transformer models");
* ``full``: every block keeps only its inputs and recomputes the rest;
* ``full:N``: the first ``N`` blocks (in forward order) as ``full``, the others as ``none``: Megatron-LM's
  ``--recompute-granularity full --recompute-method block --recompute-num-layers N``, for a memory limit
  that ``none`` exceeds but recomputing every block would satisfy with room to spare. The first blocks
  are those whose activations are held longest.

The cost model prices them (:mod:`layoutsearch.costmodel.memory`), the backend runs them and the exports
name them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir.graph import Graph

REMAT_POLICIES = ("none", "selective", "full")
"""The policies applied alike to every block."""

KNOWN = "none, selective, full, full:N (the first N blocks full, the rest none)"
"""The policies, in words (for error messages and help)."""

_BLOCKS = re.compile(r"full:(\d+)")


@dataclass(frozen=True)
class Remat:
    """A parsed policy: ``kind`` (one of :data:`REMAT_POLICIES`) and, for ``full:N``, ``blocks`` = N (the
    first N blocks recompute; None: every block does)."""

    kind: str
    blocks: int | None = None

    @property
    def name(self) -> str:
        return self.kind if self.blocks is None else f"{self.kind}:{self.blocks}"


def parse_remat(policy: str, error: type[Exception] = LayoutSearchError) -> Remat:
    """``policy`` parsed; ``error`` (naming the policy and the known ones) when it is none of them."""
    if isinstance(policy, str):
        if policy in REMAT_POLICIES:
            return Remat(policy)
        m = _BLOCKS.fullmatch(policy)
        if m and int(m.group(1)) >= 1:
            return Remat("full", int(m.group(1)))
    raise error(f"unknown remat policy {policy!r} (known: {KNOWN}, N >= 1)")


def check_remat(policy: str, error: type[Exception] = LayoutSearchError) -> str:
    """``policy`` if it is a valid policy name (:func:`parse_remat`), else ``error``."""
    parse_remat(policy, error)
    return policy


def forward_blocks(graph: Graph) -> list[str]:
    """The blocks of ``graph``'s forward ops (``op.block``), in forward order."""
    return list(dict.fromkeys(op.block for op in graph.ops if op.phase == "forward" and op.block is not None))


def recomputed_blocks(graph: Graph, policy: str, error: type[Exception] = LayoutSearchError) -> list[str]:
    """The blocks of ``graph`` that ``policy`` recomputes (none for ``none``, the first N for ``full:N``, else
    all), in forward order; ``error`` for an unknown policy or more blocks than the graph has."""
    remat = parse_remat(policy, error)
    if remat.kind == "none":
        return []
    blocks = forward_blocks(graph)
    if remat.blocks is not None and remat.blocks > len(blocks):
        raise error(f"remat {policy}: model {graph.name!r} has {len(blocks)} blocks, not {remat.blocks}")
    return blocks[:remat.blocks]


def recomputes_within(a: str, b: str) -> bool:
    """Whether policy ``b`` recomputes every op policy ``a`` recomputes (``a``'s steps then do less work and
    hold more memory, layout for layout): none < full:N < full:M (N < M) < full, none < selective < full."""
    ra, rb = parse_remat(a), parse_remat(b)
    if ra.kind == "none" or a == b or rb == Remat("full"):
        return True
    if ra.kind == "full" and rb.kind == "full":
        return ra.blocks is not None and rb.blocks is not None and ra.blocks <= rb.blocks
    return False


def block_groups(blocks: int) -> tuple[str, ...]:
    """The ``full:N`` policies a search tries for a model of ``blocks`` blocks: the first quarter, half and
    three quarters of them (those of at least one block and fewer than all)."""
    return tuple(f"full:{n}" for n in sorted({round(blocks * q) for q in (0.25, 0.5, 0.75)}) if 1 <= n < blocks)


__all__ = ["KNOWN", "REMAT_POLICIES", "Remat", "block_groups", "check_remat", "forward_blocks", "parse_remat",
           "recomputed_blocks", "recomputes_within"]
