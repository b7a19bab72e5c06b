"""Read a compiled JAX program: collectives, FLOPs and memory per device.

``summarize(compiled, mesh)`` parses ``compiled.as_text()`` (post-partitioning HLO,
per-device shapes) and reads ``cost_analysis()`` / ``memory_analysis()``.

Payload convention (per device, one execution): all-gather = output bytes,
reduce-scatter = input bytes, all-reduce / all-to-all / collective-permute =
operand bytes (summed over tuple operands, e.g. combined gradient all-reduces).
The async ``-start`` forms (GPU/TPU) are normalised to the base kind; collectives
wrapped in ``async-start`` computations are found through ``calls=``.

Replica groups (explicit ``{{0,1},{2,3}}``, iota ``[2,4]<=[4,2]T(1,0)``, mesh form
``mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}``, sub-axes
``'a':(1)2``) are expanded to device ids. Ids are taken as partition positions,
i.e. indices into ``mesh.devices.flat`` (true for jit SPMD programs: 1 replica,
N partitions, device assignment = mesh order). The axes of a collective are the
subset of mesh axes whose groups equal the HLO groups; the mesh form's own axis
names (``axis_0``...) are XLA-internal and never used.

``count`` multiplies the trip counts of enclosing while loops: ``known_trip_count``
from ``backend_config``, else the condition's integer constant compared (LT/LE/NE,
induction variable on the left) against an ``init``/``step`` of 0/1 or
``known_init_step``; unknown trip counts count as 1 (with a warning). Conditional
branches each count once (an upper bound).

Caveats: ``cost_analysis()["flops"]`` counts loop bodies once.
``flops_with_trip_counts`` adds (trip - 1) x body FLOPs estimated from the HLO text
(dot/convolution 2*MACs, 1 per element for non-transcendental elementwise ops,
reduce inputs, all-reduce/reduce-scatter inputs). ``memory`` comes from
``CompiledMemoryStats`` (``*_size_in_bytes`` -> ``*_bytes``, host_* included):
``total_bytes`` = argument + output + temp - alias (an upper bound); ``peak_bytes`` =
XLA's ``peak_memory_in_bytes`` (buffer-assignment liveness peak, often lower, e.g.
67600 vs 100384 for a data-parallel MLP step), falling back to ``total_bytes``.
XLA on CPU runs collectives synchronously and does not turn an all-reduce + slice
into a reduce-scatter; read what the target backend compiles.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import warnings
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_OPCODES = {**{k: k for k in KINDS}, **{k + "-start": k for k in KINDS}}
_ELEM_BITS = {"pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16,
              "bf16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128,
              "token": 0, "opaque": 0}
_ARRAY_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_ELEMENTWISE = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs", "compare", "select",
                "clamp", "and", "or", "xor", "not", "power", "remainder", "sign", "floor", "ceil", "atan2",
                "round-nearest-afz", "round-nearest-even"}


@dataclass(frozen=True)
class Collective:
    kind: str  # one of KINDS ("-start" forms normalised)
    axes: tuple[str, ...] | None  # mesh axes of the groups, in mesh order; None if not axis-aligned
    group_size: int  # devices per group (collective-permute: size of the matched axes, else devices involved)
    bytes: int  # per-device payload of ONE execution (see module docstring)
    count: int  # executions per call (enclosing loop trip counts multiplied)
    dtype: str  # first operand's element type
    name: str  # HLO instruction name
    dtypes: tuple[str, ...] = ()  # all operand element types
    source_target_pairs: tuple[tuple[int, int], ...] | None = None  # collective-permute only

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.count


@dataclass(frozen=True)
class CompiledSummary:
    collectives: tuple[Collective, ...]
    flops: float  # per device, cost_analysis (loop bodies once)
    memory: dict[str, int] = field(default_factory=dict)  # per device, see module docstring
    flops_with_trip_counts: float = 0.0  # flops + (trip - 1) x estimated loop-body flops

    def bytes_by(self) -> dict[tuple[str, tuple[str, ...] | None], int]:
        out: dict[tuple[str, tuple[str, ...] | None], int] = defaultdict(int)
        for c in self.collectives:
            out[(c.kind, c.axes)] += c.total_bytes
        return dict(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "collectives": [{**asdict(c), "total_bytes": c.total_bytes} for c in self.collectives],
            "bytes_by": [{"kind": k, "axes": a, "bytes": b} for (k, a), b in self.bytes_by().items()],
            "flops": self.flops,
            "flops_with_trip_counts": self.flops_with_trip_counts,
            "memory": dict(self.memory),
        }


# ---------------------------------------------------------------- shapes


def shape_arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """Leaf arrays of an HLO shape string: ``(f32[2,3]{1,0}, s32[])`` -> [("f32", (2, 3)), ("s32", ())]."""
    out = []
    for dtype, dims in _ARRAY_RE.findall(shape):
        if dtype in _ELEM_BITS or re.fullmatch(r"f\d+e\d+m\d+\w*", dtype):
            out.append((dtype, tuple(int(d.lstrip("<=")) for d in dims.split(",") if d.strip())))
    return out


def shape_bytes(shape: str) -> int:
    return sum(math.ceil(math.prod(d) * _ELEM_BITS.get(t, 8) / 8) for t, d in shape_arrays(shape))


# ---------------------------------------------------------------- HLO text


@dataclass
class _Instr:
    name: str
    shape: str
    opcode: str
    args: str
    attrs: dict[str, str]

    @property
    def operands(self) -> list[str]:
        return re.findall(r"%([\w.\-]+)", self.args)


def _top_level(s: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, char, bracket depth before char) for every character outside double quotes."""
    depth, quote = 0, False
    for j in range(start, len(s)):
        ch = s[j]
        if quote or ch == '"':
            quote = not quote or (ch != '"' or s[j - 1] == "\\")
            continue
        depth -= ch in ")]}"
        yield j, ch, depth
        depth += ch in "([{"


