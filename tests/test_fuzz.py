"""Fuzzing the readers and parsers: whatever the input, the only exceptions are LayoutSearchErrors.

Graph files: mutations of the zoo's JSON graph files (and of a training graph file) -- wrong types, missing
and extra fields, huge numbers, deep nesting, strings for lists, duplicate keys and NaN in the raw text,
non-UTF-8 bytes, truncation -- are read with ``graph_from_json``; a graph that loads is priced with
``estimate`` on a small mesh. String parsers: meshes, layout rules, ``--set`` overrides, byte sizes and
hardware overrides. The default run draws a few hundred examples (well under 30 s); ``pytest -m slow`` draws
many more.
"""

import json
import re
import traceback

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import layoutsearch as ls
from layoutsearch import zoo
from layoutsearch.costdag import costdag_from_dict
from layoutsearch.errors import CostDAGError, HardwareError, LayoutSearchError
from layoutsearch.hwprofile import hardware_from_json, hardware_to_json
from layoutsearch.ir import graph_from_json, graph_to_json, load_graph, strictjson, training_graph
from layoutsearch.layout import Layout, parse_rules
from layoutsearch.mesh import Mesh, hardware
from layoutsearch.solvers.partition import partition, stage_loads
from layoutsearch.units import parse_bytes

FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=5000, deadline=None, suppress_health_check=list(HealthCheck))

BASES = {name: json.loads((zoo.JSON_DIR / f"{name}.json").read_text())
         for name in ("mtf-ffn", "mlp", "moe", "mtf-transformer", "gpt")}
BASES["mtf-ffn-train"] = json.loads(graph_to_json(training_graph(load_graph(zoo.JSON_DIR / "mtf-ffn.json"))))

# -- JSON values and mutations --------------------------------------------------------------------------------------

NAMES = ["", "x", "w", "h", "batch", "io", "hidden", "data", "float32", "bfloat16", "uint8", "int32", "input",
         "parameter", "activation", "forward", "backward", "optimizer", "layer.0", "xw", "sum", "max", "scale",
         "relu", "add", "einsum", "reshape", "layer_norm", "\ud800", "a\nb", "é", "loss"]
BIG = [0, -1, 1, 2, 3, 16, 2**31, 2**40, 2**40 + 1, 2**50, 2**50 + 1, 2**53 + 1, 2**62, 2**63, 2**64, 10**30, -(2**63),
       10**39, 10**40, 10**41]
scalars = st.one_of(
    st.none(), st.booleans(), st.sampled_from(BIG), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.5, 1.0, 1e-300, 1e300, -0.0, 8.0]),
    st.sampled_from(NAMES), st.text(max_size=6),
)
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(NAMES + ["fn",
                      "params", "dims", "name", "factor", "groups", "eps", "center", "dim"]), c, max_size=3),
                      max_leaves=8)


