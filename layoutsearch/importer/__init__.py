"""Import a JAX or Flax function as a named-dimension graph: :func:`from_jax`.

The function is traced to a jaxpr (:mod:`.trace`), composite ops are recognized (:mod:`.patterns`) and
each primitive is translated into IR ops over dims named from the caller's ``dims``
(:mod:`.translate`, :mod:`.labels`). The result is a forward graph with the function's scalar output as
its loss: ``ls.estimate``, ``ls.search`` and ``Plan.compile`` take it like a zoo model's.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import jax

from layoutsearch.errors import GraphError
from layoutsearch.importer import patterns
from layoutsearch.importer.trace import Node, Program, Var, flatten, flatten_jaxpr, refuse_opaque
from layoutsearch.importer.translate import BLOCK_PATTERN, Translator, block_of
from layoutsearch.ir import strictjson
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import leaf_tensors, pytree_key
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
    bad = [k for k in params_argnums if not (isinstance(k, int) and 0 <= k < len(args))]
    if bad:
        raise GraphError(f"params_argnums: {bad[0]!r} is not an argument index (0 to {len(args) - 1})")
    arg_names = _arg_names(fn, len(args))
    leaves = _named_leaves(args, dims, set(params_argnums), arg_names)
    program, _ = flatten(fn, args)
    return _translate(fn, program, leaves, splits, name, _arguments(arg_names, params_argnums))


def _arguments(arg_names: list[str], params_argnums: Sequence[int]) -> dict[str, Any]:
    """What the graph's metadata keeps of the function's arguments: their names (an array argument's tensor is
    named after it) and which hold the parameters, so that a program finds its tensors in the user's own
    arrays (``Program.init(params=...)``, ``Program.batch``)."""
    return {"arguments": list(arg_names), "params_argnums": sorted({int(k) for k in params_argnums})}


def _translate(fn: Callable[..., Any], program: Program, leaves: list[tuple[str, Any, str]],
               splits: Mapping[str, Sequence[str]] | None, name: str | None,
               arguments: Mapping[str, Any]) -> Graph:
    """The graph of ``program``, the flattened trace of ``fn``, whose inputs are ``leaves`` (:func:`_named_leaves`)
    and whose arguments ``arguments`` describes (:func:`_arguments`)."""
    if len(leaves) != len(program.inputs):
        raise GraphError(f"internal: {len(leaves)} argument arrays for {len(program.inputs)} jaxpr inputs")
    loss = program.outputs[0] if program.outputs else None
    if not isinstance(loss, Var) or loss.shape != () or loss.dtype not in ("float32", "bfloat16", "float16"):
        raise GraphError("the function must return a scalar float loss (or a tuple whose first item is one), got "
                         + (f"an array of shape {list(loss.shape)}, dtype {loss.dtype}" if isinstance(loss, Var) else "a constant"))
    needed = _needed(program.nodes, loss)
    refuse_opaque(needed)
    nodes = _needed(patterns.rewrite(needed), loss)
    tr = Translator(splits)
    title = name or getattr(fn, "__qualname__", None) or "imported"
    try:
        for var, (path, names, role) in zip(program.inputs, leaves, strict=True):
            tr.source(var, path, names, role)
        tr.run(nodes, block_of)
        return tr.graph(re.sub(r"[^\w.\-]+", "_", title), loss,
                        {"imported_from": getattr(fn, "__qualname__", "?"), **arguments})
    except GraphError as e:
        e.add_note(f"the traced program (jaxpr) of {title}:\n{program.jaxpr}")  # shown with --debug
        raise


def partition_specs(layout: Layout, graph: Graph, tree: Any, arg: int = 0, name: str | None = None) -> Any:
    """PartitionSpecs laying out ``tree`` (argument ``arg`` of the function ``graph`` was imported from,
    e.g. a Flax ``params`` dict or an ``nnx.State``) as ``layout`` lays out the graph's tensors: a pytree
    like ``tree`` to pass to ``jax.device_put`` (with ``NamedSharding``) or ``jax.jit(in_shardings=...)``.
    A stack of layers a ``scan`` read one slice per iteration (``ws`` read as ``ws[0]``, ``ws[1]``, ...)
    gets its slices' spec with the stacked axis whole; an array the function reads a static slice of
    (``pos_embed[0:16, 0:512]``) the slice's spec. Arrays the graph does not read are replicated."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    default = name or _argument_name(graph, arg)
    specs = []
    for path, _ in flat:
        parts = leaf_tensors(graph.tensors, pytree_key(path) or default)
        whole = [t for t, index in parts if not index]
        stacked = [t for t, index in parts if len(index) == 1 and isinstance(index[0], int)]
        cut = [t for t, index in parts if index and all(isinstance(i, slice) for i in index)]
        if whole:
            specs.append(layout.partition_spec(graph.tensors[whole[0]]))
        elif stacked:
            specs.append(jax.sharding.PartitionSpec(None, *layout.partition_spec(graph.tensors[stacked[0]])))
        elif len(cut) == 1:  # the graph reads a static slice of it: lay it out as the slice
            specs.append(layout.partition_spec(graph.tensors[cut[0]]))
        else:
            specs.append(jax.sharding.PartitionSpec())
    return jax.tree_util.tree_unflatten(treedef, specs)


