"""Measured collective curves: :func:`shardplan.cost._collectives.curve_seconds` by hand."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.cost._collectives import curve_seconds


def _curve(points):
    arr = np.asarray(points, dtype=np.float64)
    return arr[:, 0], arr[:, 1]


def test_interpolates_between_and_clamps_below() -> None:
    c = _curve([[10.0, 1.0], [20.0, 3.0], [40.0, 4.0]])
    assert curve_seconds(c, 15.0) == pytest.approx(2.0)
    assert curve_seconds(c, 30.0) == pytest.approx(3.5)
    assert curve_seconds(c, 40.0) == pytest.approx(4.0)
    assert curve_seconds(c, 5.0) == pytest.approx(1.0)  # below: the smallest size's time
    assert curve_seconds(c, 0.0) == 0.0 and curve_seconds(c, -3.0) == 0.0
    assert curve_seconds(c, 0.5) == pytest.approx(1.0)  # any bytes pay the floor


def test_extrapolates_with_the_last_segment_slope() -> None:
    c = _curve([[10.0, 1.0], [20.0, 3.0], [40.0, 4.0]])  # last slope 1/20 s per byte
    assert curve_seconds(c, 60.0) == pytest.approx(5.0)
    assert curve_seconds(c, 140.0) == pytest.approx(9.0)
    falling = _curve([[10.0, 2.0], [20.0, 1.0]])  # noise: never faster for more bytes
    assert curve_seconds(falling, 100.0) == pytest.approx(1.0)


def test_a_point_above_a_larger_sizes_time_is_taken_down_to_it() -> None:
    """Noise: 20 bytes measured slower than 40; every size up to 40 then costs at most 4."""
    c = _curve([[10.0, 1.0], [20.0, 7.0], [40.0, 4.0], [80.0, 9.0]])
    assert curve_seconds(c, 20.0) == pytest.approx(4.0)
    assert curve_seconds(c, 15.0) == pytest.approx(2.5)
    assert curve_seconds(c, 30.0) == pytest.approx(4.0)
    assert curve_seconds(c, 60.0) == pytest.approx(6.5)
    assert curve_seconds(c, 10.0) == pytest.approx(1.0)
    assert c[1].tolist() == [1.0, 7.0, 4.0, 9.0]  # the caller's curve is left as it is


def test_one_point_curve_is_a_bandwidth() -> None:
    c = _curve([[100.0, 2.0]])
    assert curve_seconds(c, 50.0) == pytest.approx(2.0)
    assert curve_seconds(c, 300.0) == pytest.approx(6.0)


def test_arrays_and_scalars() -> None:
    c = _curve([[10.0, 1.0], [20.0, 3.0]])
    out = curve_seconds(c, np.array([0.0, 15.0, 30.0]))
    assert isinstance(out, np.ndarray) and out.tolist() == pytest.approx([0.0, 2.0, 5.0])
    one = curve_seconds(c, 15)
    assert isinstance(one, float) and one == pytest.approx(2.0)


def test_a_reduce_scatter_without_its_curve_takes_the_all_gathers() -> None:
    """measured_seconds: a kind's own curve for that group size; a reduce-scatter measured
    only as an all-gather (the same traffic) takes the all-gather's curve; nothing else
    borrows another kind's or another size's curve."""
    from shardplan.cost._collectives import measured_seconds
    from shardplan.topology import flat

    base = flat(4)
    t = base.replace(meta=dict(base.meta, collectives={
        "allgather": {"4": [[10.0, 1.0], [20.0, 2.0]]},
        "allreduce": {"4": [[10.0, 5.0], [20.0, 6.0]]},
        "reducescatter": {"2": [[10.0, 7.0], [20.0, 9.0]]}}))
    assert measured_seconds(t, "allgather", 4, 15.0) == pytest.approx(1.5)
    assert measured_seconds(t, "reducescatter", 4, 15.0) == pytest.approx(1.5)
    assert measured_seconds(t, "reducescatter", 2, 15.0) == pytest.approx(8.0)
    assert measured_seconds(t, "allreduce", 4, 15.0) == pytest.approx(5.5)
    assert measured_seconds(t, "allreduce", 2, 15.0) is None
    assert measured_seconds(t, "allgather", 2, 15.0) is None
    assert measured_seconds(base, "reducescatter", 4, 15.0) is None
