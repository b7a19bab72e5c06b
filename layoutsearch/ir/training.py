"""Derivation of the training step: forward graph -> forward + backward + optimizer graph.

Reverse-mode differentiation over named dims (the Mesh-TensorFlow way): every
gradient rule is itself an op of the IR, so the cost model, the solvers and
the backend see the backward pass and the optimizer exactly as they see the
forward pass. The gradient of an einsum is einsums, so data-parallel gradient
all-reduces and model-parallel activation all-reduces come from one rule.

Conventions (other modules rely on them):

* ``grad/T`` is the gradient of tensor ``T``: same dims (same order) and dtype
  as ``T``, role ``gradient``. It exists for every parameter and for every
  float tensor on a path from a parameter to the loss. Every tensor written by
  a backward op has role ``gradient`` (helpers included).
* The seed is ``grad/<loss> = fill(<loss>, value=1)`` (the elementwise ``fill``
  writes a constant; its input only orders it after the forward pass). A
  parameter the loss does not depend on gets ``grad/P = fill(P, value=0)``.
* A tensor with one gradient contribution gets it written straight to
  ``grad/T``; with several, each contribution ``grad/<op>/<i>`` (from input
  ``i`` of forward op ``<op>``) is summed by a chain of adds
  ``grad/T/add<k>`` in reverse topological order of the consumers, the last
  one writing ``grad/T``. Helpers are ``grad/<op>/<i>/<what>`` or
  ``grad/<op>/<what>``. Every derived op is named after the tensor it writes.
* Backward ops have phase ``backward`` and the ``block`` of the forward op
  they differentiate (a sum chain: the block of ``T``'s producer, or of its
  first consumer for a parameter).
* SGD: ``new/P = sgd(P, grad/P)``. Adam: state ``adam_m/P`` and ``adam_v/P``
  (role ``optimizer_state``, P's dims, the policy's optimizer-state dtype,
  float32 without a policy), ``new/adam_m/P``, ``new/adam_v/P`` (role
  ``optimizer_state``) and ``new/P = adam_update(P, new/adam_m/P,
  new/adam_v/P)`` (role ``parameter``); each ``new/X`` has ``updates="X"``.
  Optimizer ops have phase ``optimizer`` and the block of the parameter's
  first consumer.
* Master weights (a precision policy with ``master``, e.g. ``mixed``): the
  optimizer updates ``master/P`` (role ``optimizer_state``, the master dtype;
  fed in, initialized to P's values) instead of P: ``new/master/P =
  sgd|adam_update(master/P, ...)``, then ``new/P = identity(new/master/P)``
  casts the result to P's dtype.
* ``meta["training"] = {"optimizer": {...}}`` records the optimizer; with a
  precision policy also ``"precision": name`` and ``"master_weights": {P:
  "master/P", ...}`` (empty without master weights).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from layoutsearch.errors import GraphError
from layoutsearch.ir import ops as O
from layoutsearch.ir.dims import Shape
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import ADAM_M, ADAM_V, MASTER, grad_name, is_grad_sum, new_name, state_name
from layoutsearch.ir.precision import Precision, with_precision
from layoutsearch.ir.tensor import Tensor

OPTIMIZERS = ("sgd", "adam")


_NO_GRAD_FNS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "stop_gradient", "fill", "dropout_mask"})
"""Elementwise functions whose derivative is zero (almost) everywhere: gradients stop there."""


@dataclass(frozen=True)
class Optimizer:
    """An optimizer and its hyper-parameters (``b1``, ``b2``, ``eps``, ``step`` are Adam's).

    ``step`` is the 1-based step number used by Adam's bias correction.
    """

    kind: str = "adam"
    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    step: int = 1

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise GraphError(f"unknown optimizer {self.kind!r} (known: {', '.join(OPTIMIZERS)})")
        if not self.lr > 0:
            raise GraphError(f"optimizer learning rate must be positive, got {self.lr!r}")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            raise GraphError(f"Adam's b1 and b2 must be in [0, 1), got {self.b1!r} and {self.b2!r}")
        if not self.eps >= 0:
            raise GraphError(f"Adam's eps must be non-negative, got {self.eps!r}")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1:
            raise GraphError(f"Adam's step must be an integer >= 1, got {self.step!r}")

    @classmethod
    def of(cls, spec: Optimizer | str) -> Optimizer:
        """``spec`` itself, or the optimizer named ``spec`` with default hyper-parameters."""
        return spec if isinstance(spec, Optimizer) else cls(kind=spec)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready hyper-parameters (SGD: kind and lr only)."""
        return {"kind": self.kind, "lr": self.lr} if self.kind == "sgd" else asdict(self)


def training_graph(forward: Graph, optimizer: Optimizer | str = "adam",
                   precision: Precision | str | None = None) -> Graph:
    """The training step of ``forward``: its ops, the backward ops computing
    ``grad/T`` of the loss for every parameter (and every intermediate on the
    way), and the optimizer ops writing ``new/P`` (see the module docstring).

    ``precision``: a policy (:mod:`layoutsearch.ir.precision`) typing every
    float tensor and adding master weights; None keeps the forward graph's
    dtypes (optimizer state float32, no master weights).

    Raises GraphError if ``forward`` has no loss, already has backward or
    optimizer ops, or differentiates through a function without a gradient rule.
    """
    opt = Optimizer.of(optimizer)
    if forward.loss is None:
        raise GraphError(f"graph {forward.name!r} has no loss: a graph file names it (\"loss\": TENSOR, a scalar "
                         "tensor); in Python, builder.build(loss)")
    derived = [op.name for op in forward.ops if op.phase != "forward"]
    derived += [t.name for t in forward.tensors.values() if t.role in ("gradient", "optimizer_state")]
    if derived:
        raise GraphError(f"graph {forward.name!r} is already a training graph (has {derived[0]!r}); "
                         "pass its forward graph")
    policy = Precision.of(precision) if precision is not None else None
    if policy is not None:
        forward = with_precision(forward, policy)
    d = _Derivation(forward)
    d.backward()
    masters = d.optimize(opt, policy)
    meta = copy.deepcopy(forward.meta)
    meta["training"] = {"optimizer": opt.to_dict()}
    if policy is not None:
        meta["training"].update(precision=policy.name, master_weights=masters)
    tensors = list(d.tensors.values())
    if policy is not None and policy.grads is not None:  # parameter gradients in their own dtype
        producer = {op.output: op for op in d.ops}
        params = [t for t in tensors if t.role == "parameter" and t.name not in producer]
        wide = _gradient_chains(params, d.tensors, producer.get)
        tensors = [Tensor(t.name, t.dims, policy.grads, t.role, t.updates) if t.name in wide else t for t in tensors]
    return Graph(forward.name, tensors, d.ops, loss=forward.loss, meta=meta)


def resized_training_graph(train: Graph, forward: Graph, sizes: Mapping[str, int]) -> Graph | None:
    """:func:`training_graph` of ``forward.with_sizes(sizes)`` (one micro-batch), from ``train``, the training
    graph of ``forward`` (any optimizer and precision), without deriving it again: the derivation reads the
    dims' sizes only in a mean's gradient, ``scale`` by 1 / the count of elements averaged, so it is
    ``train.with_sizes(sizes)`` with those factors recomputed. None when the resize changes which ops the
    derivation emits (a mean whose count was or becomes 1 passes its gradient on unscaled)."""
    small = forward.with_sizes(sizes)
    factors: dict[str, float] = {}
    for op in forward.ops:
        if not (isinstance(op, O.Reduce) and op.fn == "mean"):
            continue
        x, y = forward.tensors[op.inputs[0]], forward.tensors[op.output]
        n = _mean_count(small.tensors[x.name], small.tensors[y.name])
        if (n == 1) != (_mean_count(x, y) == 1):
            return None
        for name in (grad_name(x.name), grad_name(op.name, 0)):
            grad = train.producer(name) if name in train.tensors else None
            if isinstance(grad, O.Elementwise) and grad.fn == "scale" and grad.inputs == (grad_name(y.name),):
                factors[name] = 1.0 / n
    return train.with_sizes(sizes, [
        dataclasses.replace(op, params=tuple(sorted({**op.param, "factor": factors[op.name]}.items())))
        if op.name in factors else op for op in train.ops])


def _mean_count(x: Tensor, y: Tensor) -> int:
    """The number of elements of ``x`` a mean down to ``y`` averages."""
    return math.prod(d.size for d in x.dims if d.name not in y.dim_names)


def trained_parameters(graph: Graph) -> list[str]:
    """The parameters of forward ``graph`` the loss has a gradient for (a path of differentiable ops to it:
    not only through comparisons, ``stop_gradient`` or integer ids)."""
    needs = _Derivation(graph).needs
    return [p.name for p in graph.parameters if p.name in needs]


def parameter_gradients(graph: Graph) -> set[str]:
    """Tensors of training graph ``graph`` that are parameter gradients: ``grad/P`` of every
    parameter and the contributions its sum chain adds up."""
    return _gradient_chains(graph.parameters, graph.tensors, graph.producer)


def _gradient_chains(params: Iterable[Tensor], tensors: Mapping[str, Tensor],
                     producer: Callable[[str], O.Op | None]) -> set[str]:
    """:func:`parameter_gradients` of the parameters ``params`` among ``tensors`` (``producer``: a tensor's
    producing op, None for none)."""
    out: set[str] = set()
    for p in params:
        stack = [grad_name(p.name)]
        while stack:
            t = stack.pop()
            if t not in tensors or t in out:
                continue
            out.add(t)
            op = producer(t)
            if isinstance(op, O.Elementwise) and op.fn == "add" and op.phase == "backward" and is_grad_sum(t, p.name):
                stack.extend(op.inputs)
    return out


def _grad_inputs(op: O.Op, tensors: dict[str, Tensor]) -> tuple[int, ...]:
    """Indices of the inputs of ``op`` a gradient can flow to."""
    if isinstance(op, (O.Gather, O.CrossEntropy)):
        idx: Sequence[int] = (0,)
    elif isinstance(op, O.Elementwise) and op.fn in _NO_GRAD_FNS:
        idx = ()
    elif isinstance(op, O.Elementwise) and op.fn == "where":
        idx = (1, 2)  # not to the condition
    else:
        idx = range(len(op.inputs))
    return tuple(i for i in idx if tensors[op.inputs[i]].is_float)


class _Derivation:
    """Builds the backward and optimizer ops for one forward graph."""

    def __init__(self, forward: Graph) -> None:
        self.fwd = forward
        self.tensors: dict[str, Tensor] = dict(forward.tensors)
        self.ops: list[O.Op] = list(forward.ops)
        self.op_names = {op.name for op in forward.ops}
        self.needs = self._needs_grad()
        # how many contributions each tensor's gradient sums, and those made so far
        self.expected: dict[str, int] = {t: 0 for t in self.needs}
        for op in forward.ops:
            if op.output in self.needs:
                for i in _grad_inputs(op, self.tensors):
                    if op.inputs[i] in self.needs:
                        self.expected[op.inputs[i]] += 1
        self.contribs: dict[str, list[str]] = {t: [] for t in self.needs}

    def _needs_grad(self) -> set[str]:
        """Float tensors on a path from a parameter to the loss."""
        f, tensors = self.fwd, self.fwd.tensors
        depends = {t.name for t in f.parameters if t.is_float}
        for op in f.ops:
            if any(op.inputs[i] in depends for i in _grad_inputs(op, tensors)):
                depends.add(op.output)
        reaches = {f.loss}
        for op in reversed(f.ops):
            if op.output in reaches:
                reaches.update(op.inputs[i] for i in _grad_inputs(op, tensors))
        return depends & reaches

    # -- emitting ops
    def _emit(self, cls: type[O.Op], out: str, inputs: Sequence[str], dims: Shape, dtype: str,
              block: str | None, phase: str = "backward", role: str = "gradient", updates: str | None = None,
              **attrs: Any) -> str:
        if out in self.tensors or out in self.op_names:
            raise GraphError(f"cannot derive the training graph: the derived name {out!r} is already used "
                             "in the forward graph (rename that tensor or op)")
        self.tensors[out] = Tensor(out, dims, dtype, role, updates)
        self.op_names.add(out)
        self.ops.append(cls(name=out, inputs=tuple(inputs), output=out, phase=phase, block=block, **attrs))
        return out

    def _target(self, op: O.Op, i: int) -> str:
        """Where the contribution of forward ``op`` to the gradient of its input ``i`` goes."""
        t = op.inputs[i]
        return grad_name(t) if self.expected[t] == 1 else grad_name(op.name, i)

    def _add(self, op: O.Op, i: int, contribution: str) -> None:
        self.contribs[op.inputs[i]].append(contribution)

    def _elementwise(self, op: O.Op, i: int, fn: str, inputs: Sequence[str], full: Shape,
                     **params: float) -> None:
        """Contribute ``fn(inputs)`` computed over dims ``full``, summed down to input ``i``'s dims."""
        x = self.tensors[op.inputs[i]]
        target = self._target(op, i)
        kw = {"fn": fn, "params": tuple(params.items())}
        if {d.name for d in full} <= set(x.dim_names):
            self._emit(O.Elementwise, target, inputs, x.dims, x.dtype, op.block, **kw)
        else:
            tmp = self._emit(O.Elementwise, grad_name(op.name, i, "full"), inputs, full, x.dtype, op.block, **kw)
            self._emit(O.Reduce, target, [tmp], x.dims, x.dtype, op.block, fn="sum")
        self._add(op, i, target)

    def _pass(self, op: O.Op, i: int, dy: str) -> None:
        """Contribute ``dy`` itself (broadcast or summed to input ``i``'s dims); no op when it fits as is."""
        x, g = self.tensors[op.inputs[i]], self.tensors[dy]
        if g.dims == x.dims and self.expected[x.name] > 1:
            self._add(op, i, dy)
        elif set(g.dim_names) <= set(x.dim_names):
            self._elementwise(op, i, "identity", [dy], g.dims)
        else:
            self._add(op, i, self._emit(O.Reduce, self._target(op, i), [dy], x.dims, x.dtype, op.block, fn="sum"))

    def _finish(self, t: str, block: str | None) -> str:
        """Sum the contributions to the gradient of ``t`` into ``grad/t``."""
        parts = self.contribs[t]
        if len(parts) != self.expected[t]:  # pragma: no cover - a bug in this module
            raise AssertionError(f"gradient of {t!r}: {len(parts)} contributions, expected {self.expected[t]}")
        out = grad_name(t)
        if len(parts) == 1:
            return out
        x = self.tensors[t]
        acc = parts[0]
        for k, part in enumerate(parts[1:], start=1):
            dst = out if k == len(parts) - 1 else grad_name(t, f"add{k}")
            acc = self._emit(O.Elementwise, dst, [acc, part], x.dims, x.dtype, block, fn="add")
        return acc

    # -- the backward pass
    def backward(self) -> None:
        f = self.fwd
        loss = f.loss
        assert loss is not None
        if loss in self.needs:
            producer = f.producer(loss)
            lt = self.tensors[loss]
            seed = self._emit(O.Elementwise, grad_name(loss), [loss], lt.dims, lt.dtype,
                              producer.block if producer else None, fn="fill", params=(("value", 1.0),))
            self.contribs[loss].append(seed)
            self.expected[loss] = 1
        for op in reversed(f.ops):
            if op.output in self.needs:
                dy = self._finish(op.output, op.block)
                self._rule(op, dy, [i for i in _grad_inputs(op, self.tensors) if op.inputs[i] in self.needs])
        for p in f.parameters:
            if not p.is_float:
                continue
            first = f.consumers[p.name]
            block = first[0].block if first else None
            if p.name in self.needs:
                self._finish(p.name, block)
            else:
                self._emit(O.Elementwise, grad_name(p.name), [p.name], p.dims, p.dtype, block,
                           fn="fill", params=(("value", 0.0),))

    def _rule(self, op: O.Op, dy: str, wanted: list[int]) -> None:
        t = self.tensors
        y = t[op.output]
        if isinstance(op, O.Einsum):
            for i in wanted:
                self._einsum(op, i, dy)
        elif isinstance(op, O.Elementwise):
            for i in wanted:
                self._elementwise_rule(op, i, dy)
        elif isinstance(op, O.Reduce):
            self._reduce(op, dy)
        elif isinstance(op, O.Softmax):
            x = t[op.inputs[0]]
            self._emit(O.SoftmaxGrad, self._target(op, 0), [op.output, dy], x.dims, x.dtype, op.block,
                       dim=op.dim)
            self._add(op, 0, self._target(op, 0))
        elif isinstance(op, O.LayerNorm):
            x = t[op.inputs[0]]
            self._emit(O.LayerNormGrad, self._target(op, 0), [x.name, dy], x.dims, x.dtype, op.block,
                       dim=op.dim, eps=op.eps, center=op.center)
            self._add(op, 0, self._target(op, 0))
        elif isinstance(op, O.Reshape):
            x = t[op.inputs[0]]
            groups = tuple((dst, src) for src, dst in op.groups)
            self._emit(O.Reshape, self._target(op, 0), [dy], x.dims, x.dtype, op.block, groups=groups)
            self._add(op, 0, self._target(op, 0))
        elif isinstance(op, O.Slice | O.Pad):  # the gradient of a slice is a pad of dy, and the other way round
            x = t[op.inputs[0]]
            back = O.Pad if isinstance(op, O.Slice) else O.Slice
            self._emit(back, self._target(op, 0), [dy], x.dims, x.dtype, op.block, dim=op.out_dim, start=op.start,
                       out_dim=op.dim)
            self._add(op, 0, self._target(op, 0))
        elif isinstance(op, O.Concat):
            for i, start in zip(wanted, (op.offsets(t)[i] for i in wanted), strict=True):
                x = t[op.inputs[i]]
                self._emit(O.Slice, self._target(op, i), [dy], x.dims, x.dtype, op.block, dim=op.out_dim,
                           start=start, out_dim=op.dims[i])
                self._add(op, i, self._target(op, i))
        elif isinstance(op, O.Gather):
            table, ids = (t[n] for n in op.inputs)
            self._emit(O.ScatterAdd, self._target(op, 0), [ids.name, dy], table.dims, table.dtype, op.block,
                       dim=op.dim)
            self._add(op, 0, self._target(op, 0))
        elif isinstance(op, O.CrossEntropy):
            logits, labels = (t[n] for n in op.inputs)
            self._emit(O.CrossEntropyGrad, self._target(op, 0), [logits.name, labels.name, dy], logits.dims,
                       logits.dtype, op.block, dim=op.dim)
            self._add(op, 0, self._target(op, 0))
        else:
            raise GraphError(f"no gradient rule for {op.kind} op {op.name!r} (output {y.name!r})")

    def _einsum(self, op: O.Einsum, i: int, dy: str) -> None:
        """dA = einsum(dY, other inputs -> A's dims); A-only dims summed in the forward are broadcast back."""
        a = self.tensors[op.inputs[i]]
        others = [n for j, n in enumerate(op.inputs) if j != i]
        avail = set(self.tensors[dy].dim_names).union(*(self.tensors[n].dim_names for n in others))
        kept = tuple(d for d in a.dims if d.name in avail)
        target = self._target(op, i)
        if len(kept) == len(a.dims):
            if not others and self.tensors[dy].dims == a.dims:
                self._pass(op, i, dy)
                return
            self._emit(O.Einsum, target, [dy, *others], a.dims, a.dtype, op.block)
        else:
            part = self._emit(O.Einsum, grad_name(op.name, i, "partial"), [dy, *others], kept, a.dtype, op.block)
            self._emit(O.Elementwise, target, [part], a.dims, a.dtype, op.block, fn="identity")
        self._add(op, i, target)

    def _elementwise_rule(self, op: O.Elementwise, i: int, dy: str) -> None:
        fn, ins, full = op.fn, op.inputs, self.tensors[op.output].dims
        if fn == "identity" or fn == "add" or (fn == "sub" and i == 0):
            self._pass(op, i, dy)
        elif fn == "neg" or fn == "sub":
            self._elementwise(op, i, "neg", [dy], full)
        elif fn == "scale":
            self._elementwise(op, i, "scale", [dy], full, factor=op.param["factor"])
        elif fn in O.UNARY_GRAD:
            self._elementwise(op, i, O.UNARY_GRAD[fn], [ins[0], dy], full)
        elif fn == "shift":
            self._pass(op, i, dy)
        elif fn == "pow":
            self._elementwise(op, i, "pow_grad", [ins[0], dy], full, exponent=op.param["exponent"])
        elif fn == "maximum":
            self._elementwise(op, i, "maximum_grad", [ins[i], ins[1 - i], dy], full)
        elif fn == "where":
            self._elementwise(op, i, "where_grad_true" if i == 1 else "where_grad_false", [ins[0], dy], full)
        elif fn == "mul":
            self._elementwise(op, i, "mul", [dy, ins[1 - i]], full)
        elif fn == "div" and i == 0:
            self._elementwise(op, i, "div", [dy, ins[1]], full)
        elif fn == "div":
            self._elementwise(op, i, "div_rhs_grad", [ins[0], ins[1], dy], full)
        else:
            raise GraphError(f"no gradient rule for elementwise function {fn!r} (op {op.name!r}); "
                             "it cannot appear between a parameter and the loss")

    def _reduce(self, op: O.Reduce, dy: str) -> None:
        x, y = self.tensors[op.inputs[0]], self.tensors[op.output]
        if op.fn == "sum":
            self._pass(op, 0, dy)
        elif op.fn == "mean":
            n = _mean_count(x, y)
            if n == 1:
                self._pass(op, 0, dy)
            else:
                self._elementwise(op, 0, "scale", [dy], y.dims, factor=1.0 / n)
        else:
            # max: the gradient is shared equally by the tied maxima (jax's convention)
            mask = self._emit(O.Elementwise, grad_name(op.name, "mask"), [x.name, y.name], x.dims, x.dtype, op.block, fn="eq")
            count = self._emit(O.Reduce, grad_name(op.name, "count"), [mask], y.dims, x.dtype, op.block, fn="sum")
            share = self._emit(O.Elementwise, grad_name(op.name, "share"), [dy, count], y.dims, x.dtype, op.block, fn="div")
            self._elementwise(op, 0, "mul", [mask, share], x.dims)

    # -- the optimizer
    def optimize(self, opt: Optimizer, policy: Precision | None) -> dict[str, str]:
        """The optimizer ops; returns parameter -> master copy (master weights only)."""
        state_dtype = policy.optimizer_state if policy else "float32"
        masters: dict[str, str] = {}
        for p in self.fwd.parameters:
            if not p.is_float:
                continue
            first = self.fwd.consumers[p.name]
            block = first[0].block if first else None
            g = grad_name(p.name)
            target = p
            if policy is not None and policy.master is not None:
                target = self._state(MASTER, p, policy.master)
                masters[p.name] = target.name
            if opt.kind == "sgd":
                new = self._update(target, "sgd", [target.name, g], block, lr=opt.lr)
            else:
                m = self._moment(ADAM_M, p, state_dtype, g, block, b1=opt.b1)
                v = self._moment(ADAM_V, p, state_dtype, g, block, b2=opt.b2)
                new = self._update(target, "adam_update", [target.name, m, v], block, lr=opt.lr, b1=opt.b1,
                                   b2=opt.b2, eps=opt.eps, step=float(opt.step))
            if target is not p:  # the parameter is the master copy cast to its dtype
                self._update(p, "identity", [new], block)
        return masters

    def _moment(self, kind: str, p: Tensor, dtype: str, g: str, block: str | None, **beta: float) -> str:
        """Adam moment ``kind`` of ``p`` updated with gradient ``g``: ``new/kind/p = kind(kind/p, g)``."""
        state = self._state(kind, p, dtype)
        return self._update(state, kind, [state.name, g], block, **beta)

    def _state(self, kind: str, p: Tensor, dtype: str) -> Tensor:
        state = Tensor(state_name(kind, p.name), p.dims, dtype, "optimizer_state")
        if state.name in self.tensors:
            raise GraphError(f"cannot derive the training graph: the optimizer state name {state.name!r} "
                             "is already used in the forward graph")
        self.tensors[state.name] = state
        return state

    def _update(self, old: Tensor, fn: str, inputs: Sequence[str], block: str | None, **params: float) -> str:
        """``new/<old> = fn(inputs)``, the value replacing ``old`` after the step."""
        return self._emit(O.Elementwise, new_name(old.name), inputs, old.dims, old.dtype, block, phase="optimizer",
                          role=old.role, updates=old.name, fn=fn, params=tuple(params.items()))


__all__ = ["OPTIMIZERS", "Optimizer", "parameter_gradients", "trained_parameters", "training_graph"]