def _argument_name(graph: Graph, arg: int) -> str:
    """The name of argument ``arg`` of the function ``graph`` was imported from (``arg0`` when unknown)."""
    names = graph.meta.get("arguments") or []
    return names[arg] if arg < len(names) else f"arg{arg}"


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


def from_spec_file(target: str, spec_path: str | Path, name: str | None = None) -> Graph:
    """Import ``module:function`` with the example arguments a JSON spec file describes (``layoutsearch
    import``): ``{"args": [ARG, ...], "params_argnums": [0], "splits": {"d_model": ["heads", "d_kv"]}}``
    where each ARG is an array ``{"dims": ["batch", "d_model"], "shape": [8, 512], "dtype": "float32"}``
    (dtype optional) or an object or list of them (a pytree, e.g. the parameters). Arrays are not
    allocated: the function is traced on shapes only.

    ``target`` is ``MODULE:FUNCTION``, the module looked up in the current directory first, then on the
    Python path (as ``python -c`` does), or ``PATH.py:FUNCTION``, that file imported with its directory
    first on the path (as ``python PATH.py`` does). Raises :class:`~layoutsearch.errors.GraphError` where
    the spec does not fit the function: an argument the spec gives nothing for, or the function failing
    when traced with the spec's shapes (the message quotes the error and its line)."""
    module, attr, directory, file = _split_target(target)
    with _first_on_path(directory), _user_code(target):
        fn = _importable(target, module, attr, file)
        doc = strictjson.loads(strictjson.read_text(spec_path, "import spec", GraphError), str(spec_path),
                               GraphError)
        if not isinstance(doc, dict) or not isinstance(doc.get("args"), list):
            raise GraphError(f"{spec_path}: expected an object with an \"args\" list (one entry per argument)")
        unknown = set(doc) - {"args", "params_argnums", "splits"}
        if unknown:
            raise GraphError(f"{spec_path}: unknown keys {sorted(unknown)} (known: args, params_argnums, splits)")
        argnums = doc.get("params_argnums", [0])
        if not isinstance(argnums, list) or not all(isinstance(k, int) and not isinstance(k, bool)
                                                    for k in argnums):
            raise GraphError(f"{spec_path}: params_argnums must be a list of argument indices")
        splits = doc.get("splits", {})
        if not isinstance(splits, dict) or not all(
                isinstance(v, list) and all(isinstance(n, str) for n in v) for v in splits.values()):
            raise GraphError(f"{spec_path}: splits must map dim names to lists of dim names")
        pairs = [_spec_arg(a, f"{spec_path}: args[{k}]") for k, a in enumerate(doc["args"])]
        args, dims = tuple(a for a, _ in pairs), tuple(d for _, d in pairs)
        _check_arity(fn, target, len(args), spec_path)
        if not args:
            raise GraphError(f"{spec_path}: \"args\" is empty: {target} needs an argument (the parameters)")
        bad = [k for k in argnums if not 0 <= k < len(args)]
        if bad:
            raise GraphError(f"{spec_path}: params_argnums: {bad[0]} is not an argument index (the spec gives "
                             f"{len(args)} argument{'s' if len(args) > 1 else ''}: 0 to {len(args) - 1})")
        arg_names = _arg_names(fn, len(args))
        try:
            leaves = _named_leaves(args, dims, set(argnums), arg_names)
        except GraphError as e:  # the spec's dims contradict each other: the spec file is the offender
            raise GraphError(f"{spec_path}: {e}") from None
        program = flatten_jaxpr(_trace_spec(fn, args, target, spec_path, arg_names))
    try:
        return _translate(fn, program, leaves, splits, name, _arguments(arg_names, argnums))
    except GraphError as e:  # named after what was imported with which spec
        named = GraphError(f"{target} with {spec_path}: {e}")
        named.__notes__ = list(getattr(e, "__notes__", []))  # the traced program, shown with --debug
        raise named from None


