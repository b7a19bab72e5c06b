"""The third-party corpus as the README's table: each model imported with ``layoutsearch.from_jax`` (its ops,
dims and import seconds), searched on ``data:2,model:4`` (float32), compiled and stepped once from the user's
own parameters (its first loss beside the user's eager loss); or the exception where one fails.

    .venv/bin/python -m tests.thirdparty.report [NAME ...]
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import importlib  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

MODULES = ["hf_gpt2", "hf_llama", "hf_mistral", "hf_bert", "flax_linen_lm", "flax_nnx_lm", "equinox_lm", "haiku_lm"]
HEADER = ("| model | ops | import s | plan found (data:2,model:4) | first loss | eager loss |\n"
          "|---|---:|---:|---|---:|---:|")


def one(module: str) -> str:
    import layoutsearch

    try:
        case = importlib.import_module(f"tests.thirdparty.{module}").case()
    except Exception as e:  # noqa: BLE001 - a report, not a test
        return f"| {module} | case failed: {type(e).__name__}: {str(e)[:200]} | | | | |"
    start = time.time()
    try:
        graph = layoutsearch.from_jax(case.loss, case.params, *case.batch_args, dims=case.dims)
    except Exception as e:  # noqa: BLE001
        return f"| {case.name} | import failed: {' '.join(str(e).split())[:300]}{at_node(e)} | | | | |"
    seconds = time.time() - start
    plan = layoutsearch.search(graph, "data:2,model:4", precision="fp32", top=1, baselines=False)
    program = plan.compile()
    _, metrics = program.train_step(program.init(params=case.params), program.batch(*case.batch_args))
    return (f"| {case.name} | {len(graph.ops)} | {seconds:.1f} | `{plan.chosen.rules_text()}` | "
            f"{float(metrics['loss']):.5f} | {case.eager_loss:.5f} |")


def at_node(e: BaseException) -> str:
    """Where the importer was when ``e`` was raised, if its message does not say: the primitive and source
    line of the node the translator was on (read from the traceback's ``Translator.run`` frame)."""
    if " at " in str(e):
        return ""
    tb, node = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "run" and "node" in tb.tb_frame.f_locals:
            node = tb.tb_frame.f_locals["node"]
        tb = tb.tb_next
    return f"  [at primitive {node.prim!r}, {node.where}]" if node is not None else ""


def main(names: list[str]) -> None:
    warnings.filterwarnings("ignore")
    print(HEADER, flush=True)
    for module in names or MODULES:
        print(re.sub(r"\S*/site-packages/", "", one(module)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