def _close(s: str, i: int) -> int:
    """Index just past the bracket group opening at ``s[i]``."""
    return next((j + 1 for j, ch, d in _top_level(s, i) if ch in ")]}" and d == 0), len(s))


def _split_top(s: str) -> list[str]:
    cuts = [-1] + [j for j, ch, d in _top_level(s) if ch == "," and d == 0] + [len(s)]
    return [p for a, b in itertools.pairwise(cuts) if (p := s[a + 1:b].strip())]


def _parse_instr(line: str) -> _Instr | None:
    m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*", line)
    if not m:
        return None
    rest = line[m.end():]
    end = _close(rest, 0) if rest.startswith("(") else rest.find(" ")
    if end < 0:
        return None
    shape, rest = rest[:end], rest[end:]
    op = re.match(r"\s*([\w\-]+)\(", rest)
    if not op:
        return None
    close = _close(rest, op.end() - 1)
    attrs: dict[str, str] = {}
    for item in _split_top(rest[close:].lstrip(", ")):
        key, _, value = item.partition("=")
        if key == "device_ids" and "replica_groups" in attrs:  # mesh form: "mesh[...], device_ids=(...) {...}"
            attrs["replica_groups"] += ", " + item
        else:
            attrs[key.strip()] = value.strip()
    return _Instr(m.group(1), shape, op.group(1), rest[op.end():close - 1], attrs)