def _split_target(target: str) -> tuple[str, str, str, Path | None]:
    """(module name, attribute path, the directory searched first, the file or None) of ``MODULE:FUNCTION``
    (the current directory) or ``PATH.py:FUNCTION`` (the file's directory)."""
    module, sep, attr = target.rpartition(":")
    if not sep or not module or not attr:
        raise GraphError(f"expected MODULE:FUNCTION or PATH.py:FUNCTION (e.g. mymodel:loss), got {target!r}")
    if not module.endswith(".py"):
        return module, attr, os.getcwd(), None
    path = Path(module)
    if not path.is_file():
        raise GraphError(f"cannot import {target!r}: no file {module!r}")
    path = path.resolve()
    return path.stem, attr, str(path.parent), path


class _UserExit(BaseException):
    """``os._exit`` called by the user's code while it is imported or traced (see :func:`_user_code`)."""


@contextlib.contextmanager
def _user_code(target: str) -> Iterator[None]:
    """Around the import and the trace of the user's code: what it prints goes to stderr (stdout holds the
    command's result), and its exits (``sys.exit``, ``exit()``, and ``os._exit``, which is replaced meanwhile
    by a function raising) become a GraphError naming its file and line. An exit from native code (C's
    ``exit``) is not caught: that would need the import in a child process, and the function must be traced
    in this one."""
    real = os._exit

    def _exit(code: int) -> NoReturn:
        raise _UserExit(code)

    os._exit = _exit
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    except (SystemExit, _UserExit) as e:
        how = "os._exit" if isinstance(e, _UserExit) else "sys.exit"
        code = e.args[0] if e.args else None
        frame = _user_frame(e)
        where = f" at {_shown_path(frame.filename)}:{frame.lineno}" if frame is not None else ""
        raise GraphError(f"{target}: the user's code called {how}({code!r}){where} while imported or traced") \
            from None
    finally:
        os._exit = real


@contextlib.contextmanager
def _first_on_path(directory: str) -> Iterator[None]:
    """``directory`` first on ``sys.path`` while the user's module is imported and its function traced."""
    sys.path.insert(0, directory)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(directory)


