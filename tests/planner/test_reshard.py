"""Resharding an LLM plan's state (issue 48): bytes of small cases worked out by hand, the
link each crosses, and the node assignment that keeps state in place."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, ParallelConfig
from shardplan.planner._reshard import (
    Fabric,
    Placement,
    assign_nodes,
    block_moves,
    device_state_bytes,
    fabric_of,
    reshard,
    state_bytes_per_param,
)
from shardplan.topology import build_spec, flat
from tests.cost.llm_graph import gpt_graph

G = gpt_graph(layers=4, hidden=32, seq=16, vocab=64)
P = float(G.param_bytes.sum()) / 4  # parameters (fp32 bytes in the graph)
DDP = ExecutionSettings(precision="bf16", gradient_sync="bucketed")
ZERO1 = ExecutionSettings(precision="bf16", gradient_sync="zero1")
X = 12.0  # master weights and Adam's two moments


def _flat_fabric(n: int, alive: list[int] | None = None) -> Fabric:
    a = np.ones(n, dtype=bool) if alive is None else np.isin(np.arange(n), alive)
    return Fabric(node=np.arange(n), alive=a, intra_bandwidth=100.0, inter_bandwidth=10.0)


def test_state_bytes_per_param() -> None:
    assert state_bytes_per_param(DDP) == X
    assert state_bytes_per_param(ExecutionSettings(precision="fp32")) == 12.0  # w + moments


def test_ddp_fewer_replicas_moves_nothing() -> None:
    """DP 4 -> 3 on the three survivors: every replica holds the whole state already."""
    old = Placement(ParallelConfig(dp=4), DDP, np.arange(4))
    new = Placement(ParallelConfig(dp=3), DDP, np.arange(3))
    r = reshard(G, old, new, _flat_fabric(4, alive=[0, 1, 2]))
    assert r.moved_bytes == 0 and r.seconds == 0
    assert r.kept_bytes == pytest.approx(3 * P * X) == r.state_bytes


def test_zero1_four_to_three_by_hand() -> None:
    """ZeRO-1 DP 4 -> 3, device 3 removed: new shard k is [k/3, (k+1)/3), the old shards
    were quarters. Device 0 keeps 1/4 and fetches 1/12 from device 1; device 1 keeps 1/6
    and fetches 1/6 from device 2; device 2 keeps 1/12 and needs the last quarter, which
    only the removed device held: from the checkpoint."""
    old = Placement(ParallelConfig(dp=4), ZERO1, np.arange(4))
    new = Placement(ParallelConfig(dp=3), ZERO1, np.arange(3))
    r = reshard(G, old, new, _flat_fabric(4, alive=[0, 1, 2]))
    s = P * X
    np.testing.assert_allclose(r.per_rank["kept"], [s / 4, s / 6, s / 12])
    np.testing.assert_allclose(r.per_rank["network"], [s / 12, s / 6, 0], atol=1e-6)
    np.testing.assert_allclose(r.per_rank["checkpoint"], [0, 0, s / 4])
    assert r.state_bytes == pytest.approx(s)
    # the busiest device: a quarter over the network-class bandwidth of 10 B/s
    assert r.seconds == pytest.approx(s / 4 / 10.0)
    assert r.busiest_rank == 2


def test_tensor_parallel_halves_come_over_nvlink() -> None:
    """TP 2 x DP 4 -> DP 8 inside one DGX H100: each device holds half of its new state,
    and its tensor-parallel partner on the same node the other half."""
    topo = build_spec("dgx-h100")
    fab = fabric_of(topo)
    old = Placement(ParallelConfig(tp=2, dp=4), DDP, np.arange(8))
    new = Placement(ParallelConfig(dp=8), DDP, np.arange(8))
    r = reshard(G, old, new, fab)
    assert r.nvlink_bytes == pytest.approx(8 * P * X / 2)
    assert r.network_bytes == pytest.approx(0, abs=1e-6) and r.checkpoint_bytes == 0
    assert r.seconds == pytest.approx(P * X / 2 / fab.intra_bandwidth)


def test_a_lost_pipeline_rank_comes_from_the_checkpoint() -> None:
    """PP 2 on two nodes, node 1 removed: the second stage's state has no survivor."""
    topo = build_spec("dgx-h100,nodes=2")
    alive = np.arange(16) < 8
    old = Placement(ParallelConfig(pp=2, dp=8), DDP, np.arange(16))
    new = Placement(ParallelConfig(dp=8), DDP, np.arange(8))
    r = reshard(G, old, new, fabric_of(topo, alive))
    held = device_state_bytes(G, ParallelConfig(pp=2, dp=8), DDP)
    assert r.kept_bytes == pytest.approx(8 * held)  # each keeps its first stage
    assert r.checkpoint_bytes == pytest.approx(8 * (P * X - held))


