"""Static tick tables of the pipeline schedules: which op each device runs at each tick, and where its data lies.

A pipeline of ``K`` devices (positions on the stage axis) runs ``V`` chunks per device (``V = 1``: GPipe and
1F1B; ``V > 1``: the interleaved schedule). Chunk ``c`` of device ``k`` is *virtual stage* ``j = c K + k`` of
``N = K V``; micro-batch ``i`` goes through the virtual stages ``0 .. N-1`` forward and back. A *tick* is one
chunk's forward or backward of one micro-batch on every device at once (or nothing: a bubble); after each tick
the devices exchange what they computed over fixed *channels* (one ``ppermute`` each). Every table here is
computed in Python when the program is traced, so the loop body indexes constant tables by the tick and the
device: one SPMD program for every device.

Schedules (``t`` = a device's time for one micro-batch, forward and backward of all its chunks, so a tick is
``t / (2V)`` when forward and backward take equal time):

* :func:`one_f_one_b` (PipeDream-flush, Narayanan et al. 2021, section 2.2): device ``k`` runs the forward of
  micro-batch ``i`` at tick ``k + 2i`` and its backward at tick ``2K - 1 - k + 2i``; ``2(M + K - 1)`` ticks, at
  most ``K - k`` micro-batches in flight on device ``k`` (schedule.py's ``min(M, K - k)``). Channels: after an
  even tick the neighbours ``(k, k+1)`` with ``k`` even swap, after an odd tick those with ``k`` odd (one
  ``ppermute`` per tick, none after the odd ticks when ``K = 2``).
* :func:`interleaved` (Megatron-LM's interleaved 1F1B, Narayanan et al. 2021, section 2.2.1): Megatron's
  per-device order of operations, exactly as ``forward_backward_pipelining_with_interleaving`` issues them:
  micro-batches in groups of ``K``; the ``f``-th forward of device ``k`` is chunk ``(f // K) mod V`` of
  micro-batch ``(f // (K V)) K + f mod K``, its backwards run the chunks in reverse; ``w_k = 2(K - k - 1) +
  (V - 1) K`` warm-up forwards, then one forward and one backward alternately (steady 1F1B), then the
  cool-down backwards. Each op runs at the first tick its input has arrived (as soon as possible, which is what
  the blocking point-to-point transfers of Megatron-LM amount to with equal op times). That takes ``2(M V + K -
  1)`` ticks, i.e. ``(M + (K - 1) / V) t``: the bubble ``(K - 1) / V`` per micro-batch loop that
  :mod:`layoutsearch.costmodel.schedule` prices (checked for every table built). Device ``k`` holds at most
  ``w_k + 1`` chunks' activations (``min(M V, .)``); device 0's ``V K + K - 1`` chunks are ``K (1 + (K - 1) /
  (K V))`` micro-batches' worth of its activations, schedule.py's ``in_flight(0)`` exactly; later devices hold
  ``V K + K - 2k - 1`` chunks, more than schedule.py's ``min(M, K - k) (1 + (K-1)/(K V))`` micro-batches
  (which undercounts them), but never more than device 0, which sets the peak. Channels: ``K = 2``, one swap
  per tick (both neighbours of a device are the other device); ``K > 2``, a ring shift to the right
  (activations, ``K - 1 -> 0`` included) and one to the left (gradients) per tick, since at one tick a device
  may receive an activation from its left and a gradient from its right neighbour; ``K = 1``, local delivery.
* :func:`circular_forward`: the forward passes alone, device ``k`` running its ``f``-th forward (Megatron's
  order) at tick ``k + f``, ``M V + K - 1`` ticks, one ring shift to the right per tick; every input arrives the
  tick before it is used. The interleaved executor computes the loss alone with it (GPipe-style, as MaxText's
  circular pipeline; ``jax.grad`` of it would be an interleaved GPipe).

Data between ticks lies in slots: a *stash* of ``stash_slots`` VJP residual sets per device (a forward writes
one, its backward frees it), an *activation inbox* and a *gradient inbox* (an arrival is written to a slot that
its consumer reads later; the last virtual stage also writes the loss gradient of its forward into the
gradient inbox for its backward). Slots are allocated lowest-free first; each inbox has one more slot, the
*trash*, that receives what a channel carries to a device that does not use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IDLE, FORWARD, BACKWARD = 0, 1, 2
_LOSS = 3  # the last virtual stage's forward, which its backward waits for
FIELDS = ("kind", "micro", "chunk", "x_slot", "stash", "g_slot", "dy_slot", "first", "last")
"""The columns of :attr:`TickPlan.table`: the op (:data:`IDLE`, :data:`FORWARD`, :data:`BACKWARD`), its
micro-batch and chunk, the activation-inbox slot a forward reads (-1: the pipeline's input), the stash slot a
forward writes or a backward reads, the gradient-inbox slot a backward reads, the gradient-inbox slot the last
virtual stage's forward writes its loss gradient to, whether the op is virtual stage 0's backward (its input
gradient leaves the pipeline) and whether it is the last virtual stage's forward (it computes the loss)."""

Perm = tuple[tuple[int, int], ...]
Op = tuple[int, int, int]
"""(kind, micro-batch, chunk)."""


@dataclass(frozen=True)
class TickPlan:
    """A schedule as tables (see the module docstring).

    ``period``: ticks per loop step (the channels repeat with it); ``channels[p]``: the permutations run after
    tick ``p`` of a step (``None``: delivery to the device itself); ``carries[p][n]``: whether channel ``n``
    ever carries activations, gradients; ``table[t, k]``: :data:`FIELDS` of device ``k``'s op at tick ``t``;
    ``recv[t, k, n]``: the activation- and gradient-inbox slots what channel ``n`` brings to device ``k`` after
    tick ``t`` is written to (the trash slot when it is nothing for it); ``in_flight[k]``: the most chunk
    stashes device ``k`` holds."""

    stages: int
    chunks: int
    microbatches: int
    period: int
    channels: tuple[tuple[Perm | None, ...], ...]
    carries: tuple[tuple[tuple[bool, bool], ...], ...]
    ops: tuple[tuple[Op | None, ...], ...]
    table: np.ndarray
    recv: np.ndarray
    stash_slots: int
    act_slots: int
    grad_slots: int
    in_flight: tuple[int, ...]

    @property
    def ticks(self) -> int:
        return len(self.ops)

    @property
    def steps(self) -> int:
        """Loop steps (``ticks / period``)."""
        return self.ticks // self.period


def _vstage(k: int, chunk: int, K: int) -> int:
    return chunk * K + k


def megatron_forward(k: int, f: int, K: int, V: int) -> tuple[int, int]:
    """(micro-batch, chunk) of device ``k``'s ``f``-th forward in Megatron-LM's interleaved order."""
    group, rest = divmod(f, K * V)
    chunk, r = divmod(rest, K)
    return group * K + r, chunk


def megatron_backward(k: int, b: int, K: int, V: int) -> tuple[int, int]:
    """(micro-batch, chunk) of device ``k``'s ``b``-th backward: the chunks in reverse."""
    i, chunk = megatron_forward(k, b, K, V)
    return i, V - 1 - chunk


def megatron_order(k: int, K: int, V: int, M: int) -> list[Op]:
    """Device ``k``'s operations in Megatron-LM's interleaved order: warm-up forwards, steady 1F1B, cool-down."""
    total = M * V
    warm = min(2 * (K - k - 1) + (V - 1) * K, total)
    fwd = [(FORWARD, *megatron_forward(k, f, K, V)) for f in range(total)]
    bwd = [(BACKWARD, *megatron_backward(k, b, K, V)) for b in range(total)]
    order = fwd[:warm]
    for s in range(total - warm):
        order += [fwd[warm + s], bwd[s]]
    return order + bwd[total - warm:]


def _message(op: Op, k: int, K: int, V: int) -> tuple[tuple[int, int, int], int] | None:
    """What ``op`` on device ``k`` sends: ((kind, micro-batch, virtual stage it is for), destination device)."""
    kind, i, c = op
    j, N = _vstage(k, c, K), K * V
    if kind == FORWARD and j < N - 1:
        return (FORWARD, i, j + 1), (k + 1) % K
    if kind == BACKWARD and j > 0:
        return (BACKWARD, i, j - 1), (k - 1) % K
    return None


def _needs(op: Op, k: int, K: int, V: int) -> tuple[int, int, int] | None:
    """The message ``op`` on device ``k`` reads (None: the pipeline's input, or its own loss gradient)."""
    kind, i, c = op
    j, N = _vstage(k, c, K), K * V
    if kind == FORWARD:
        return (FORWARD, i, j) if j > 0 else None
    return (BACKWARD, i, j) if j < N - 1 else (_LOSS, i, j)  # the last stage: after its own forward


def _as_soon_as_possible(orders: list[list[Op]], K: int, V: int) -> list[tuple[Op | None, ...]]:
    """Each device's ops in its order, each at the first tick after its input was sent."""
    sent: dict[tuple[int, int, int], int] = {}  # message -> tick it was sent (or, for the loss, computed)
    pos, ticks = [0] * K, []
    while any(p < len(o) for p, o in zip(pos, orders, strict=True)):
        t, row = len(ticks), []
        for k in range(K):
            op = orders[k][pos[k]] if pos[k] < len(orders[k]) else None
            need = _needs(op, k, K, V) if op else None
            row.append(op if op and (need is None or sent.get(need, t) < t) else None)
        if not any(row):
            raise RuntimeError("the schedule deadlocks")  # cannot happen for Megatron's order
        for k, op in enumerate(row):
            if op:
                pos[k] += 1
                msg = _message(op, k, K, V)
                key = msg[0] if msg else (_LOSS if op[0] == FORWARD else op[0], op[1], _vstage(k, op[2], K))
                sent[key] = t
        ticks.append(tuple(row))
    return ticks


def _ring(K: int) -> tuple[tuple[Perm | None, ...], ...]:
    if K == 1:
        return ((None,),)
    if K == 2:
        return ((((0, 1), (1, 0)),),)
    return ((tuple((k, (k + 1) % K) for k in range(K)), tuple((k, (k - 1) % K) for k in range(K))),)


class _Slots:
    """Lowest-free-first slot allocation; ``high`` is the most slots held at once."""

    def __init__(self) -> None:
        self.free: list[int] = []
        self.used = 0
        self.high = 0

    def take(self) -> int:
        if self.free:
            self.free.sort()
            return self.free.pop(0)
        self.used += 1
        self.high = max(self.high, self.used)
        return self.used - 1

    def give(self, slot: int) -> None:
        self.free.append(slot)


def _tables(ops: list[tuple[Op | None, ...]], K: int, V: int, M: int, period: int,
            channels: tuple[tuple[Perm | None, ...], ...], grads: bool = True) -> TickPlan:
    """The slots and receive tables of a schedule given by its ops per tick (see :class:`TickPlan`)."""
    T, N = len(ops), K * V
    C = max((len(c) for c in channels), default=0)
    table = np.zeros((T, K, len(FIELDS)), np.int32)
    recv = np.full((T, K, C, 2), -1, np.int32)
    stash, act, grad = ([_Slots() for _ in range(K)] for _ in range(3))
    held: dict[tuple[int, tuple[int, int, int]], int] = {}  # (device, message) -> inbox slot
    stashed: dict[tuple[int, int, int], int] = {}  # (device, micro-batch, chunk) -> stash slot
    in_flight, live = [0] * K, [0] * K
    carries = [[[False, False] for _ in ch] for ch in channels]
    col = {f: n for n, f in enumerate(FIELDS)}
    for t, row in enumerate(ops):
        p = t % period
        for k, op in enumerate(row):
            if op is None:
                continue
            kind, i, c = op
            j, r = _vstage(k, c, K), table[t, k]
            r[col["kind"]], r[col["micro"]], r[col["chunk"]] = kind, i, c
            need = _needs(op, k, K, V)
            if kind == FORWARD:
                if need is not None:
                    r[col["x_slot"]] = held.pop((k, need))
                    act[k].give(r[col["x_slot"]])
                else:
                    r[col["x_slot"]] = -1
                if grads:
                    r[col["stash"]] = stashed[(k, i, c)] = stash[k].take()
                    live[k] += 1
                    in_flight[k] = max(in_flight[k], live[k])
                if j == N - 1:
                    r[col["last"]] = 1
                    if grads:
                        r[col["dy_slot"]] = held[(k, (BACKWARD, i, j))] = grad[k].take()
            else:
                r[col["g_slot"]] = held.pop((k, need if j < N - 1 else (BACKWARD, i, j)))
                grad[k].give(r[col["g_slot"]])
                r[col["stash"]] = stashed.pop((k, i, c))
                stash[k].give(r[col["stash"]])
                live[k] -= 1
                r[col["first"]] = int(j == 0)
        for k, op in enumerate(row):  # arrivals after the tick
            msg = _message(op, k, K, V) if op else None
            if msg is None or (msg[0][0] == BACKWARD and not grads):
                continue
            (what, dst) = msg
            n = next((n for n, perm in enumerate(channels[p])
                      if (perm is None and dst == k) or (perm is not None and (k, dst) in perm)), None)
            if n is None:
                raise RuntimeError(f"no channel after tick {t} carries {k} -> {dst}")
            box = act if what[0] == FORWARD else grad
            side = 0 if what[0] == FORWARD else 1
            if recv[t, dst, n, side] != -1:
                raise RuntimeError(f"two arrivals on one channel at device {dst} after tick {t}")
            recv[t, dst, n, side] = held[(dst, what)] = box[dst].take()
            carries[p][n][side] = True
    if held or stashed:
        raise RuntimeError(f"the schedule leaves data unconsumed: {sorted(held)[:3]} {sorted(stashed)[:3]}")
    n_act, n_grad = max(s.high for s in act), max(s.high for s in grad)
    recv[..., 0] = np.where(recv[..., 0] < 0, n_act, recv[..., 0])  # the trash slots
    recv[..., 1] = np.where(recv[..., 1] < 0, n_grad, recv[..., 1])
    dy = table[..., col["dy_slot"]]
    table[..., col["dy_slot"]] = np.where(table[..., col["last"]] == 1, dy, n_grad)
    return TickPlan(K, V, M, period, channels, tuple(tuple(tuple(x) for x in ch) for ch in carries),
                    tuple(ops), table, recv, max(s.high for s in stash), n_act, n_grad, tuple(in_flight))


def one_f_one_b(K: int, M: int) -> TickPlan:
    """1F1B (PipeDream-flush) over ``K`` stages, ``M`` micro-batches (see the module docstring)."""
    T = 2 * (M + K - 1)
    ops: list[list[Op | None]] = [[None] * K for _ in range(T)]
    for k in range(K):
        for i in range(M):
            ops[k + 2 * i][k] = (FORWARD, i, 0)
            ops[2 * K - 1 - k + 2 * i][k] = (BACKWARD, i, 0)
    swaps = [tuple((k + d, k + 1 - d) for k in range(par, K - 1, 2) for d in (0, 1)) for par in (0, 1)]
    channels = tuple((s,) if s else () for s in swaps)
    return _tables([tuple(r) for r in ops], K, 1, M, 2, channels)


def interleaved(K: int, V: int, M: int) -> TickPlan:
    """Megatron-LM's interleaved 1F1B with ``V`` chunks per device (see the module docstring); ``M`` a multiple
    of ``K`` (Megatron-LM's constraint: otherwise its order waits for micro-batches that do not exist)."""
    if K > 1 and M % K:
        raise ValueError(f"the interleaved schedule needs the micro-batches ({M}) to be a multiple of the "
                         f"stages ({K})")
    ops = _as_soon_as_possible([megatron_order(k, K, V, M) for k in range(K)], K, V)
    if len(ops) != 2 * (M * V + K - 1):  # the bubble the cost model prices
        raise RuntimeError(f"interleaved K={K} V={V} M={M} took {len(ops)} ticks, not 2(MV + K - 1)")
    return _tables(ops, K, V, M, 1, _ring(K))


def circular_forward(K: int, V: int, M: int) -> TickPlan:
    """The forwards alone, device ``k``'s ``f``-th (Megatron's order) at tick ``k + f`` (module docstring)."""
    if K > 1 and M % K:
        raise ValueError(f"the interleaved schedule needs the micro-batches ({M}) to be a multiple of the "
                         f"stages ({K})")
    T = M * V + K - 1
    ops: list[list[Op | None]] = [[None] * K for _ in range(T)]
    for k in range(K):
        for f in range(M * V):
            ops[k + f][k] = (FORWARD, *megatron_forward(k, f, K, V))
    right = _ring(K)[0][:1]
    plan = _tables([tuple(r) for r in ops], K, V, M, 1, (right,), grads=False)
    if plan.act_slots > 1:  # each input is used the tick after it arrives
        raise RuntimeError("circular forward: an activation waits")
    return plan


__all__ = ["BACKWARD", "FIELDS", "FORWARD", "IDLE", "TickPlan", "circular_forward", "interleaved",
           "megatron_order", "one_f_one_b"]