def _spec_arg(doc: Any, where: str) -> tuple[Any, Any]:
    """(a pytree of ShapeDtypeStructs, the matching dims pytree) of one spec-file argument."""
    if isinstance(doc, dict) and "dims" in doc:
        unknown = set(doc) - {"dims", "shape", "dtype"}
        dims, shape, dtype = doc.get("dims"), doc.get("shape"), doc.get("dtype", "float32")
        if unknown or not isinstance(dims, list) or not isinstance(shape, list) or len(dims) != len(shape) or not all(
                isinstance(n, str) or n is None for n in dims) or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 < d < 2**40 for d in shape):
            raise GraphError(f"{where}: an array is {{\"dims\": [names], \"shape\": [positive sizes], "
                             f"\"dtype\": ...}} with one name per size")
        if dtype not in ("float32", "bfloat16", "float16", "int32"):
            raise GraphError(f"{where}: dtype must be float32, bfloat16, float16 or int32, got {dtype!r}")
        return jax.ShapeDtypeStruct(tuple(shape), jax.numpy.dtype(dtype)), tuple(dims)
    if isinstance(doc, dict):
        pairs = {k: _spec_arg(v, f"{where}.{k}" if k.isidentifier() else f"{where}[{k!r}]") for k, v in doc.items()}
        return {k: a for k, (a, _) in pairs.items()}, {k: d for k, (_, d) in pairs.items()}
    if isinstance(doc, list):
        items = [_spec_arg(v, f"{where}[{i}]") for i, v in enumerate(doc)]
        return [a for a, _ in items], [d for _, d in items]
    raise GraphError(f"{where}: expected an array {{\"dims\": ..., \"shape\": ...}}, an object or a list")


_FILES_IMPORTED: set[Path] = set()
"""The files imported as ``PATH.py:FUNCTION``: imported afresh next time (edited, or another file by that name)."""