def test_refuses_a_rank_on_a_removed_device() -> None:
    old = Placement(ParallelConfig(dp=2), DDP, np.arange(2))
    with pytest.raises(ShardplanError, match="surviving"):
        reshard(G, old, Placement(ParallelConfig(dp=2), DDP, np.arange(2)),
                _flat_fabric(2, alive=[0]))


def test_assignment_keeps_the_intact_replicas() -> None:
    """DP 4 over four nodes, node 1 removed, DP 2: the two new replicas go to intact nodes,
    and nothing moves."""
    topo = build_spec("dgx-h100,nodes=4")
    alive = ~np.isin(np.arange(32), np.arange(8, 16))
    old = Placement(ParallelConfig(tp=8, dp=4), DDP, np.arange(32))
    fab = fabric_of(topo, alive)
    nodes = np.arange(32).reshape(4, 8)[[0, 2, 3]]
    par = ParallelConfig(tp=8, dp=2)
    devices = assign_nodes(G, old, par, DDP, fab, nodes)
    assert set(devices.tolist()) <= set(nodes.reshape(-1).tolist())
    assert reshard(G, old, Placement(par, DDP, devices), fab).moved_bytes == 0


def test_assignment_follows_the_pipeline() -> None:
    """PP 4 on four nodes, reversed candidates: each stage goes back to its own node."""
    topo = build_spec("dgx-h100,nodes=4")
    old = Placement(ParallelConfig(tp=8, pp=4), DDP, np.arange(32))
    nodes = np.arange(32).reshape(4, 8)[::-1]
    devices = assign_nodes(G, old, ParallelConfig(tp=8, pp=4), DDP, fabric_of(topo), nodes)
    assert devices.tolist() == list(range(32))


def test_block_moves() -> None:
    moves = block_moves(G, ParallelConfig(pp=4), ParallelConfig(pp=2))
    assert moves[0] == {"pp": 0, "blocks": [[0, 1]], "from": {"0": [[0, 0]], "1": [[1, 1]]}}


@settings(max_examples=30, deadline=None)
@given(dp_old=st.sampled_from([1, 2, 4]), tp_old=st.sampled_from([1, 2]),
       pp_old=st.sampled_from([1, 2, 4]), dp_new=st.sampled_from([1, 2, 4]),
       tp_new=st.sampled_from([1, 2]), pp_new=st.sampled_from([1, 2]),
       zero_old=st.booleans(), zero_new=st.booleans(), dead=st.integers(0, 15))
def test_every_byte_is_kept_or_received(dp_old: int, tp_old: int, pp_old: int, dp_new: int,
                                        tp_new: int, pp_new: int, zero_old: bool,
                                        zero_new: bool, dead: int) -> None:
    """Kept + NVLink + network + checkpoint is the new layout's state, on any change."""
    topo = build_spec("dgx-h100,nodes=2")
    old_par = ParallelConfig(tp=tp_old, pp=pp_old, dp=dp_old)
    new_par = ParallelConfig(tp=tp_new, pp=pp_new, dp=dp_new)
    assume(old_par.world_size <= 16 and new_par.world_size <= 15)
    alive = np.arange(16) != dead
    survivors = np.flatnonzero(alive)[:new_par.world_size]
    old = Placement(old_par, ZERO1 if zero_old else DDP, np.arange(old_par.world_size))
    new = Placement(new_par, ZERO1 if zero_new else DDP, survivors)
    r = reshard(G, old, new, fabric_of(topo, alive))
    assert r.kept_bytes + r.moved_bytes == pytest.approx(r.state_bytes, rel=1e-9)
    assert min(r.per_rank["network"].min(), r.per_rank["nvlink"].min()) >= 0


def test_flat_topology_fabric() -> None:
    fab = fabric_of(flat(4, bandwidth=1e9))  # every device its own node, NCCL's share of V100
    assert fab.node.tolist() == [0, 1, 2, 3]
    assert fab.inter_bandwidth == fab.intra_bandwidth == pytest.approx(0.81 * 1e9, rel=0.01)