def paths(doc, prefix=()):
    """Every path to a value of ``doc`` (containers included), root first."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, (*prefix, i))


def get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def nested(depth, leaf=1):
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


def field_of(path):
    """The name of the field a path ends in (list items take their list's name): ``("ops", 3, "inputs", 0)`` ->
    ``"inputs"``."""
    for k in reversed(path):
        if isinstance(k, str):
            return k
    return ""


def pool(doc):
    """Field name -> the strings and numbers found under it in ``doc``: swapping a value for another of its
    field keeps a document readable and reaches the graph's checks, the derivation and the cost model."""
    out: dict[str, set] = {}
    for p in paths(doc):
        v = get(doc, p)
        if isinstance(v, str | int | float) and not isinstance(v, bool):
            out.setdefault(field_of(p), set()).add(v)
    out.setdefault("", set()).update({1, 2, 4, 8, 16})
    return {k: sorted(v, key=repr) for k, v in out.items()}


def mutate(data, doc, semantic=False):
    """One mutation of ``doc`` (in place; the root may be replaced: returns the new root): structural (wrong
    types, missing or extra fields, huge numbers, nesting, strings for lists) or semantic (a name, a size, a list
    of names swapped for others of the document, which keeps it readable and reaches the graph's checks, the
    training derivation and the cost model)."""
    all_paths = list(paths(doc))
    path = data.draw(st.sampled_from(all_paths))
    op = data.draw(st.sampled_from(["swap", "swap", "swap", "shuffle", "drop_item"] if semantic else
                                   ["replace", "delete", "add", "wrap", "to_string", "huge", "nest", "type"]))
    if not path:
        return data.draw(values) if op == "replace" else doc
    parent, key = get(doc, path[:-1]), path[-1]
    old = parent[key]
    if op in ("swap", "shuffle", "drop_item"):
        pools = pool(doc)
        same = pools.get(field_of(path)) or pools[""]
        if isinstance(old, bool):
            parent[key] = not old
        elif isinstance(old, int | float):  # another value of the field, or a size up to the bounds
            parent[key] = data.draw(st.sampled_from(same + [3, 2**10, 2**20, 2**25, 2**30, 2**40]))
        elif isinstance(old, str):
            parent[key] = data.draw(st.sampled_from(same))
        elif isinstance(old, list) and old:
            if op == "drop_item":
                del old[data.draw(st.integers(0, len(old) - 1))]
            elif op == "shuffle":
                parent[key] = data.draw(st.permutations(old))
            else:
                old[data.draw(st.integers(0, len(old) - 1))] = data.draw(st.sampled_from(same))
        elif isinstance(old, dict) and old:
            k = data.draw(st.sampled_from(sorted(old)))
            if op == "drop_item":
                del old[k]
            else:
                old[k] = data.draw(st.sampled_from(pools.get(k) or pools[""]))
    elif op == "replace":
        parent[key] = data.draw(values)
    elif op == "delete":
        del parent[key]
    elif op == "add":
        if isinstance(old, dict):
            old[data.draw(st.sampled_from(NAMES + ["kind", "phase", "block", "updates", "extra"]))] = data.draw(values)
        elif isinstance(old, list):
            old.append(data.draw(values))
        else:
            parent[key] = [old, data.draw(values)]
    elif op == "wrap":
        parent[key] = data.draw(st.sampled_from([[old], {"v": old}, [[old]]]))
    elif op == "to_string":  # a list of names written as one string, a number as a string
        if isinstance(old, list) and all(isinstance(x, str) for x in old):
            parent[key] = "".join(old)
        else:
            parent[key] = str(old)[:50]
    elif op == "huge":
        parent[key] = data.draw(st.sampled_from(BIG + [10**300, -(10**20), 1e308, 2.5, 0.0]))
    elif op == "nest":
        parent[key] = nested(data.draw(st.sampled_from([2, 10, 63, 64, 65, 200])), old)
    else:  # the same value, another JSON type
        parent[key] = {"str": str, "int": int, "float": float, "bool": bool}.get(
            data.draw(st.sampled_from(["str", "int", "float", "bool", "none"])), lambda v: None)(1)
    return doc


def raw_mutation(data, text):
    """A mutation of the JSON text itself: what a dict cannot hold."""
    op = data.draw(st.sampled_from(["dup", "nan", "digits", "bytes", "truncate", "deep", "none"]))
    raw = text.encode()
    if op == "dup":  # a key written twice in its object
        keys = [m.start() for m in re.finditer(r'"[A-Za-z_]+": ', text)]
        if keys:
            i = data.draw(st.sampled_from(keys))
            key = text[i:text.index(":", i)]
            value = data.draw(st.sampled_from(["0", "[]", '"x"', "null"]))
            raw = (text[:i] + f"{key}: {value}, " + text[i:]).encode()
    elif op in ("nan", "digits"):
        numbers = [m.span() for m in re.finditer(r"(?<=[:\[, ])-?\d+(\.\d+)?(?=[,\]}\s])", text)]
        if numbers:
            a, b = data.draw(st.sampled_from(numbers))
            new = data.draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999"])) if op == "nan" else \
                "9" * data.draw(st.sampled_from([20, 41, 4301, 100_000]))
            raw = (text[:a] + new + text[b:]).encode()
    elif op == "bytes":
        i = data.draw(st.integers(0, len(raw)))
        raw = raw[:i] + data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xf4\x90\x80\x80",
                                                   b"\x00"])) + raw[i:]
    elif op == "truncate":
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    elif op == "deep":
        depth = data.draw(st.sampled_from([100, 1000, 100_000]))
        raw = ("[" * depth + "]" * depth).encode() if data.draw(st.booleans()) else \
            text.replace('"meta": {', '"meta": {"deep": ' + "[" * depth + "]" * depth + ", ", 1).encode()
    if op in ("bytes", "truncate") or data.draw(st.booleans()):
        return raw
    return raw.decode()


