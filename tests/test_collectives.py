"""Alpha-beta collective times: hand-computed ring formulas, hierarchical stages,
bytes per axis, errors, and monotonicity properties."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layoutsearch.costmodel.collectives import COLLECTIVE_KINDS, bytes_on_links, collective_time
from layoutsearch.errors import CostModelError, HardwareError, LayoutSearchError, MeshError
from layoutsearch.mesh import Mesh, hardware

FAST_BW, FAST_A = 100e9, 1e-6
SLOW_BW, SLOW_A = 10e9, 10e-6


def hw(fast_bw=FAST_BW, slow_bw=SLOW_BW, fast_eff=1.0, slow_eff=1.0, devices_per_node=8, **kw):
    return hardware("cpu-sim", fast_link_bandwidth=fast_bw, fast_link_latency=FAST_A, fast_link_efficiency=fast_eff,
                    slow_link_bandwidth=slow_bw, slow_link_latency=SLOW_A, slow_link_efficiency=slow_eff,
                    devices_per_node=devices_per_node, **kw)


ONE = Mesh.parse("x:8")
TWO = Mesh.parse("node:4,gpu:8")  # gpu: fast (extent 8), node: slow (extent 32)
GB = 1e9


# ---------------------------------------------------------------- one axis

@pytest.mark.parametrize("kind,expected", [
    ("all-reduce", 2 * 7 / 8 * GB / FAST_BW + 14e-6),
    ("all-gather", 7 / 8 * GB / FAST_BW + 7e-6),
    ("reduce-scatter", 7 / 8 * GB / FAST_BW + 7e-6),
    ("all-to-all", 7 / 8 * GB / FAST_BW + 7e-6),
    ("collective-permute", GB / FAST_BW + 1e-6),
])
def test_single_axis_ring(kind, expected):
    c = collective_time(kind, GB, ("x",), ONE, hw())
    assert c.seconds == pytest.approx(expected, rel=1e-12)
    assert (c.kind, c.axes, c.group_size, c.bytes) == (kind, ("x",), 8, 10**9)
    assert c.transfer_seconds + c.latency_seconds == pytest.approx(c.seconds)


def test_all_reduce_example_from_brief():
    c = collective_time("all-reduce", 1e9, ("x",), ONE, hw())
    assert c.seconds == pytest.approx(0.0175 + 14e-6)
    assert c.link_bytes == {"x": pytest.approx(2 * 7 / 8 * 1e9)}


def test_efficiency_scales_bandwidth_not_latency():
    full = collective_time("all-gather", GB, ("x",), ONE, hw())
    half = collective_time("all-gather", GB, ("x",), ONE, hw(fast_eff=0.5))
    assert half.transfer_seconds == pytest.approx(2 * full.transfer_seconds)
    assert half.latency_seconds == pytest.approx(full.latency_seconds)


def test_single_axis_on_slow_link():
    c = collective_time("all-reduce", GB, ("node",), TWO, hw())
    assert c.seconds == pytest.approx(2 * 3 / 4 * GB / SLOW_BW + 6 * SLOW_A)


# ---------------------------------------------------------------- trivial groups

@pytest.mark.parametrize("kind", [*COLLECTIVE_KINDS, "none"])
def test_trivial_groups_cost_nothing(kind):
    mesh = Mesh.parse("a:1,b:8")
    for axes in [(), ("a",)]:
        c = collective_time(kind, GB, axes, mesh, hw())
        assert c.seconds == 0.0 and c.group_size == 1 and c.stages == ()
        assert c.link_bytes == {a: 0.0 for a in axes}
    assert collective_time("none", GB, ("b",), mesh, hw()).seconds == 0.0


def test_zero_bytes_costs_only_latency():
    c = collective_time("all-reduce", 0, ("x",), ONE, hw())
    assert c.transfer_seconds == 0.0
    assert c.seconds == pytest.approx(14e-6)


def test_size_one_axis_in_group_is_skipped():
    mesh = Mesh.parse("a:1,x:8")
    c = collective_time("all-reduce", GB, ("a", "x"), mesh, hw())
    assert c.seconds == pytest.approx(collective_time("all-reduce", GB, ("x",), ONE, hw()).seconds)
    assert c.link_bytes == {"a": 0.0, "x": pytest.approx(2 * 7 / 8 * GB)}


# ---------------------------------------------------------------- several axes

def test_hierarchical_all_reduce_three_stages():
    c = collective_time("all-reduce", GB, ("node", "gpu"), TWO, hw())
    rs = 7 / 8 * GB / FAST_BW + 7 * FAST_A
    ar = 2 * 3 / 4 * (GB / 8) / SLOW_BW + 6 * SLOW_A
    ag = rs
    assert c.seconds == pytest.approx(rs + ar + ag, rel=1e-12)
    assert [(s.kind, s.axis) for s in c.stages] == [
        ("reduce-scatter", "gpu"), ("all-reduce", "node"), ("all-gather", "gpu")]
    assert c.group_size == 32 and c.axes == ("node", "gpu")
    flat_slow = 2 * 31 / 32 * GB / SLOW_BW + 62 * SLOW_A
    assert c.seconds < flat_slow
    assert c.link_bytes == {"gpu": pytest.approx(2 * 7 / 8 * GB), "node": pytest.approx(2 * 3 / 4 * GB / 8)}
    assert bytes_on_links("all-reduce", GB, ("node", "gpu"), TWO, hw()) == c.link_bytes


def test_axis_order_in_group_does_not_matter():
    a = collective_time("all-reduce", GB, ("gpu", "node"), TWO, hw())
    b = collective_time("all-reduce", GB, ("node", "gpu"), TWO, hw())
    assert a == b and a.axes == ("node", "gpu")


def test_fast_axis_goes_first_even_when_major():
    h = hw(axis_links={"node": "fast", "gpu": "slow"})
    c = collective_time("reduce-scatter", GB, ("node", "gpu"), TWO, h)
    assert [s.axis for s in c.stages] == ["node", "gpu"]
    expected = 3 / 4 * GB / FAST_BW + 3 * FAST_A + 7 / 8 * (GB / 4) / SLOW_BW + 7 * SLOW_A
    assert c.seconds == pytest.approx(expected)


def test_hierarchical_reduce_scatter_and_all_gather():
    rs = collective_time("reduce-scatter", GB, ("node", "gpu"), TWO, hw())
    ag = collective_time("all-gather", GB, ("node", "gpu"), TWO, hw())
    expected = 7 / 8 * GB / FAST_BW + 7 * FAST_A + 3 / 4 * GB / 8 / SLOW_BW + 3 * SLOW_A
    assert rs.seconds == pytest.approx(expected) and ag.seconds == pytest.approx(expected)
    assert [s.axis for s in rs.stages] == ["gpu", "node"]
    assert [s.axis for s in ag.stages] == ["node", "gpu"]  # small payload over the slow link first
    assert [s.bytes for s in ag.stages] == [GB / 8, GB]
    assert sum(rs.link_bytes.values()) == pytest.approx((1 - 1 / 32) * GB)


def test_hierarchical_all_to_all():
    c = collective_time("all-to-all", GB, ("node", "gpu"), TWO, hw())
    expected = 7 / 8 * GB / FAST_BW + 7 * FAST_A + 3 / 4 * GB / SLOW_BW + 3 * SLOW_A
    assert c.seconds == pytest.approx(expected)
    assert c.link_bytes == {"node": pytest.approx(3 / 4 * GB), "gpu": pytest.approx(7 / 8 * GB)}


def test_collective_permute_uses_bottleneck_link():
    c = collective_time("collective-permute", GB, ("node", "gpu"), TWO, hw())
    assert c.seconds == pytest.approx(GB / SLOW_BW + SLOW_A)
    assert c.link_bytes == {"node": GB, "gpu": 0.0}


def test_preset_and_mesh_string_accepted():
    c = collective_time("all_reduce", 1e6, "model", "data:2,model:4", "h100")
    link = hardware("h100").fast_link
    assert c.kind == "all-reduce"
    assert c.seconds == pytest.approx(2 * 3 / 4 * 1e6 / (link.bandwidth * link.efficiency) + 6 * link.latency)


# ---------------------------------------------------------------- errors

def test_errors():
    with pytest.raises(CostModelError, match="unknown collective kind 'all-sum'"):
        collective_time("all-sum", GB, ("x",), ONE, hw())
    with pytest.raises(MeshError, match="unknown mesh axis 'y'"):
        collective_time("all-reduce", GB, ("y",), ONE, hw())
    with pytest.raises(CostModelError, match="non-negative"):
        collective_time("all-reduce", -1, ("x",), ONE, hw())
    with pytest.raises(CostModelError, match="non-negative"):
        collective_time("all-reduce", math.nan, ("x",), ONE, hw())
    with pytest.raises(CostModelError, match="number of bytes"):
        collective_time("all-reduce", "1GB", ("x",), ONE, hw())
    with pytest.raises(CostModelError, match="repeats"):
        collective_time("all-reduce", GB, ("x", "x"), ONE, hw())
    with pytest.raises(HardwareError, match="must be positive"):  # caught when the figure is set
        collective_time("all-reduce", GB, ("x",), ONE, hw(fast_bw=0))
    assert issubclass(CostModelError, LayoutSearchError)


# ---------------------------------------------------------------- properties

kinds = st.sampled_from(COLLECTIVE_KINDS)
payload = st.floats(min_value=0, max_value=1e12, allow_nan=False)
bandwidth = st.floats(min_value=1e8, max_value=1e12)
groups = st.sampled_from([("gpu",), ("node",), ("node", "gpu")])
sizes = st.tuples(st.integers(1, 16), st.integers(1, 16))


@settings(max_examples=60, deadline=None)
@given(kinds, payload, payload, groups)
def test_more_bytes_more_time(kind, b1, b2, group):
    lo, hi = sorted((b1, b2))
    t_lo = collective_time(kind, lo, group, TWO, hw()).seconds
    t_hi = collective_time(kind, hi, group, TWO, hw()).seconds
    assert t_lo <= t_hi
    if hi > lo * (1 + 1e-9) + 1:
        assert t_lo < t_hi


@settings(max_examples=60, deadline=None)
@given(kinds, payload, bandwidth, bandwidth, groups)
def test_higher_bandwidth_less_time(kind, b, bw1, bw2, group):
    lo, hi = sorted((bw1, bw2))
    slow = collective_time(kind, b, group, TWO, hw(fast_bw=lo, slow_bw=lo / 10)).seconds
    fast = collective_time(kind, b, group, TWO, hw(fast_bw=hi, slow_bw=hi / 10)).seconds
    assert fast <= slow * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(payload, sizes, groups, bandwidth, bandwidth)
def test_all_reduce_is_reduce_scatter_plus_all_gather(b, shape, group, bw1, bw2):
    mesh = Mesh((("node", shape[0]), ("gpu", shape[1])))
    h = hw(fast_bw=bw1, slow_bw=bw2)
    ar = collective_time("all-reduce", b, group, mesh, h)
    rs = collective_time("reduce-scatter", b, group, mesh, h)
    ag = collective_time("all-gather", b, group, mesh, h)
    assert ar.seconds == pytest.approx(rs.seconds + ag.seconds, rel=1e-9, abs=1e-15)
    for a in ar.link_bytes:
        assert ar.link_bytes[a] == pytest.approx(rs.link_bytes[a] + ag.link_bytes[a], rel=1e-9, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(payload, sizes, bandwidth, bandwidth)
def test_hierarchical_all_reduce_beats_flat_ring_at_slowest_link(b, shape, bw1, bw2):
    mesh = Mesh((("node", shape[0]), ("gpu", shape[1])))
    h = hw(fast_bw=bw1, slow_bw=bw2, devices_per_node=max(1, shape[1]))
    c = collective_time("all-reduce", b, ("node", "gpu"), mesh, h)
    n = shape[0] * shape[1]
    links = h.links_for(mesh)
    bw = min(link.effective_bandwidth for link in links.values())
    alpha = max(link.latency for link in links.values())
    flat = 2 * (n - 1) / n * b / bw + 2 * (n - 1) * alpha
    assert c.seconds <= flat * (1 + 1e-9) + 1e-15