def _importable(target: str, module: str, attr: str, file: Path | None) -> Callable[..., Any]:
    """The function ``attr`` of ``module`` (imported from ``file`` where ``target`` names a file)."""
    shown = target.rpartition(":")[0]
    if file is not None:  # a file: a module of another file by that name (one imported so, or edited) gives way
        held = getattr(sys.modules.get(module), "__file__", None)
        if held is not None and Path(held).resolve() in _FILES_IMPORTED:
            del sys.modules[module]
    try:
        obj: Any = importlib.import_module(module)
    except Exception as e:  # the user's module failed to import: say why, whatever it raised
        hint = ""
        if isinstance(e, ModuleNotFoundError) and e.name and (module + ".").startswith(e.name + "."):
            hint = (" (looked in the current directory, then on the Python path; give a file as "
                    "PATH.py:FUNCTION or set PYTHONPATH)")
        raise GraphError(f"cannot import module {shown!r}: {type(e).__name__}: {e}{hint}") from e
    found = getattr(obj, "__file__", None)
    if file is not None and (not found or Path(found).resolve() != file):
        raise GraphError(f"cannot import {shown!r}: the module name {module!r} is taken by "
                         f"{found or 'a built-in module'}: rename the file")
    if file is not None:
        _FILES_IMPORTED.add(file)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise GraphError(f"module {shown!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise GraphError(f"{target} is not a function")
    return obj


def _check_arity(fn: Callable[..., Any], target: str, n: int, spec_path: str | Path) -> None:
    """Refuse a spec whose ``n`` arguments do not fit ``fn``'s signature, naming the arguments without a spec."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return  # no signature to check against: tracing says what is wrong
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes = f"{target} takes {', '.join(p.name for p in positional) or 'no positional arguments'}"
    missing = [p.name for p in positional[n:] if p.default is p.empty]
    missing += [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    if missing:
        which = ", ".join(repr(m) for m in missing)
        raise GraphError(f"argument{'s' if len(missing) > 1 else ''} {which} of {target} ha"
                         f"{'ve' if len(missing) > 1 else 's'} no spec: \"args\" of {spec_path} has {n} "
                         f"entr{'ies' if n != 1 else 'y'} ({takes}; one entry per argument, in order)")
    if n > len(positional) and not any(p.kind == p.VAR_POSITIONAL for p in params):
        raise GraphError(f"\"args\" of {spec_path} has {n} entries, more than the arguments of the function "
                         f"({takes}; one entry per argument, in order)")


def _trace_spec(fn: Callable[..., Any], args: tuple[Any, ...], target: str, spec_path: str | Path,
                arg_names: list[str]) -> Any:
    """The jaxpr of ``fn`` traced on the spec's shapes. Only the user's function (and JAX on its behalf) runs
    here: whatever it raises means the spec does not fit the function, a user error."""
    try:
        return jax.make_jaxpr(fn)(*args)
    except Exception as e:  # noqa: BLE001 -- raised by the user's function while traced: say what and where
        raise GraphError(_trace_failure(e, args, target, spec_path, arg_names)) from e


def _trace_failure(e: Exception, args: tuple[Any, ...], target: str, spec_path: str | Path,
                   arg_names: list[str]) -> str:
    """One line: the function failed when traced with the spec's shapes, the error's first line, the user's
    line it came from and, for a key the spec does not give, the argument lacking it."""
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    msg = f"{target} failed when traced with the shapes from {spec_path}: {type(e).__name__}" + (
        f": {first.strip()}" if first else "")
    frame = _user_frame(e)
    if frame is not None:
        code = f": {frame.line.strip()}" if frame.line else ""
        msg += f" (at {_shown_path(frame.filename)}:{frame.lineno}{code})"
    key = e.args[0] if isinstance(e, KeyError) and len(e.args) == 1 else None
    if isinstance(key, str):
        objects = [k for k, a in enumerate(args) if _dicts(a)]
        if objects and not any(key in d for a in args for d in _dicts(a)):
            if len(objects) == 1:
                k = objects[0]
                msg += f"; argument {arg_names[k]!r} has no spec for {key!r}: add it to args[{k}]"
            else:
                msg += f"; no argument has a spec for {key!r}"
    return msg


def _dicts(tree: Any) -> list[dict[str, Any]]:
    """The objects (dicts) of a spec argument, at any depth."""
    if isinstance(tree, dict):
        return [tree, *(d for v in tree.values() for d in _dicts(v))]
    if isinstance(tree, list):
        return [d for v in tree for d in _dicts(v)]
    return []


def _user_frame(e: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``e``'s traceback in the user's code: not JAX's, layoutsearch's, the standard
    library's or an installed package's."""
    paths = sysconfig.get_paths()
    skip = tuple(os.path.join(os.path.realpath(d), "") for d in (
        *(paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")),
        os.path.dirname(jax.__file__), os.path.dirname(os.path.dirname(__file__))) if d)
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if not os.path.realpath(frame.filename).startswith(skip) and not frame.filename.startswith("<frozen"):
            return frame
    return None


def _shown_path(filename: str) -> str:
    """``filename`` relative to the current directory where it is inside it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


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


def _named_leaves(args: tuple[Any, ...], dims: Any, params: set[int],
                  arg_names: list[str]) -> list[tuple[str, Any, str]]:
    """(tensor name, dim names or None, role) per array leaf of ``args``, in jaxpr input order."""
    if not isinstance(dims, tuple | list) or len(dims) != len(args):
        raise GraphError(f"dims must have one entry per argument ({len(args)}), got {type(dims).__name__}"
                         + (f" of {len(dims)}" if isinstance(dims, tuple | list) else ""))
    out: list[tuple[str, Any, str]] = []
    for k, (arg, sub) in enumerate(zip(args, dims, strict=True)):
        flat, _ = jax.tree_util.tree_flatten_with_path(arg)
        for path, leaf in flat:
            name = pytree_key(path) or arg_names[k]
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
        if isinstance(key, jax.tree_util.GetAttrKey) and key.name == "value" and _is_leaf(
                getattr(node, "get_value", lambda: None)()):
            node = node.get_value()  # a Flax NNX Variable holding the names
            continue
        try:
            node = node[k]
        except (KeyError, IndexError, TypeError):
            if not isinstance(k, str) or not hasattr(node, k):
                raise GraphError(f"dims has no entry for argument array {name!r}") from None
            node = getattr(node, k)  # an attribute: a dataclass field
    if node is not None and not _is_leaf(node):
        raise GraphError(f"dims for {name!r} must be a tuple of dim names, got {type(node).__name__}")
    return node


def _is_leaf(x: Any) -> bool:
    return isinstance(x, tuple | list) and all(n is None or isinstance(n, str) for n in x)


__all__ = ["BLOCK_PATTERN", "flax_dims", "from_jax", "from_spec_file", "partition_specs"]