def price(data, graph):
    """``estimate`` on a small mesh, splitting a dim of the graph when there is one, with drawn settings."""
    dims = list(graph.dims)
    mesh = data.draw(st.sampled_from(["data:2", "data:2,model:2", "data:1"]))
    rules = data.draw(st.sampled_from(["", *(f"{d}:data" for d in dims[:3]), *(f"{d}:model" for d in dims[-2:])]))
    if "model" not in mesh:
        rules = rules.replace(":model", ":data")
    ls.estimate(graph, Layout.from_rules(Mesh.parse(mesh), rules),
                data.draw(st.sampled_from(["cpu-sim", "h100", "tpu-v4"])),
                remat=data.draw(st.sampled_from(["none", "selective", "full"])),
                precision=data.draw(st.sampled_from(["mixed", "fp32", "bf16"])),
                optimizer=data.draw(st.sampled_from(["adam", "sgd"])))


KNOWN_ISSUES: dict[tuple[str, str], str] = {
    # (exception, the innermost library file raising it): bugs this fuzzer found outside the readers, reported
    # to their owners and pinned by strict xfail tests in test_reliability.py; remove an entry once fixed.
}


def known_issue(e):
    frames = [f.filename for f in traceback.extract_tb(e.__traceback__) if "/layoutsearch/" in f.filename]
    where = "layoutsearch/" + frames[-1].split("/layoutsearch/")[-1] if frames else ""
    return KNOWN_ISSUES.get((type(e).__name__, where))


def check_graph_document(data):
    base = data.draw(st.sampled_from(sorted(BASES)))
    doc = json.loads(json.dumps(BASES[base]))
    mode = data.draw(st.sampled_from(["semantic", "semantic", "structural", "mixed", "raw"]))
    for _ in range(data.draw(st.integers(0 if mode == "raw" else 1, 3))):
        doc = mutate(data, doc, semantic=mode == "semantic" or (mode == "mixed" and data.draw(st.booleans())))
    text = json.dumps(doc)
    source = raw_mutation(data, text) if mode == "raw" else text
    try:
        graph = graph_from_json(source, "fuzz.json")
    except LayoutSearchError as e:
        msg = str(e)
        assert msg and "\n" not in msg, msg
        event(f"refused: {type(e).__name__}")
        return
    assert graph_from_json(graph_to_json(graph)) == graph  # what loads is written back exactly
    try:
        price(data, graph)
        event("loaded and priced")
    except LayoutSearchError as e:
        event(f"loaded, not priced: {type(e).__name__}")
    except Exception as e:
        if not known_issue(e):
            raise
        event(f"known issue: {known_issue(e)}")


@FAST
@given(st.data())
def test_mutated_graph_files_raise_only_layoutsearch_errors(data):
    check_graph_document(data)


@pytest.mark.slow
@SLOW
@given(st.data())
def test_mutated_graph_files_raise_only_layoutsearch_errors_long(data):
    check_graph_document(data)


# -- the string parsers the command line uses ----------------------------------------------------------------------

words = st.one_of(st.sampled_from(["data", "model", "fsdp", "batch", "d_ff", "heads", "x", "_", "a1", "1a", "é",
                                   "", " ", "-", "none"]), st.text(max_size=5))
