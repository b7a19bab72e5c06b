"""An abstract cost DAG: what a pipeline partitioner needs to know about a model, and nothing else.

A :class:`CostDAG` has nodes (operators or layers) with a compute time and a memory footprint, and edges
(tensors flowing between them) with a transfer time. It can come from a named-dim graph under a layout or
from a profiler elsewhere; the partitioner (:mod:`layoutsearch.solvers.partition`) does not care which.
The JSON format is documented in ``docs/costdag.md``; files are data, parsed with :mod:`json` and checked
field by field, never evaluated.

Conventions (the partitioner's objectives rely on them):

* ``compute_s``: forward + backward time of the node for one micro-batch, in seconds.
* ``memory_bytes``: bytes the node keeps on its stage independently of micro-batching (parameters,
  gradients, optimizer state, workspace); ``param_bytes``: the parameter part of it (informational);
  ``activation_bytes``: bytes stashed per micro-batch in flight, so a stage holding ``M`` micro-batches
  needs ``sum(memory_bytes) + M * sum(activation_bytes)``.
* An edge carries a tensor from ``src`` to ``dst``; ``transfer_s`` is the time to move it between two
  stages for one micro-batch (activation forward plus gradient backward). Edges from one ``src`` carry
  the *same* tensor (the node's output) unless they name different ``tensor`` labels; the edges of one
  tensor must agree on ``transfer_s`` and ``bytes``. A tensor is sent once per stage boundary, however
  many consumers it has on the other side.

Version 2 (device placement, Tarnawski et al. 2020) adds, all optional: **device kinds** (``devices``:
accelerators with a memory limit, CPU cores without, each with a count), a node's time **per device
kind** (``times``; a node runs only on the kinds it lists: eligibility), **co-location groups**
(``group``: nodes of one group share a device), **backward marks** (``backward``: training graphs) and the
``time_unit`` of the numbers. :func:`read_tarnawski` reads the paper's own instance files.

The concept lives in four modules, all re-exported here: :mod:`.model` (the validated data model),
:mod:`.limits` (the numeric limits and the checks of single figures), :mod:`.jsonformat` (this project's JSON
format, versions 1 and 2, and the files) and :mod:`.tarnawski` (the reader of Tarnawski et al.'s instances).
"""

from layoutsearch.costdag.jsonformat import (
    FORMAT,
    FORMATS,
    VERSION,
    VERSIONS,
    costdag_from_dict,
    costdag_to_dict,
    load_costdag,
    save_costdag,
)
from layoutsearch.costdag.limits import MAX_BYTES, MAX_DEVICES, MAX_SECONDS
from layoutsearch.costdag.model import CostDAG, DeviceKind, Edge, Node, Tensor
from layoutsearch.costdag.tarnawski import ACCELERATOR, CPU, read_tarnawski

__all__ = [
    "ACCELERATOR", "CPU", "FORMAT", "FORMATS", "MAX_BYTES", "MAX_DEVICES", "MAX_SECONDS", "VERSION", "VERSIONS",
    "CostDAG", "DeviceKind", "Edge", "Node", "Tensor", "costdag_from_dict", "costdag_to_dict", "load_costdag",
    "read_tarnawski", "save_costdag",
]