def _parse_module(text: str) -> tuple[dict[str, list[_Instr]], str | None]:
    comps: dict[str, list[_Instr]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = re.match(r"(ENTRY\s+)?%?([\w.\-]+)\s*\(.*->.*\{\s*$", line)
        if header and not line[:1].isspace():
            current = header.group(2)
            comps[current] = []
            entry = current if header.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None and (ins := _parse_instr(line)):
            comps[current].append(ins)
    return comps, entry


def _names(value: str) -> list[str]:
    return re.findall(r"%?([\w.\-]+)", value.strip("{}"))


def _callees(ins: _Instr, trip: int | None) -> list[tuple[str, int]]:
    """(computation, executions per execution of ``ins``); reducers (to_apply) are not followed."""
    a, op = ins.attrs, ins.opcode
    if op == "while":
        t = 1 if trip is None else trip
        return [(a["body"].lstrip("%"), t), (a["condition"].lstrip("%"), t + 1)]
    keys: tuple[str, ...] = ("calls", "called_computations")
    if op == "conditional":
        keys = ("branch_computations", "true_computation", "false_computation")
    elif op == "call":
        keys = ("to_apply",)
    elif op in ("async-done", "async-update"):
        keys = ()
    return [(c, 1) for k in keys if k in a for c in _names(a[k])]


def _trip_count(ins: _Instr, comps: dict[str, list[_Instr]]) -> int | None:
    try:
        cfg = json.loads(ins.attrs.get("backend_config", "{}"))
    except ValueError:
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    if "n" in cfg.get("known_trip_count", {}):
        return int(cfg["known_trip_count"]["n"])
    init_step = cfg.get("known_init_step", {})
    init, step = int(init_step.get("init", 0)), int(init_step.get("step", 1))
    todo, seen, consts, dirs = [ins.attrs["condition"].lstrip("%")], set(), [], []
    while todo:  # the condition and the fusions it calls
        comp = todo.pop()
        seen.add(comp)
        for i in comps.get(comp, []):
            if i.opcode == "constant" and re.fullmatch(r"[su]\d+\[\]", i.shape.split("{")[0]):
                consts.append(int(i.args))
            elif i.opcode == "compare":
                dirs.append(i.attrs.get("direction"))
            todo += [c for c, _ in _callees(i, 1) if c not in seen]
    if len(consts) != 1 or len(dirs) != 1 or step == 0:
        return None
    n, d = consts[0], {"GT": "LT", "GE": "LE"}.get(dirs[0], dirs[0])
    if d in ("LT", "NE"):
        return max(0, -(-(n - init) // step))
    return max(0, (n - init) // step + 1) if d == "LE" else None


def _multiplicities(comps: dict[str, list[_Instr]], entry: str | None, loops: bool) -> dict[str, int]:
    """Executions per call of each reachable computation (loop trip counts applied if ``loops``)."""
    mult: dict[str, int] = defaultdict(int)
    if entry is None:
        return {c: 1 for c in comps}

    def visit(comp: str, m: int) -> None:
        mult[comp] += m
        for ins in comps.get(comp, []):
            trip = None
            if ins.opcode == "while":
                trip = _trip_count(ins, comps) if loops else 1
                if trip is None:
                    warnings.warn(f"unknown trip count for {ins.name}; counted once", stacklevel=2)
            for callee, k in _callees(ins, trip):
                visit(callee, m * k)

    visit(entry, 1)
    return dict(mult)


# ---------------------------------------------------------------- replica groups


def _iota(dims: str, perm: str | None) -> np.ndarray:
    shape = [int(x) for x in dims.split(",")]
    arr = np.arange(math.prod(shape)).reshape(shape)
    return arr.transpose([int(x) for x in perm.split(",")]) if perm else arr


def _group_along(arr: np.ndarray, dims: list[int]) -> np.ndarray:
    rest = [d for d in range(arr.ndim) if d not in dims]
    return arr.transpose(rest + dims).reshape(-1, math.prod(arr.shape[d] for d in dims))


def _mesh_groups(text: str) -> list[list[int]]:
    axes = [(n, int(s)) for n, s in re.findall(r"'([^']+)'=(\d+)", text[: text.index("]") + 1])]
    ids_spec = re.search(r"device_ids=\((.*?)\)\s*\{", text)
    refs = re.findall(r"'([^']+)'(?::\((\d+)\)(\d+))?", text[text.rindex("{"):])
    size = math.prod(s for _, s in axes)
    if ids_spec is None:
        ids = np.arange(size)
    elif (iota := re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", ids_spec.group(1).strip())) is not None:
        ids = _iota(iota.group(1), iota.group(2)).reshape(-1)
    else:
        ids = np.array([int(x) for x in ids_spec.group(1).split(",")])
    cuts: dict[str, set[int]] = {n: {1, s} for n, s in axes}
    for n, pre, sub in refs:
        if pre:
            cuts[n] |= {int(pre), int(pre) * int(sub)}
    fine, selected = [], []
    for n, _ in axes:  # split each axis into sub-axis factors, major to minor
        c = sorted(cuts[n])
        for lo, hi in itertools.pairwise(c):
            if any(r == n and (not pre or (int(pre) <= lo and hi <= int(pre) * int(sub))) for r, pre, sub in refs):
                selected.append(len(fine))
            fine.append(hi // lo)
    return _group_along(ids.reshape(fine), selected).tolist()


def parse_replica_groups(text: str | None, num_devices: int | None = None) -> list[list[int]]:
    """Expand any replica-group syntax to explicit groups; empty/absent means one group of all devices."""
    text = (text or "").strip()
    if text.startswith("mesh["):
        return _mesh_groups(text)
    if iota := re.fullmatch(r"\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text):
        return _iota(iota.group(3), iota.group(4)).reshape(int(iota.group(1)), int(iota.group(2))).tolist()
    groups = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
    groups = [g for g in groups if g]
    if not groups and num_devices:
        return [list(range(num_devices))]
    return groups


class _MeshIndex:
    """Groups each subset of mesh axes produces, in partition-position space."""

    def __init__(self, mesh: Any) -> None:
        self.names = tuple(mesh.axis_names)
        self.size = math.prod(int(mesh.shape[n]) for n in self.names)
        positions = np.arange(self.size).reshape([int(mesh.shape[n]) for n in self.names])
        self.subsets: list[tuple[tuple[str, ...], np.ndarray]] = []
        self.by_groups: dict[frozenset[frozenset[int]], tuple[str, ...]] = {}
        for r in range(len(self.names) + 1):
            for dims in itertools.combinations(range(len(self.names)), r):
                groups = _group_along(positions, list(dims))
                axes = tuple(self.names[d] for d in dims)
                self.subsets.append((axes, groups))
                self.by_groups.setdefault(frozenset(frozenset(g) for g in groups.tolist()), axes)

    def axes_of(self, groups: list[list[int]]) -> tuple[str, ...] | None:
        return self.by_groups.get(frozenset(frozenset(g) for g in groups))

    def axes_of_pairs(self, pairs: list[tuple[int, int]]) -> tuple[tuple[str, ...], int] | None:
        for axes, groups in self.subsets[1:]:  # smallest subsets first, single axes before pairs
            where = {d: i for i, g in enumerate(groups.tolist()) for d in g}
            if pairs and all(where.get(s, -1) == where.get(t, -2) for s, t in pairs):
                return axes, groups.shape[1]
        return None


# ---------------------------------------------------------------- collectives and flops


def parse_collectives(hlo_text: str, mesh: Any = None) -> list[Collective]:
    """Collectives of an HLO module text, in text order, with loop-multiplied counts."""
    comps, entry = _parse_module(hlo_text)
    mult = _multiplicities(comps, entry, loops=True)
    shapes = {i.name: i.shape for instrs in comps.values() for i in instrs}
    index = _MeshIndex(mesh) if mesh is not None else None
    partitions = re.search(r"num_partitions=(\d+)", hlo_text)
    num_devices = index.size if index else int(partitions.group(1)) if partitions else None
    out = []
    for comp, instrs in comps.items():
        for ins in instrs:
            kind = _OPCODES.get(ins.opcode)
            if kind is None or mult.get(comp, 0) == 0:
                continue
            operand_shapes = [shapes.get(o, "") for o in ins.operands]
            arrays = [a for s in operand_shapes for a in shape_arrays(s)]
            in_bytes = sum(shape_bytes(s) for s in operand_shapes)
            pairs = None
            if kind == "collective-permute":
                stp = ins.attrs.get("source_target_pairs", "")
                pairs = tuple((int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}", stp))
                found = index.axes_of_pairs(list(pairs)) if index else None
                axes, group = found if found else (None, len({d for p in pairs for d in p}))
            else:
                groups = parse_replica_groups(ins.attrs.get("replica_groups"), num_devices)
                group = len(groups[0]) if groups else 0
                axes = index.axes_of(groups) if index else None
            if kind == "all-gather":
                nbytes = shape_bytes(ins.shape) if ins.opcode == kind else in_bytes * group
            else:
                nbytes = in_bytes
            dtypes = tuple(dict.fromkeys(t for t, _ in arrays))
            out.append(Collective(kind, axes, group, nbytes, mult[comp], dtypes[0] if dtypes else "",
                                  ins.name, dtypes, pairs))
    return out


def _instr_flops(ins: _Instr, shapes: dict[str, str]) -> float:
    out = sum(math.prod(d) for _, d in shape_arrays(ins.shape))
    operands = [shape_arrays(shapes.get(o, "")) for o in ins.operands]
    if ins.opcode == "dot" and operands and operands[0]:
        lhs = operands[0][0][1]
        return 2.0 * out * math.prod(lhs[int(d)] for d in _names(ins.attrs.get("lhs_contracting_dims", "{}")))
    if ins.opcode == "convolution" and len(operands) > 1 and operands[1]:
        rhs = operands[1][0][1]
        labels = ins.attrs.get("dim_labels", "_o->").split("_")[1].split("->")[0]
        o = labels.index("o") if "o" in labels else 0
        return 2.0 * out * math.prod(rhs) / max(rhs[o], 1) if rhs else 0.0
    if ins.opcode in ("reduce", "all-reduce", "all-reduce-start", "reduce-scatter"):
        return float(sum(math.prod(d) for arrs in operands[: max(1, len(operands) // 2)] for _, d in arrs))
    return float(out) if ins.opcode in _ELEMENTWISE else 0.0


def hlo_flops(hlo_text: str, loops: bool = True) -> float:
    """Rough FLOP estimate from HLO text; ``loops=False`` counts each loop body once like cost_analysis."""
    comps, entry = _parse_module(hlo_text)
    shapes = {i.name: i.shape for instrs in comps.values() for i in instrs}
    mult = _multiplicities(comps, entry, loops)
    return sum(m * _instr_flops(i, shapes) for c, m in mult.items() for i in comps.get(c, []))


# ---------------------------------------------------------------- compiled programs


def _first(x: Any) -> Any:
    return (x[0] if x else None) if isinstance(x, (list, tuple)) else x


def _memory(compiled: Any) -> dict[str, int]:
    stats = _first(compiled.memory_analysis())
    if stats is None:
        return {}
    names = [a for a in dir(stats) if a.endswith("_size_in_bytes")]
    mem = {a.replace("_size_in_bytes", "_bytes"): int(getattr(stats, a)) for a in names}
    mem["total_bytes"] = mem["argument_bytes"] + mem["output_bytes"] + mem["temp_bytes"] - mem["alias_bytes"]
    mem["peak_bytes"] = int(getattr(stats, "peak_memory_in_bytes", 0) or 0) or mem["total_bytes"]
    return mem


def summarize(compiled: Any, mesh: Any) -> CompiledSummary:
    """Summary of ``jax.jit(f).lower(*args).compile()`` for the mesh it was compiled for (None: no axes)."""
    text = compiled.as_text()
    flops = float((_first(compiled.cost_analysis()) or {}).get("flops", 0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # already reported by parse_collectives
        extra = hlo_flops(text, loops=True) - hlo_flops(text, loops=False)
    return CompiledSummary(tuple(parse_collectives(text, mesh)), flops, _memory(compiled), flops + extra)


def compile_summary(fn: Any, *args: Any, mesh: Any, **jit_kwargs: Any) -> CompiledSummary:
    import jax

    return summarize(jax.jit(fn, **jit_kwargs).lower(*args).compile(), mesh)
