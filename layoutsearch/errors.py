"""User-facing errors: each says what is wrong, names the offender and, where
possible, what to do instead. The CLI prints them as one line (no traceback)."""


class LayoutSearchError(Exception):
    """Base class of every error caused by the user's input."""


class GraphError(LayoutSearchError):
    """An invalid graph: unknown dims, shape mismatches, cycles, dangling tensors."""


class GraphFormatError(GraphError):
    """A graph file that is not valid JSON or not a valid graph document."""


class MeshError(LayoutSearchError):
    """An invalid mesh string or mesh axis."""


class HardwareError(LayoutSearchError):
    """An unknown hardware preset or an invalid hardware figure."""


class LayoutError(LayoutSearchError):
    """An invalid layout: unknown dims/axes, one axis on two dims, indivisible splits."""


class CostModelError(LayoutSearchError):
    """A cost-model query that cannot be answered: unknown collective kind, negative
    bytes, a link with no bandwidth."""


class CostDAGError(LayoutSearchError):
    """An invalid cost DAG: unknown nodes, cycles, negative times or bytes, a malformed DAG file."""


class PartitionError(LayoutSearchError):
    """A partition that cannot be found: too few nodes for the stages, an infeasible memory limit, a DAG
    too wide for the exact DP, an objective the chosen method does not support."""


class DimNameWarning(UserWarning):
    """Dim names that look wrong but are accepted (a contraction pairing two differently named axes)."""
