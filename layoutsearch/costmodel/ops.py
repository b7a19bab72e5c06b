"""Per-op costs under a layout: FLOPs, HBM traffic and the collectives each op causes.

The rules are Mesh-TensorFlow's, for any op over named dims:

* an op runs over its *iteration space* (the dims of its inputs and output);
  its *computation layout* says which mesh axes split which of those dims.
  Work per device = the op's FLOPs at the local (split) dim sizes (an axis
  splitting none of the op's dims replicates the work);
* each input must arrive laid out as the computation layout restricted to its
  dims; a tensor stored otherwise is resharded first (all-gather for an axis
  to drop, all-to-all for an axis that moves to another dim, a free local
  slice for an axis to add);
* a reduced dim (contracted by an einsum, summed by a reduction) split over
  axes leaves partial sums: one all-reduce per such dim, or a reduce-scatter
  over the axes the output tensor keeps split (FSDP gradients), when the
  backend emits reduce-scatter (``Hardware.reduce_scatter``); a backend that
  runs collectives of bf16/fp16 tensors in float32 (XLA on CPU:
  ``Hardware.float32_collectives``) moves 4 bytes per element;
* normalizations over a split dim (softmax, layer norm, cross-entropy and
  their gradients) all-reduce their per-row statistics over the splitting axes;
* a ``dropout_mask(x)`` draws its values from its seed and x's shape: it reads
  nothing (no HBM read of x, no reshard of x);
* the result, laid out as the computation layout restricted to the output's
  dims, is resharded if the output tensor is stored otherwise.

The backward pass and the optimizer are ops of the same IR (see
:mod:`layoutsearch.ir.training`), so data-parallel gradient all-reduces and
model-parallel activation all-reduces come out of the same rules: this is
Table 1 of the Mesh-TensorFlow paper, for any graph.

Calibrated against XLA (``tests/test_xla_agreement.py``: every zoo case, bytes
by collective kind and axes and FLOPs per device within 2% of the compiled
program), the rules model what XLA's partitioner does rather than the cheapest
conceivable choice:

* partial sums are finished one reduced dim at a time (``w`` contracted over
  ``batch`` on ``data`` and ``seq`` on ``seq``: an all-reduce over ``seq`` and
  one over ``data``, not one over both);
* without reduce-scatter (XLA:CPU), an einsum's partial sums over a dim split
  over several axes, of which the stored output keeps some split (hybrid FSDP:
  ``batch`` over data+fsdp, the gradient stored split over fsdp), are
  all-reduced over the kept axes, sliced, and the slice all-reduced over the
  others;
* a gather (scatter-add) either runs in the rules' computation layout or keeps
  the table as stored ("operand passthrough": the ids are gathered, the
  result resharded), or, for a scatter-add, keeps its updates as stored (the
  zero table it adds into is laid out to match, the result resharded), or,
  for a gather with split ids, is split like the ids (the table all-gathered),
  whichever moves fewer bytes (a table split over other dims than the
  gathered one, and not over it, always runs as stored: XLA tries that first); a gathered dim split over
  axes is masked locally and all-reduced (Megatron's vocab-parallel embedding);
* a collective names its group's axes in mesh order, without axes of size 1;
  one over a group of one device is no collective (:func:`on_mesh`);
* a reshard of an einsum operand that several ops need (a weight all-gathered
  for the forward and the backward matmul) is done once (:attr:`Comm.shared`,
  :meth:`OpRules.step_costs`) — on XLA:CPU; on GPU/TPU
  (``Hardware.regather_weights``) once per phase: FSDP releases a gathered
  weight after the forward pass and gathers it again for the backward pass;
* FLOPs are counted as XLA's cost analysis counts the backend's lowering
  (:func:`op_flops`): transcendentals apart, constants folded, shared
  sub-expressions of a forward op and its gradient counted once, one FLOP per
  element an all-reduce sums. XLA's instruction fusion recomputes cheap
  producers in each consumer on top of that (0-15% more on the zoo); the rules
  count each op once, like the program compiled without fusion.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor
from layoutsearch.layout import Axes, DimLayout, Layout
from layoutsearch.mesh import Mesh

ELEMENTWISE_FLOPS: dict[str, float] = {
    "identity": 0, "fill": 0, "neg": 1, "scale": 1, "square": 1, "relu": 1, "gelu": 8, "silu": 4, "tanh": 0,
    "sigmoid": 3, "exp": 0, "log": 0, "sqrt": 0, "rsqrt": 0, "add": 1, "sub": 1, "mul": 1, "div": 1, "eq": 2,
    "square_grad": 2, "relu_grad": 2, "gelu_grad": 20, "silu_grad": 9, "tanh_grad": 4, "sigmoid_grad": 6,
    "exp_grad": 1, "log_grad": 1, "sqrt_grad": 2, "rsqrt_grad": 3, "div_rhs_grad": 4,
    "sgd": 2, "adam_m": 3, "adam_v": 4, "adam_update": 5, "dropout_mask": 35,
    "shift": 1, "erf": 0, "erf_grad": 4, "stop_gradient": 0, "maximum": 1, "maximum_grad": 5,
    "ne": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2, "where": 2, "where_grad_true": 2, "where_grad_false": 2,
    "pow": 0, "pow_grad": 0,  # per exponent: integer_pow_flops
}
"""FLOPs per output element of each elementwise function, as XLA's cost
analysis counts the backend's lowering (:mod:`layoutsearch.backend.program`):
one per arithmetic HLO instruction (add, multiply, compare, select, convert,
...); transcendentals (exp, log, tanh, logistic, sqrt, rsqrt, power) are
counted apart by XLA and not here; constant sub-expressions are folded (e.g.
Adam's bias corrections). ``gelu`` is the tanh approximation. ``dropout_mask``:
34 for ``jax.random.bernoulli`` (threefry bits, their conversion to a uniform
float, the comparison; XLA:CPU's lowering of threefry is a rolled loop whose
body the cost analysis counts once, where the loop runs 5 times) and 1 for
the select of the scaled value; XLA also counts 7 FLOPs per op that do not
scale with its size (the loop counter and key schedule), which the table
leaves out. JAX lowers threefry unrolled for GPUs and TPUs: 121 FLOPs per
element there (as XLA counts it)."""

FORWARD_SHARED_FLOPS: dict[str, float] = {"gelu_grad": 7, "silu_grad": 3, "sigmoid_grad": 3}
"""FLOPs per element of ``fn_grad(x, dy)`` that XLA shares (CSE) with the forward
``fn(x)`` when the graph computes it too (the derivative re-evaluates part of
the function, e.g. gelu's ``tanh`` argument)."""

NORM_ALL_REDUCES = {"softmax": 2, "softmax_grad": 1, "layer_norm": 2, "layer_norm_grad": 4,
                    "cross_entropy": 3, "cross_entropy_grad": 2}
"""Per-row statistics all-reduced by a normalization whose dim is split (max and
sum for softmax; mean and variance for layer norm; ...), matching the backend."""

RMS_NORM_ALL_REDUCES = {"layer_norm": 1, "layer_norm_grad": 2}
"""The same for RMSNorm (a layer norm with ``center=False``): the mean square;
the gradient, the mean square and ``mean(dy * xhat)``."""


def integer_pow_flops(op: O.Elementwise) -> float:
    """FLOPs per element of ``pow``/``pow_grad`` with an integer exponent ``n``: JAX's ``integer_pow``
    multiplies by repeated squaring (``floor(log2 |n|) + popcount(|n|) - 1`` products, one more division
    when ``n < 0``); the gradient ``n * x ** (n - 1) * dy`` two products more. Other exponents lower to
    ``pow``, a transcendental XLA counts apart (0 here, like ``exp``)."""
    if op.fn not in ("pow", "pow_grad"):
        return 0
    n = op.param["exponent"] - (1 if op.fn == "pow_grad" else 0)
    extra = 2 if op.fn == "pow_grad" else 0
    if not float(n).is_integer():
        return extra
    m = abs(int(n))
    products = 0 if m <= 1 else m.bit_length() - 1 + bin(m).count("1") - 1
    return products + (1 if n < 0 else 0) + extra


def norm_all_reduces(op: O.Op) -> int:
    """Per-row statistics ``op`` all-reduces when its normalized dim is split."""
    if isinstance(op, (O.LayerNorm, O.LayerNormGrad)) and not op.center:
        return RMS_NORM_ALL_REDUCES[op.kind]
    return NORM_ALL_REDUCES[op.kind]


def op_flops(graph: Graph, op: O.Op, sizes: dict[str, int] | None = None, *, split: frozenset[str] = frozenset(),
             constant: frozenset[str] = frozenset(), forward_shared: bool = False) -> float:
    """FLOPs of ``op`` (multiply-add = 2) as XLA's cost analysis counts the
    backend's lowering, with the dims sized ``sizes`` (default: the graph's,
    i.e. the global op; per device: the local sizes under a computation layout).

    ``split``: dims of the op split over mesh axes; ``constant``: tensors XLA
    folds to constants (their ops cost nothing); ``forward_shared``: the graph
    also computes the forward function of a ``*_grad`` elementwise op on the
    same input (see :data:`FORWARD_SHARED_FLOPS`). Per op, with ``N`` the
    elements of the iteration space and ``R = N / size(dim)`` its rows:

    * einsum: ``2 N`` per product (one input: ``N - out`` if it reduces);
    * elementwise: :data:`ELEMENTWISE_FLOPS` per output element, plus one per
      element of each operand of another dtype (its convert);
    * reduce: sum/max ``N - out``, mean ``N``;
    * softmax ``4N - R`` (max, subtract, sum, one divide per row, multiply);
      softmax_grad ``4N - R``; layer_norm ``5N + R``; layer_norm_grad ``7N``
      (the normalized input is shared with the forward); RMSNorm (layer_norm
      with ``center`` False) ``3N + R``, its gradient ``5N``; cross_entropy
      ``8N - R`` (one-hot compare and convert, log-softmax, select, sum,
      negate); cross_entropy_grad ``2N`` (log-softmax and one-hot shared with
      the forward), ``5N - R`` when ``dim`` is split (the log-softmax is
      recomputed);
    * gather: 3 per id (wrapping negative ids: compare, add, select); with
      ``dim`` split, 8 per id (the local range: offset, compare, clamp, ...)
      plus one select per output element (rows of other devices are zeros);
      scatter-add: one add per update element (plus the id offset per id when
      ``dim`` is split);
    * reshape: 0.

    All-reduces add one FLOP per element reduced; :class:`OpRules` adds them.
    """
    t = graph.tensors
    sz = sizes if sizes is not None else graph.dims
    count = lambda name: math.prod(sz[d] for d in t[name].dim_names)
    space = math.prod(sz[d] for d in op.iteration_dims(t))
    if op.output in constant:
        return 0.0
    if isinstance(op, O.Einsum):
        if len(op.inputs) == 1:
            return float(space - count(op.output) if op.reduced_dims(t) else 0)
        return 2.0 * (len(op.inputs) - 1) * space
    if isinstance(op, O.Elementwise):
        per = ELEMENTWISE_FLOPS[op.fn] + integer_pow_flops(op)
        if op.fn == "square_grad" and op.inputs[1] in constant:
            per = 1  # 2 * x * c: the constant factors fold
        elif (op.fn, op.param.get("lr", op.param.get("factor"))) in (("sgd", 1.0), ("scale", 1.0)):
            per -= 1  # multiplying by 1 folds away
        if forward_shared:
            per -= FORWARD_SHARED_FLOPS.get(op.fn, 0)
        # an operand of another dtype than the result is converted first (one FLOP per element, as XLA counts
        # a convert); fill and dropout_mask read only their operand's shape
        out_dtype = t[op.output].dtype
        converts = 0 if op.fn == "fill" or O.is_dropout_mask(op) else sum(
            count(i) for i in op.inputs if t[i].dtype != out_dtype)
        return per * float(count(op.output)) + converts
    if isinstance(op, O.Reduce):
        n_in = count(op.inputs[0])
        return float(n_in if op.fn == "mean" else n_in - count(op.output))
    if isinstance(op, (O.Softmax, O.SoftmaxGrad, O.LayerNorm, O.LayerNormGrad, O.CrossEntropy,
                       O.CrossEntropyGrad)):
        n, rows = space, space // sz[op.dim]
        if isinstance(op, (O.Softmax, O.SoftmaxGrad)):
            return float(4 * n - rows)
        if isinstance(op, O.LayerNorm):
            return float((5 if op.center else 3) * n + rows)
        if isinstance(op, O.LayerNormGrad):
            return float((7 if op.center else 5) * n)
        if isinstance(op, O.CrossEntropy):
            return float(8 * n - rows)
        return float(5 * n - rows if op.dim in split else 2 * n)
    if isinstance(op, O.Gather):
        ids = count(op.inputs[1])
        return float(8 * ids + count(op.output) if op.dim in split else 3 * ids)
    if isinstance(op, O.ScatterAdd):
        return float(count(op.inputs[1]) + (count(op.inputs[0]) if op.dim in split else 0))
    return 0.0  # reshape: data movement only


SMALL_CONTRACTION = 8
"""An einsum contracting at most this many elements per output element (a 2 x 2 rotation, a gate) is vector
work, not a matmul: compilers lower it as multiplies and adds fused with its neighbours (XLA's dot strength
reduction; a fused rotary-embedding kernel), not as a tensor-core / MXU matmul."""


def is_matmul(op: O.Op, tensors: Mapping[str, Tensor]) -> bool:
    """Whether ``op`` runs as a matmul: an einsum of two or more operands contracting more than
    :data:`SMALL_CONTRACTION` elements (global sizes)."""
    if not isinstance(op, O.Einsum) or len(op.inputs) < 2:
        return False
    sizes = {d.name: d.size for x in op.inputs for d in tensors[x].dims}
    return math.prod(sizes[d] for d in op.reduced_dims(tensors)) > SMALL_CONTRACTION


def constant_tensors(graph: Graph) -> frozenset[str]:
    """Tensors XLA computes at compile time: ``fill`` outputs and elementwise
    ops or reshapes of constants only (e.g. the loss seed and its scaling)."""
    const: set[str] = set()
    for op in graph.ops:
        if isinstance(op, O.Elementwise) and op.fn == "fill" or (
                isinstance(op, (O.Elementwise, O.Reshape)) and all(i in const for i in op.inputs)):
            const.add(op.output)
    return frozenset(const)


@dataclass(frozen=True)
class Comm:
    """One collective an op causes: payload per device per execution (see
    :mod:`layoutsearch.costmodel.collectives` for the byte conventions)."""

    kind: str
    axes: Axes
    bytes: int
    tensor: str
    cause: str
    shared: tuple | None = None
    """Identity of a collective several ops need (the same reshard of the same
    tensor): XLA computes it once per step (CSE). See :meth:`OpRules.step_costs`."""


@dataclass(frozen=True)
class OpCost:
    """Per-device work of one op under a layout.

    ``hbm_bytes``: bytes read and written in HBM (inputs as the op consumes them,
    its output as it produces it; a fusion model may lower it, see
    :mod:`layoutsearch.costmodel.fusion`); ``reads``: the bytes of each input,
    ``write``: of the output. ``dtype``: the dtype the op computes in (its first
    float input's); ``matmul_dims``: an einsum of two operands as a batched
    matmul ``(batch, m, n, k)`` at the local sizes (see
    :func:`layoutsearch.costmodel.compute.matmul_efficiency`)."""

    op: str
    kind: str
    phase: str
    block: str | None
    flops: float
    hbm_bytes: float
    matmul: bool
    comms: tuple[Comm, ...]
    reads: tuple[int, ...] = ()
    write: int = 0
    dtype: str = "float32"
    matmul_dims: tuple[int, int, int, int] | None = None


def on_mesh(comms: Sequence[Comm], mesh: Mesh) -> list[Comm]:
    """``comms`` as the devices run them: a collective's axes in mesh order (its groups of devices are the same
    whatever order the rule split a dim in: ``heads:b+a`` all-reduces over ``a+b``), axes of size 1 left out, and
    a collective over a group of one device (only axes of size 1) dropped: there is nothing to exchange, and XLA
    emits nothing."""
    out = []
    for c in comms:
        axes = tuple(a for a in mesh.names if a in c.axes and mesh.axis_size(a) > 1)
        if axes:
            out.append(c if axes == c.axes else dataclasses.replace(c, axes=axes))
    return out


def local_bytes(tensor: Tensor, lay: DimLayout, mesh: Mesh) -> int:
    """Per-device bytes of ``tensor`` laid out as ``lay``."""
    n = tensor.nbytes
    for d, axes in lay.items():
        if d in tensor.dim_names:
            n //= mesh.group_size(axes)
    return n


def restrict(lay: DimLayout, dims: Sequence[str]) -> DimLayout:
    """The part of a layout that concerns ``dims``."""
    return {d: lay[d] for d in dims if lay.get(d)}


def reshard(tensor: Tensor, src: DimLayout, dst: DimLayout, mesh: Mesh, cause: str) -> list[Comm]:
    """Collectives turning ``tensor`` laid out as ``src`` into ``dst``.

    Axes moving to another dim: one all-to-all (payload: the local bytes);
    axes dropped: one all-gather (payload: the local bytes after it); axes
    added: a free local slice; blocks that only move between devices: one
    collective-permute (:func:`_permute`)."""
    permute = _permute(tensor, src, dst, mesh, cause)
    if permute is not None:
        return [permute]
    where_src = {a: d for d, axes in src.items() for a in axes}
    where_dst = {a: d for d, axes in dst.items() for a in axes}
    moved = tuple(a for a in mesh.names if a in where_src and a in where_dst and where_src[a] != where_dst[a])
    dropped = tuple(a for a in mesh.names if a in where_src and a not in where_dst)
    out: list[Comm] = []
    cur = dict(src)
    if moved:
        out.append(Comm("all-to-all", moved, local_bytes(tensor, cur, mesh), tensor.name,
                        f"{cause}: {', '.join(f'{a} from {where_src[a]} to {where_dst[a]}' for a in moved)}"))
        cur = {d: tuple(a for a in axes if a not in moved) for d, axes in cur.items()}
        for a in moved:
            cur[where_dst[a]] = (*cur.get(where_dst[a], ()), a)
    if dropped:
        cur = {d: tuple(a for a in axes if a not in dropped) for d, axes in cur.items()}
        out.append(Comm("all-gather", dropped, local_bytes(tensor, cur, mesh), tensor.name,
                        f"{cause}: {', '.join(f'{where_src[a]} unsplit over {a}' for a in dropped)}"))
    return out


def _permute(tensor: Tensor, src: DimLayout, dst: DimLayout, mesh: Mesh, cause: str) -> Comm | None:
    """The one collective-permute XLA reshards ``src`` into ``dst`` with when every device's new block lies
    within a block some device holds (on every dim the new split is at least as fine as the old one: its number
    of pieces a multiple of the old number), but not within its own (some dim's old axes are no major prefix of
    its new axes, e.g. ``d:a`` to ``d:c``, or ``d:a,e:b`` to ``d:b,e:a``): each device receives its new block
    (payload: the new local bytes) over the axes of the dims that change; None otherwise."""
    axes: set[str] = set()
    for d in tensor.dim_names:
        old = tuple(a for a in src.get(d, ()) if mesh.axis_size(a) > 1)
        new = tuple(a for a in dst.get(d, ()) if mesh.axis_size(a) > 1)
        if mesh.group_size(new) % mesh.group_size(old):
            return None
        if old and new[:len(old)] != old:
            axes.update(old + new)
    if not axes:
        return None
    return Comm("collective-permute", tuple(a for a in mesh.names if a in axes), local_bytes(tensor, dst, mesh),
                tensor.name, f"{cause}: blocks move between devices ({_fmt(src)} to {_fmt(dst)})")


def _slice(after: DimLayout, stored: DimLayout, axes: Sequence[str], kept: Mapping[str, str]) -> None:
    """``after`` split over ``axes`` too, each on the dim ``kept`` names, in the order of ``stored`` (a
    reduce-scatter or an all-reduce and slice leaves any arrangement of the blocks: the stored one, with the
    stored dim's axes that split nothing yet sliced too: the result is whole over them)."""
    for d in {kept[a] for a in axes}:
        used = {a for x, ax in after.items() if x != d for a in ax}
        have = set(after.get(d, ())) | {a for a in axes if kept[a] == d} | (set(stored.get(d, ())) - used)
        after[d] = tuple(a for a in stored.get(d, ()) if a in have) + tuple(
            a for a in after.get(d, ()) if a not in stored.get(d, ()))


def _partial_sums(out: Tensor, produced: DimLayout, partial: Sequence[tuple[str, Axes]], stored: DimLayout,
                  mesh: Mesh, reduce_scatter: bool, cause: str, kept_first: bool = False) -> tuple[list[Comm], DimLayout]:
    """Collectives finishing the partial sums of the reduced dims split over
    axes (``partial``: (dim, axes) pairs); returns them and the layout after.

    One all-reduce per reduced dim (XLA finishes the partial sums of each split
    contracted dim separately: ``w[io,h]`` contracted over ``batch`` on ``data``
    and ``seq`` on ``seq`` is all-reduced over ``seq``, then over ``data``).
    With ``reduce_scatter``, the axes the stored output keeps split are first
    reduce-scattered (one collective), and each dim's remaining axes all-reduced. Without it, ``kept_first``
    (an einsum: XLA's dot partitioner): the axes that the stored output keeps split, of every reduced dim, are
    all-reduced first (one collective), the result sliced, and each dim's other axes all-reduced."""
    if not partial:
        return [], produced
    axes_all = tuple(a for _, axes in partial for a in axes)
    kept = {a: d for d, axes in stored.items() for a in axes if a in axes_all and a not in produced.get(d, ())}
    rs = tuple(a for a in mesh.names if a in kept and a in axes_all) if reduce_scatter else ()
    comms: list[Comm] = []
    after = dict(produced)
    if rs:
        comms.append(Comm("reduce-scatter", rs, local_bytes(out, after, mesh), out.name,
                          f"{cause}; output keeps {', '.join(f'{kept[a]} split over {a}' for a in rs)}"))
        _slice(after, stored, rs, kept)
    first = tuple(a for a in mesh.names if a in kept and a in axes_all) if kept_first and not reduce_scatter else ()
    if first:
        # without reduce-scatter, XLA's dot partitioner all-reduces over the axes the stored output keeps split
        # (of every reduced dim at once), slices, and all-reduces the slice over each dim's other axes (hybrid
        # FSDP: the gradient over fsdp, then half of it over data, rather than all of it over both)
        comms.append(Comm("all-reduce", first, local_bytes(out, after, mesh), out.name,
                          f"{cause} (over {'+'.join(first)}, kept split)"))
        _slice(after, stored, first, kept)
    for d, axes in partial:
        ar = tuple(a for a in axes if a not in rs and a not in first)
        if ar:
            comms.append(Comm("all-reduce", ar, local_bytes(out, after, mesh), out.name,
                              f"{cause} ({d} over {'+'.join(ar)})"))
    return comms, after


def _reshape_layout(op: O.Reshape, src: DimLayout, graph: Graph, mesh: Mesh) -> tuple[DimLayout, DimLayout]:
    """The layout a reshape produces from ``src`` without communication, and
    the input layout it needs for that.

    Per group, only the major input dim may stay split: its axes pass to the
    major output dim when they divide it (a split ``d_model`` -> ``heads`` x
    ``d_kv`` keeps ``heads`` split); axes on minor input dims, or that do not
    divide the major output dim, are gathered first."""
    need = dict(src)
    out: DimLayout = {}
    grouped: set[str] = set()
    for ins, outs in op.groups:
        grouped.update(ins)
        for d in ins[1:]:
            need.pop(d, None)
        axes = src.get(ins[0], ())
        if axes and graph.dims[outs[0]] % mesh.group_size(axes) == 0:
            out[outs[0]] = axes
        else:
            need.pop(ins[0], None)
    for d, axes in src.items():
        if d not in grouped:
            out[d] = axes
    return out, need


def _reshape_target(op: O.Reshape, src: DimLayout, need: DimLayout, output: DimLayout,
                    in_dims: Sequence[str]) -> DimLayout:
    """``need`` (the input layout a reshape can run on locally) with the axes it drops from ``src`` moved to the
    dims the reshape passes through (in neither of its groups) where the stored ``output`` splits them: XLA moves
    such an axis with one all-to-all before the reshape, instead of gathering it and slicing the output again."""
    grouped = {d for ins, _ in op.groups for d in ins}
    used = {a for axes in need.values() for a in axes}
    held = {a for axes in src.values() for a in axes}
    dropped = held - used
    target = dict(need)
    for d, axes in output.items():
        if (axes and d in in_dims and d not in grouped and not target.get(d) and used.isdisjoint(axes)
                and dropped & set(axes) and set(axes) <= dropped | (set(axes) - held)):
            target[d] = axes
            used.update(axes)
    return target


class OpRules:
    """Evaluates op costs on one graph and mesh; layouts are given per call."""

    def __init__(self, graph: Graph, mesh: Mesh, reduce_scatter: bool = True,
                 float32_collectives: bool = False, regather_weights: bool = False) -> None:
        self.graph = graph
        self.mesh = mesh
        self.reduce_scatter = reduce_scatter
        self.float32_collectives = float32_collectives
        self.regather_weights = regather_weights
        self.constant = constant_tensors(graph)
        self.matmuls = frozenset(op.name for op in graph.ops if is_matmul(op, graph.tensors))
        fwd = {(op.fn, op.inputs[0]) for op in graph.ops if isinstance(op, O.Elementwise) and len(op.inputs) == 1}
        self.forward_shared = frozenset(
            op.name for op in graph.ops if isinstance(op, O.Elementwise)
            and any((f, op.inputs[0]) in fwd for f, g in O.UNARY_GRAD.items() if g == op.fn))

    def promoted(self, comms: Sequence[Comm]) -> list[Comm]:
        """``comms`` as the backend runs them (:func:`on_mesh`; with ``float32_collectives``, a collective of
        a bf16/fp16 tensor moves 4 bytes per element: the backend converts around it)."""
        comms = on_mesh(comms, self.mesh)
        if not self.float32_collectives:
            return comms
        t = self.graph.tensors
        return [dataclasses.replace(c, bytes=c.bytes * 4 // t[c.tensor].itemsize)
                if t[c.tensor].is_float and t[c.tensor].itemsize < 4 else c for c in comms]

    def reshard(self, tensor: Tensor, src: DimLayout, dst: DimLayout, cause: str) -> list[Comm]:
        """:func:`reshard` as the backend runs it (see :meth:`promoted`)."""
        return self.promoted(reshard(tensor, src, dst, self.mesh, cause))

    def iteration_layout(self, op: O.Op, layout: Layout) -> DimLayout:
        """The computation layout the global rules give ``op``."""
        return layout.rules_layout(op.iteration_dims(self.graph.tensors))

    def cost(self, op: O.Op, iteration: DimLayout, inputs: Sequence[DimLayout], output: DimLayout) -> OpCost:
        """Cost of ``op`` run with computation layout ``iteration``, its inputs
        stored as ``inputs`` and its output to be stored as ``output``.

        A gather or scatter-add may run in another computation layout than
        ``iteration``: XLA's partitioner also considers keeping the table
        (operand) as it is stored ("operand passthrough": the ids are gathered,
        the result resharded), for a scatter-add its updates as stored, for a
        gather with split ids the ids' layout ("index passthrough": the table
        all-gathered, each device looking up its own ids), and takes the
        cheaper; so does this rule (fewer bytes moved; ties keep
        ``iteration``, then the table's layout), except that a table stored
        split over other dims than ``dim`` (and not over ``dim``) always runs as
        stored (XLA tries operand passthrough first)."""
        if isinstance(op, (O.Gather, O.ScatterAdd)):
            table = output if isinstance(op, O.ScatterAdd) else inputs[0]
            split = {d for d, axes in table.items() if self.mesh.group_size(axes) > 1}
            if split and op.dim not in split:
                # the table split only over dims the ids do not index: XLA's partitioner tries operand passthrough
                # first and takes it whatever the bytes
                return self._cost(op, self._passthrough(op, inputs, output), inputs, output)
            best = None
            candidates = [iteration, self._passthrough(op, inputs, output)]
            if isinstance(op, O.ScatterAdd):
                candidates.append(self._updates_passthrough(op, inputs))
            elif any(self.mesh.group_size(axes) > 1 for axes in inputs[1].values()):
                # "index passthrough": split like the ids, the table gathered whole
                candidates.append({d: axes for d, axes in inputs[1].items() if axes})
            for it in candidates:
                c = self._cost(op, it, inputs, output)
                if best is None or sum(x.bytes for x in c.comms) < sum(x.bytes for x in best.comms):
                    best = c
            assert best is not None
            return best
        return self._cost(op, iteration, inputs, output)

    def _passthrough(self, op: O.Op, inputs: Sequence[DimLayout], output: DimLayout) -> DimLayout:
        """The computation layout keeping a gather's table (a scatter-add's
        output table) as stored, plus the ids' splits on axes still free (of
        an ids dim split over several axes, the major ones up to the first
        axis the table uses: ``batch`` over data+fsdp with the table split
        over fsdp stays split over data)."""
        t = self.graph.tensors
        table, ids = (output, inputs[0]) if isinstance(op, O.ScatterAdd) else (inputs[0], inputs[1])
        it = dict(table)
        used = {a for axes in it.values() for a in axes}
        for d, axes in ids.items():
            free = axes[:next((i for i, a in enumerate(axes) if a in used), len(axes))]
            if free and d not in it:
                it[d] = free
                used.update(free)
        dims = op.iteration_dims(t)
        return {d: it[d] for d in dims if it.get(d)}

    def _updates_passthrough(self, op: O.Op, inputs: Sequence[DimLayout]) -> DimLayout:
        """The computation layout keeping a scatter-add's updates as stored (their ids dims and the table's
        other dims; the scattered dim unsplit). The table a scatter-add adds into starts as zeros, which XLA's
        partitioner lays out as the updates need: it scatters there and then moves the result to the table's
        layout (e.g. one all-to-all) rather than gathering the updates."""
        return {d: axes for d, axes in inputs[1].items() if axes and d != op.dim}

    def _cost(self, op: O.Op, iteration: DimLayout, inputs: Sequence[DimLayout], output: DimLayout) -> OpCost:
        g, mesh = self.graph, self.mesh
        t = g.tensors
        out = t[op.output]
        comms: list[Comm] = []
        if isinstance(op, O.Reshape):
            src = inputs[0]
            produced, need = _reshape_layout(op, src, g, mesh)
            need = _reshape_target(op, src, need, output, t[op.inputs[0]].dim_names)
            produced, need = _reshape_layout(op, need, g, mesh)
            comms += reshard(t[op.inputs[0]], src, need, mesh, f"reshape {op.name} input")
            comms += reshard(out, produced, output, mesh, f"{op.output} stored differently")
            moved = local_bytes(out, produced, mesh)
            return OpCost(op.name, op.kind, op.phase, op.block, 0.0, 2.0 * moved, False,
                          tuple(self.promoted(comms)), (moved,), moved, out.dtype)
        space = op.iteration_dims(t)
        reads: list[int] = []
        for name, stored in zip(op.inputs, inputs, strict=True):
            if O.is_dropout_mask(op):  # the RNG takes only x's shape
                reads.append(0)
                continue
            want = restrict(iteration, t[name].dim_names)
            more = reshard(t[name], stored, want, mesh, f"{op.name} needs {name} as {_fmt(want)}")
            if isinstance(op, O.Einsum):  # the same operand reshard feeding several dots: XLA does it once
                key = ("reshard", name, _key(stored), _key(want))
                if self.regather_weights:  # ... once per phase: not kept from the forward to the backward pass
                    key += (op.phase,)
                more = [dataclasses.replace(c, shared=key + (i,)) for i, c in enumerate(more)]
            comms += more
            reads.append(local_bytes(t[name], want, mesh))
        sizes = {d: g.dims[d] // mesh.group_size(iteration.get(d, ())) for d in space}
        flops = op_flops(g, op, sizes, split=frozenset(d for d in space if iteration.get(d)),
                         constant=self.constant, forward_shared=op.name in self.forward_shared)
        produced = restrict(iteration, out.dim_names)
        norm_dim = getattr(op, "dim", None)
        if op.kind in NORM_ALL_REDUCES and iteration.get(norm_dim):
            axes = iteration[norm_dim]
            rows = t[op.inputs[0]]
            row_bytes = local_bytes(rows, restrict(iteration, rows.dim_names), mesh) // (
                g.dims[norm_dim] // mesh.group_size(axes))
            for i in range(norm_all_reduces(op)):
                comms.append(Comm("all-reduce", axes, row_bytes, op.output,
                                  f"{op.kind} over {norm_dim} split over {'+'.join(axes)} (statistic {i + 1})"))
        if isinstance(op, (O.Einsum, O.Reduce, O.ScatterAdd, O.Gather)):
            reduced = [d for d in space if d not in out.dim_names and iteration.get(d)]
            what = "contracted" if isinstance(op, O.Einsum) else "reduced"
            cause = f"{op.name}: {what} {', '.join(reduced)} split over " \
                    f"{'+'.join(a for d in reduced for a in iteration[d])}"
            more, produced = _partial_sums(out, produced, [(d, iteration[d]) for d in reduced], output, mesh,
                                           self.reduce_scatter, cause, kept_first=isinstance(op, O.Einsum))
            comms += more
        comms += reshard(out, produced, output, mesh, f"{op.output} stored as {_fmt(output)}")
        write = local_bytes(out, produced, mesh)
        comms = on_mesh(comms, mesh)
        # XLA counts one FLOP per element an all-reduce (or reduce-scatter) sums
        flops += sum(c.bytes // t[c.tensor].itemsize for c in comms if c.kind in ("all-reduce", "reduce-scatter"))
        comms = self.promoted(comms)
        dtype = next((t[i].dtype for i in op.inputs if t[i].is_float), out.dtype)
        matmul = op.name in self.matmuls
        mm = _matmul_dims(op, t, sizes) if matmul else None
        return OpCost(op.name, op.kind, op.phase, op.block, flops, float(sum(reads) + write), matmul, tuple(comms),
                      tuple(reads), write, dtype, mm)

    def cost_under(self, op: O.Op, layout: Layout) -> OpCost:
        """Cost of ``op`` when ``layout`` lays out every tensor and computation."""
        t = self.graph.tensors
        return self.cost(op, self.iteration_layout(op, layout), [layout.dim_layout(t[i]) for i in op.inputs],
                         layout.dim_layout(t[op.output]))

    def step_costs(self, layout: Layout) -> list[OpCost]:
        """:meth:`cost_under` of every op of the graph, in order, with each
        shared collective (see :attr:`Comm.shared`) kept by its first op only:
        the sum over ops is then the step's communication."""
        return dedupe_shared([self.cost_under(op, layout)
                              for op in self.graph.ops])


def dedupe_shared(costs: Sequence[OpCost]) -> list[OpCost]:
    """``costs`` (one step, in op order) with every repeat of a shared collective dropped."""
    seen: set[tuple] = set()
    out = []
    for c in costs:
        keep = []
        for x in c.comms:
            if x.shared is not None:
                if x.shared in seen:
                    continue
                seen.add(x.shared)
            keep.append(x)
        out.append(c if len(keep) == len(c.comms) else dataclasses.replace(c, comms=tuple(keep)))
    return out


def _matmul_dims(op: O.Einsum, t: Mapping[str, Tensor], sizes: Mapping[str, int]) -> tuple[int, int, int, int] | None:
    """A two-operand einsum as a batched matmul ``(batch, m, n, k)`` at the local sizes: batch dims are in
    both operands and the output, m (n) in the first (second) operand and the output, k contracted."""
    if len(op.inputs) != 2:
        return None
    a, b = (set(t[i].dim_names) for i in op.inputs)
    out = set(t[op.output].dim_names)
    size = lambda dims: math.prod(sizes[d] for d in dims)  # noqa: E731
    return (size(a & b & out), size((a - b) & out), size((b - a) & out), size((a & b) - out))


def _key(lay: DimLayout) -> tuple[tuple[str, Axes], ...]:
    return tuple(sorted((d, a) for d, a in lay.items() if a))


def _fmt(lay: DimLayout) -> str:
    return "{" + ",".join(f"{d}:{'+'.join(a)}" for d, a in lay.items()) + "}" if lay else "replicated"
