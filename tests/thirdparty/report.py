"""Import every third-party case with ``layoutsearch.from_jax`` and print one line per model: OK with the
graph's dims and op count, or the exception's type and message.

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


def one(module: str) -> str:
    import layoutsearch

    start = time.time()
    try:
        case = importlib.import_module(f"tests.thirdparty.{module}").case()
    except Exception as e:  # noqa: BLE001 - a report, not a test
        return f"{module:14} CASE-FAILED {type(e).__name__}: {str(e)[:300]!r}"
    try:
        graph = layoutsearch.from_jax(case.loss, case.params, *case.batch_args, dims=case.dims)
    except Exception as e:  # noqa: BLE001
        return (f"{case.name:14} FAIL  eager={case.eager_loss:.4f}  {type(e).__name__}: "
                f"{' '.join(str(e).split())[:300]}{at_node(e)}  ({time.time() - start:.0f}s)")
    return (f"{case.name:14} OK    eager={case.eager_loss:.4f}  ops={len(graph.ops)}  dims={dict(graph.dims)}"
            f"  ({time.time() - start:.0f}s)")


def at_node(e: BaseException) -> str:
    """Where the importer was when ``e`` was raised, if its message does not say: the primitive and source
    line of the node the translator was on (read from the traceback's ``Translator.run`` frame)."""
    if "cannot import primitive" in str(e):
        return ""
    tb, node = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "run" and "node" in tb.tb_frame.f_locals:
            node = tb.tb_frame.f_locals["node"]
        tb = tb.tb_next
    return f"  [at primitive {node.prim!r}, {node.where}]" if node is not None else ""


def main(names: list[str]) -> None:
    warnings.filterwarnings("ignore")
    for module in names or MODULES:
        print(re.sub(r"\S*/site-packages/", "", one(module)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
