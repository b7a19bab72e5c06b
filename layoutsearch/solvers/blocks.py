"""Repeated blocks in the search: which blocks are tied into one family (:func:`block_families`).

Blocks with the same structure (same ops, names equal after stripping the
block prefix, same shapes) share one node per op (or per block) of a space
when layers are tied, so a 96-layer model is one layer's variables.
"""

from __future__ import annotations

from collections import defaultdict

from layoutsearch.costmodel.step import signature_ids
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import SEP, scope_prefix


def strip_block(name: str, block: str | None) -> str:
    """``name`` without the scope prefix of ``block`` (unchanged when ``block`` is None)."""
    if block is None:
        return name
    prefix = scope_prefix(block)
    if name.startswith(prefix):
        return name[len(prefix):]
    return name.replace(SEP + prefix, SEP, 1)


def block_families(graph: Graph, tie: bool = True) -> dict[str, str]:
    """Block name -> the first block of its family (blocks with the same ops, names equal after stripping
    the block prefix, same shapes); each block is its own family when ``tie`` is False."""
    sigs: dict[str, list] = defaultdict(list)
    inside: dict[str, set[str]] = defaultdict(set)
    for op in graph.ops:
        if op.block is not None:
            inside[op.block].add(op.output)
    sig = signature_ids(graph)
    for op in graph.ops:
        if op.block is not None:
            ins = tuple(strip_block(i, op.block) if i in inside[op.block] or strip_block(i, op.block) != i
                        else "<in>" for i in op.inputs)
            sigs[op.block].append((strip_block(op.name, op.block), ins, sig[op.name]))
    fam: dict[str, str] = {}
    first: dict[tuple, str] = {}
    for b, s in sigs.items():
        key = tuple(sorted(s, key=repr)) if tie else (b,)
        fam[b] = first.setdefault(key, b)
    return fam