numbers = st.one_of(st.sampled_from(["2", "4", "0", "-1", "1.5", "1e3", "9" * 30, "9" * 5000, "٣", "0x10", "inf",
                                     "nan", "1_000", " 8 ", "", "2**40", "1099511627776", "1099511627777"]),
                    st.integers(-(2**70), 2**70).map(str), st.text(max_size=6))
separators = st.sampled_from([",", ":", "=", "+", ";", " ", ",,", "\n", "\x00"])


def joined(parts, seps):
    return st.lists(st.tuples(parts, seps), max_size=5).map(lambda xs: "".join(a + b for a, b in xs))


mesh_texts = st.one_of(st.text(max_size=20), joined(st.one_of(words, numbers), separators),
                       st.lists(st.tuples(words, st.sampled_from([":", "="]), numbers), max_size=4).map(
                           lambda xs: ",".join(a + s + n for a, s, n in xs)))
rule_texts = st.one_of(st.text(max_size=20), joined(words, separators),
                       st.lists(st.tuples(words, st.lists(words, max_size=3)), max_size=4).map(
                           lambda xs: ",".join(d + ":" + "+".join(a) for d, a in xs)))


def check_mesh(text):
    try:
        mesh = Mesh.parse(text)
    except LayoutSearchError:
        return
    assert 1 <= mesh.size <= 2**20 and Mesh.parse(str(mesh)) == mesh


def check_rules(mesh, text):
    try:
        rules = parse_rules(text)
        Layout.from_rules(mesh, text).check(zoo.build("mtf-ffn"))
    except LayoutSearchError:
        return
    assert isinstance(rules, tuple)


keys = st.one_of(st.sampled_from(["batch", "io", "hidden", "dtype", "dropout", "layers", "preset", "seq", "nope",
                                  "", "1x", "a b"]), st.text(max_size=5))


override_lists = st.lists(st.one_of(st.tuples(keys, st.sampled_from(["=", ":", "=="]), numbers).map("".join),
                                   st.text(max_size=10)), max_size=4)


def check_overrides(items):
    try:
        overrides = zoo.parse_overrides(items)
    except LayoutSearchError:
        return
    small = {k: v for k, v in overrides.items() if k in ("batch", "io", "hidden", "dtype")}
    try:
        zoo.build("mtf-ffn", **small)
    except LayoutSearchError:
        pass


byte_sizes = st.one_of(st.text(max_size=12), st.tuples(numbers, st.sampled_from(["", "B", "GiB", " GB", "TiB", "kb",
                                                                               "EiB", "x"])).map("".join),
                       st.integers(-(2**80), 2**80), st.floats(), st.sampled_from([10**5000, True, None, [1], b"1"]))


def check_bytes(text):
    try:
        n = parse_bytes(text)
    except LayoutSearchError:
        return
    assert isinstance(n, int) and 0 <= n <= 2**62


figure_keys = st.sampled_from(["peak_flops", "hbm_bytes", "hbm_bandwidth", "devices_per_node", "matmul_efficiency",
                               "memory_efficiency", "fast_link_bandwidth", "slow_link_latency", "fast_link_efficiency",
                               "memory_reserved", "compute_units", "matmul_tile", "fusion", "reduce_scatter",
                               "axis_links", "peak_flops_fp32", "name", "source", "nope", "fast_link_nope"])
figure_values = st.one_of(numbers, st.floats(), st.integers(-(2**80), 2**80), st.booleans(), st.none(),
                          st.sampled_from([10**400, [1, 2, 3], [128, 128, 2**40], "128,128,64", {"data": "slow"},
                                           {"data": "medium"}, {1: "fast"}, "abc", [[1]]]))


