"""The helpers behind ``plan``'s defaults: which GPUs train in bf16, N of a cluster's GPUs."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.cli._plan_defaults import Assumptions, bf16_tensor_cores, use_gpus
from shardplan.errors import ShardplanError
from shardplan.topology import build_spec, flat


@pytest.mark.parametrize(("spec", "bf16"), [
    ("dgx-a100", True), ("dgx-h100", True), ("dgx-h200", True), ("dgx-b200", True),
    ("gb200-nvl72", True), ("pcie-h100", True), ("dgx2-v100", False),
    ("dgx-h100,flops=1e15", False)])  # a bare FLOP rate declares no tensor cores
def test_bf16_tensor_cores(spec: str, bf16: bool) -> None:
    assert bf16_tensor_cores(build_spec(spec)) is bf16


def test_bf16_not_on_flat_devices() -> None:
    assert not bf16_tensor_cores(flat(4))


def test_use_gpus_keeps_the_cluster_pairs() -> None:
    full = build_spec("dgx-h100,nodes=4")
    two = use_gpus(full, 2)
    assert two.num_devices == 2 and two.levels[0].groups == ((0, 1),)
    assert two.bandwidth[0, 1] == full.bandwidth[0, 1]
    assert two.meta["generator"]["kind"] == "dgx-h100"
    assert two.meta["generator"]["options"]["gpus_of"] == 32
    sixteen = use_gpus(full, 16)
    assert sixteen.num_devices == 16 and len(sixteen.levels[0].groups) == 2
    assert np.array_equal(np.asarray(sixteen.bandwidth), np.asarray(full.bandwidth)[:16, :16])
    assert np.array_equal(np.asarray(sixteen.latency), np.asarray(full.latency)[:16, :16])
    assert use_gpus(full, 32) is full


def test_use_gpus_pcie_pairs_and_dense() -> None:
    pcie = build_spec("pcie-h100")
    three = use_gpus(pcie, 3)
    assert np.array_equal(np.asarray(three.bandwidth), np.asarray(pcie.bandwidth)[:3, :3])
    dense = flat(4)
    assert use_gpus(dense, 2).num_devices == 2


@pytest.mark.parametrize(("n", "says"), [(0, "at least one"), (33, "more than the 32"),
                                         (12, "whole nodes of 8 GPUs")])
def test_use_gpus_refuses(n: int, says: str) -> None:
    with pytest.raises(ShardplanError, match=says):
        use_gpus(build_spec("dgx-h100,nodes=4"), n)


def test_assumptions_line() -> None:
    a = Assumptions()
    a.add("precision", "bf16 (tensor cores; --precision to change)")
    a.add("time_limit", "time limit 60 s (--time-limit to change)")
    assert a.line() == ("assumed: bf16 (tensor cores; --precision to change), time limit "
                        "60 s (--time-limit to change)")
    assert list(a.to_dict()) == ["precision", "time_limit"]


def test_assumptions_keep_their_order() -> None:
    a = Assumptions()
    for key in ("time_limit", "sequence", "precision"):
        a.add(key, key)
    assert a.line() == "assumed: precision, sequence, time_limit"
