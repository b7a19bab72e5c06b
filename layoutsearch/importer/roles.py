"""Readable names for the dims nobody named, from the role each plays in the program.

A parameter's axes start as placeholders named after the parameter (``kernel_1``); before the graph is built,
:func:`name_roles` gives the placeholders that play a known role the name a practitioner uses for it:

* ``vocab``: the rows an embedding table's ids pick, and the classes of a cross-entropy (tied or untied
  embeddings get the one name: the two dims have one size and no tensor holds both);
* ``d_model``: an embedding table's other axis, the axis a layer norm normalizes;
* ``d_kv`` and ``heads``: the axis attention contracts between its queries and keys and the axis both keep
  (two activations multiplied, neither a parameter); ``kv_heads``: the axis merged with a broadcast into the
  keys' ``heads`` (grouped-query attention's ``jnp.repeat``); a projection's axis split into such axes is
  ``heads_d_kv`` (``kv_heads_d_kv``), one cut into three, q, k and v, ``qkv``; the halves of a dim cut in two
  (``rotate_half``), and the parts a concat joins into one (a rotary table ``[sin, sin]`` computed from
  position ids given as inputs, MaxText's), ``d_kv_half``, other parts ``<dim>_part``;
* ``d_ff``: an axis a parameter adds to the model's width in an einsum (the first projection of an MLP).

A role never overrides a name the user or the model's logical-axis metadata gave; placeholders of one name
and different sizes get different names (``heads_2``) when the graph is built (:meth:`Labels.names`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from layoutsearch.importer.labels import Labels
from layoutsearch.importer.pending import DimRef, PendingOp, PendingTensor
from layoutsearch.ir import ops as O


def name_roles(labels: Labels, tensors: Mapping[str, PendingTensor], ops: Iterable[PendingOp]) -> None:
    """Give the placeholders of ``tensors`` that play a role in ``ops`` its name (see the module)."""
    ops = list(ops)
    find = labels.find
    role: dict[int, str] = {}

    def give(a: int | None, name: str) -> None:
        if a is not None and labels.name(a) is None and find(a) not in role:
            role[find(a)] = name

    def dim(op: PendingOp, key: str = "dim") -> int:
        ref = op.attrs[key]
        assert isinstance(ref, DimRef)
        return ref.id

    producer = {op.name: op for op in ops}

    def from_parameter(t: str) -> bool:
        """Whether ``t`` is a parameter, or a value of one alone (a cast, a slice, a rename)."""
        while True:
            if tensors[t].role == "parameter":
                return True
            p = producer.get(t)
            if p is None or len(p.inputs) != 1 or p.cls is O.Einsum:
                return False
            t = p.inputs[0]

    width: set[int] = set()  # the model's width (d_model, however named)
    classes = {labels.size(dim(op)) for op in ops if op.cls is O.CrossEntropy}
    tables = [op for op in ops if op.cls is O.Gather and from_parameter(op.inputs[0])]
    widest = max((labels.size(dim(op)) for op in tables), default=0)
    for op in ops:  # vocab and d_model
        if op in tables:
            rows = labels.size(dim(op))
            # the token embedding: its rows are the classes (tied or untied), or the largest table; another
            # table (token types, positions) is named after its module
            give(dim(op), "vocab" if rows in classes or not classes and rows == widest else _module(op.inputs[0]))
            rest = [a for a in tensors[op.inputs[0]].labels if find(a) != find(dim(op))]
            if len(rest) == 1:
                give(rest[0], "d_model")
                width.add(find(rest[0]))
        elif op.cls is O.CrossEntropy:
            give(dim(op), "vocab")
        elif op.cls is O.LayerNorm:
            give(dim(op), "d_model")
            width.add(find(dim(op)))
    for op in ops:  # attention: the scores contract d_kv and keep heads; the context keeps the values' d_kv
        if op.cls is not O.Einsum or len(op.inputs) != 2 or any(from_parameter(t) for t in op.inputs):
            continue
        a, b = ({find(x) for x in tensors[t].labels} for t in op.inputs)
        out = {find(x) for x in tensors[op.name].labels}
        contracted = (a & b) - out
        if len(contracted) != 1:
            continue
        c = next(iter(contracted))
        size = labels.size
        named = labels.name
        if labels.name(c) is None and any(size(x) == size(y) and (named(x) and named(y) or size(x) != size(c))
                                          for x in (a - b) & out for y in (b - a) & out):
            give(c, "d_kv")  # scores: queries [.., q_seq, d_kv] times keys [.., k_seq, d_kv]
        elif named(c) is not None and any(size(x) == size(c) and named(x) for x in (a ^ b) & out):
            for x in (a ^ b) & out:  # context: probabilities [.., q_seq, k_seq] times values [.., k_seq, d_kv]
                if named(x) is None:
                    give(x, "d_kv")
        else:
            continue
        for x in a & b & out:
            give(x, "heads")
    reshapes = [op for op in ops if op.cls is O.Reshape]
    for op in reshapes:  # grouped-query heads: merged with a broadcast into the keys' heads
        for src, dst in op.attrs["groups"]:
            if len(src) == 2 and len(dst) == 1 and role.get(find(dst[0].id)) == "heads":
                give(src[0].id, "kv_heads")
                give(src[1].id, "kv_repeats")
    for op in reshapes:  # projections fused over heads
        for src, dst in op.attrs["groups"]:
            split, fused = (dst, src) if len(src) == 1 else (src, dst)
            names = [role.get(find(r.id)) for r in split]
            if len(fused) == 1 and len(split) == 2 and names[1] == "d_kv" and names[0] in ("heads", "kv_heads"):
                give(fused[0].id, f"{names[0]}_d_kv")
    for op in ops:
        if op.cls is O.Slice and role.get(find(dim(op, "out_dim"))) in ("heads_d_kv", "kv_heads_d_kv", "d_model"):
            if labels.size(dim(op)) == 3 * labels.size(dim(op, "out_dim")):
                give(dim(op), "qkv")
    for op in ops:  # d_ff: the width an MLP's first projection goes to
        if op.cls is not O.Einsum or len(op.inputs) != 2:
            continue
        params = [t for t in op.inputs if from_parameter(t)]
        if len(params) != 1:
            continue
        x = next(t for t in op.inputs if t not in params)
        ins = {find(a) for a in tensors[x].labels}
        contracted = ins - {find(a) for a in tensors[op.name].labels}
        if contracted and contracted <= width:
            for a in tensors[params[0]].labels:
                if find(a) not in ins and find(a) in {find(b) for b in tensors[op.name].labels}:
                    give(a, "d_ff")
    for op in ops:  # the parts of a dim cut by a slice: rotate_half's halves of d_kv are d_kv_half
        if op.cls is O.Slice:
            whole, part = dim(op), dim(op, "out_dim")
            base = role.get(find(whole)) or labels.name(whole)
            if base is not None:
                half = 2 * labels.size(part) == labels.size(whole)
                give(part, f"{base}_half" if half else f"{base}_part")
    for op in ops:  # the parts a concat joins into a named dim: a rotary table's [sin, sin] halves of d_kv
        if op.cls is O.Concat:
            whole, parts = op.attrs["out_dim"], op.attrs["dims"]
            assert isinstance(whole, DimRef) and all(isinstance(r, DimRef) for r in parts)
            base = role.get(find(whole.id)) or labels.name(whole.id)
            if base is not None:
                for r in parts:
                    half = 2 * labels.size(r.id) == labels.size(whole.id)
                    give(r.id, f"{base}_half" if half else f"{base}_part")
    for r, name in role.items():
        labels.rename_placeholder(r, name)


LEAF_NAMES = frozenset({"kernel", "weight", "w", "bias", "b", "embedding", "embeddings", "scale", "offset"})
"""Pytree leaf names that say what a parameter is, not which: the module above names it (``wte/embedding``)."""


def _module(path: str) -> str:
    """The module a parameter belongs to, from its pytree path (``bert/embeddings/token_type/embedding`` ->
    ``token_type``)."""
    parts = [p for p in path.replace("[", "/").replace("]", "").split("/") if p]
    while len(parts) > 1 and parts[-1] in LEAF_NAMES:
        parts.pop()
    stem = "".join(c if c.isalnum() else "_" for c in parts[-1]).strip("_") if parts else "x"
    return stem if stem[:1].isalpha() else f"x_{stem}"


__all__ = ["name_roles"]