def check_overrides_of_hardware(preset, overrides):
    try:
        hw = hardware(preset).replace(**overrides)  # what `--hardware PRESET --hw KEY=VALUE` does
        hw.links_for(Mesh.parse("data:2"))
    except LayoutSearchError:
        return
    for f in ("peak_flops", "hbm_bytes", "hbm_bandwidth"):
        assert 0 < getattr(hw, f) < float("inf")


PARSER_CASES = {
    "mesh": (st.tuples(mesh_texts), check_mesh),
    "layout_rules": (st.tuples(st.sampled_from(["data:2,model:4", "data:8", "a:2,b:2,c:2"]), rule_texts), check_rules),
    "zoo_overrides": (st.tuples(override_lists), check_overrides),
    "parse_bytes": (st.tuples(byte_sizes), check_bytes),
    "hardware_overrides": (st.tuples(st.sampled_from(["h100", "tpu-v4", "cpu-sim"]),
                                     st.dictionaries(figure_keys, figure_values, max_size=3)),
                           check_overrides_of_hardware),
}


def run_parser_case(name, examples):
    strategy, check = PARSER_CASES[name]

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def case(args):
        check(*args)

    case()


@pytest.mark.parametrize("name", sorted(PARSER_CASES))
def test_string_parsers_raise_only_layoutsearch_errors(name):
    run_parser_case(name, 200)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARSER_CASES))
def test_string_parsers_raise_only_layoutsearch_errors_long(name):
    run_parser_case(name, 5000)


# -- cost DAG files and hardware profiles ---------------------------------------------------------------------------

COSTDAG = json.loads(re.search(r"```json\n(.*?)```", (zoo.JSON_DIR.parent / "docs" / "costdag.md").read_text(),
                               re.S).group(1))
PROFILE = {"format": "layoutsearch-hardware-profile", "version": 1, "hardware": hardware_to_json(hardware("h100"))}


def mutated_document(data, base):
    doc = json.loads(json.dumps(base))
    mode = data.draw(st.sampled_from(["semantic", "structural", "raw"]))
    for _ in range(data.draw(st.integers(0 if mode == "raw" else 1, 3))):
        doc = mutate(data, doc, semantic=mode == "semantic")
    text = json.dumps(doc)
    return raw_mutation(data, text) if mode == "raw" else text


def check_cost_dag(data):
    text = mutated_document(data, COSTDAG)
    try:
        dag = costdag_from_dict(strictjson.loads(text, "fuzz.json", CostDAGError), "fuzz.json")
    except LayoutSearchError as e:
        assert "\n" not in str(e)
        return
    assert costdag_from_dict(json.loads(json.dumps(dag.to_dict(), allow_nan=False))) == dag
    try:
        k = data.draw(st.integers(1, 3))
        part = partition(dag, k, microbatches=data.draw(st.integers(1, 4)),
                         objective=data.draw(st.sampled_from(["throughput", "gpipe"])))
        stage_loads(dag, part.stages)
    except LayoutSearchError:
        pass


def check_profile(data):
    text = mutated_document(data, PROFILE)
    try:
        doc = strictjson.loads(text, "fuzz.json", HardwareError)
        strictjson.check_tree(doc, "fuzz.json", HardwareError)
        hw = hardware_from_json(doc.get("hardware") if isinstance(doc, dict) else doc, "fuzz.json")
    except LayoutSearchError as e:
        assert "fuzz.json: " in str(e) and "\n" not in str(e), str(e)  # the file, then the field
        return
    try:
        hw.links_for(Mesh.parse("data:2,model:4"))
    except LayoutSearchError as e:
        assert "\n" not in str(e)
        return
    json.dumps(hardware_to_json(hw), allow_nan=False)


@FAST
@given(st.data())
def test_mutated_cost_dags_raise_only_layoutsearch_errors(data):
    check_cost_dag(data)


@FAST
@given(st.data())
def test_mutated_hardware_profiles_raise_only_layoutsearch_errors(data):
    check_profile(data)


@pytest.mark.slow
@SLOW
@given(st.data())
def test_mutated_cost_dags_and_profiles_long(data):
    check_cost_dag(data)
    check_profile(data)
