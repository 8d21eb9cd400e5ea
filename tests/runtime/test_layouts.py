"""A strategy's layouts on a device mesh (torch-free): mesh shapes, mesh axes per split
dimension, placements of the tensors an operator reads, and the plans the runtime refuses
before any process starts."""

from __future__ import annotations

import pytest

from shardplan.errors import ShardplanError
from shardplan.ir import Graph
from shardplan.runtime._sharding import (
    NodeSharding,
    arg_groups,
    mesh_shape,
    node_shardings,
    placements,
    prime_factors,
    strategy_notes,
)


def test_prime_factors_and_mesh_shape() -> None:
    assert prime_factors(12) == [3, 2, 2]
    assert prime_factors(7) == [7]
    assert prime_factors(1) == []
    assert mesh_shape(1) == (1,)
    assert mesh_shape(2) == (2,)
    assert mesh_shape(4) == (2, 2)
    assert mesh_shape(6) == (3, 2)
    assert mesh_shape(8) == (2, 2, 2)
    with pytest.raises(ShardplanError):
        mesh_shape(0)


def _linear_chain() -> Graph:
    """linear (8x16 <- 8x32) -> relu -> linear (8x4 <- 8x16), spaces as capture writes."""
    spaces = (
        {"kind": "gemm", "dims": [["d0", 8], ["n", 16], ["k", 32]], "output": [["d0"], ["n"]],
         "output_shape": [8, 16], "inputs": {}, "m": ["d0"], "n": ["n"], "k": ["k"],
         "weight": ["n", "k"]},
        {"kind": "elementwise", "dims": [["d0", 8], ["d1", 16]], "output": [["d0"], ["d1"]],
         "output_shape": [8, 16], "inputs": {"0": [["d0"], ["d1"]]}},
        {"kind": "gemm", "dims": [["d0", 8], ["n", 4], ["k", 16]], "output": [["d0"], ["n"]],
         "output_shape": [8, 4], "inputs": {"1": [["d0"], ["k"]]}, "m": ["d0"], "n": ["n"],
         "k": ["k"], "weight": ["n", "k"]},
    )
    return Graph.from_arrays(name="chain", batch_size=8, fwd_flops=[1.0, 1.0, 1.0],
                             src=[0, 1], dst=[1, 2], names=["linear", "relu", "linear_1"],
                             ops=["linear", "relu", "linear"], spaces=spaces)


def test_axes_follow_the_producer() -> None:
    """On a 2x2 mesh: the first layer splits its batch over one axis and its output
    features over the other; the relu reads that tensor and keeps both axes; the second
    layer's reduced dimension is the relu's split feature dimension: same axis."""
    g = _linear_chain()
    strategy = {"0": (2, 2, 1), "1": (2, 2), "2": (1, 1, 2)}
    sh = node_shardings(g, strategy, [((0, 1, 2), 4)])
    assert [s.name for s in sh] == ["linear", "relu", "linear_1"]
    a, b, c = sh
    assert a.axes == ((0,), (1,), ())
    assert b.axes == ((0,), (1,))  # preferred: the producer's axes for the same tensor dims
    assert c.axes == ((), (), (1,))  # k reads the relu's feature dimension (axis 1)
    # Placements per mesh axis: tensor dim sharded, or -1 (replicated).
    assert placements(a, a.output, 2) == (0, 1)
    assert placements(c, c.input_groups("relu"), 2) == (-1, 1)
    assert placements(c, c.output, 2) == (-1, -1)  # a split k gives partial sums (DTensor)


def test_factor_four_takes_two_axes() -> None:
    g = _linear_chain()
    sh = node_shardings(g, {"0": (4, 1, 1), "1": (1, 4), "2": (1, 1, 1)}, [((0, 1, 2), 4)])
    assert sh[0].axes == ((0, 1), (), ())
    assert placements(sh[0], sh[0].output, 2) == (0, 0)  # dim 0 split over both axes
    assert sh[1].axes == ((), (0, 1))


def test_refusals() -> None:
    g = _linear_chain()
    stage = [((0, 1, 2), 4)]
    with pytest.raises(ShardplanError, match="no configuration for node 2"):
        node_shardings(g, {"0": (1, 1, 1), "1": (1, 1)}, stage)
    with pytest.raises(ShardplanError, match="has 2 factors, its space 3"):
        node_shardings(g, {"0": (1, 1), "1": (1, 1), "2": (1, 1, 1)}, stage)
    with pytest.raises(ShardplanError, match="uses 8 devices, its stage has 4"):
        node_shardings(g, {"0": (8, 1, 1), "1": (1, 1), "2": (1, 1, 1)}, stage)


def test_factor_the_mesh_lacks() -> None:
    """A split of 3 on 4 devices (a 2 x 2 mesh) runs unsplit, and a note says so; on 6
    devices (3 x 2) it is laid out as planned."""
    space = {"kind": "elementwise", "dims": [["d0", 12], ["d1", 6]],
             "output": [["d0"], ["d1"]], "output_shape": [12, 6], "inputs": {}}
    g = Graph.from_arrays(name="one", batch_size=12, fwd_flops=[1.0], src=[], dst=[],
                          names=["relu"], ops=["relu"], spaces=(space,))
    (cut,) = node_shardings(g, {"0": (3, 1)}, [((0,), 4)])
    assert cut.factors == (1, 1) and cut.planned == (3, 1) and cut.axes == ((), ())
    (notes,) = strategy_notes([cut])
    assert "1 configuration split by a factor the device mesh has no axes for runs with the " \
           "largest split it has (relu [3, 1] -> [1, 1])" in notes
    (six,) = node_shardings(g, {"0": (6, 2)}, [((0,), 12)])  # 3 x 2 x 2: 6 = 3 x 2
    assert six.factors == (6, 2) and six.planned is None and six.axes == ((0, 1), (2,))
    (part,) = node_shardings(g, {"0": (6, 1)}, [((0,), 8)])  # 2 x 2 x 2: 6 -> 2
    assert part.factors == (2, 1) and part.planned == (6, 1)
    (ok,) = node_shardings(g, {"0": (3, 2)}, [((0,), 6)])
    assert ok.axes == ((0,), (1,)) and ok.planned is None


def test_arg_groups_follow_the_operator() -> None:
    """Parameters and operands the space does not describe: linear's weight is (n, k) and
    its bias (n); addmm's weight (k, n); an embedding table (v, n); a broadcast operand takes
    the output's dimensions where its sizes match."""
    lin = NodeSharding(name="linear", op="linear", kind="gemm", dims=("d0", "d1", "n", "k"),
                       factors=(1, 1, 2, 1), axes=((), (), (0,), ()),
                       output=(("d0",), ("d1",), ("n",)))
    assert arg_groups(lin, 1, (16, 32), (8, 4, 16)) == (("n",), ("k",))
    assert arg_groups(lin, 2, (16,), (8, 4, 16)) == (("n",),)
    assert arg_groups(lin, 0, (8, 4, 32), (8, 4, 16)) == (("d0",), ("d1",), ("k",))
    mm = NodeSharding(name="addmm", op="addmm", kind="gemm", dims=("d0", "n", "k"),
                      factors=(1, 1, 2), axes=((), (), (0,)), output=(("d0",), ("n",)))
    assert arg_groups(mm, 2, (32, 16), (8, 16)) == (("k",), ("n",))
    assert arg_groups(mm, 1, (8, 32), (8, 16)) == (("d0",), ("k",))
    assert placements(mm, arg_groups(mm, 2, (32, 16), (8, 16)), 1) == (0,)
    emb = NodeSharding(name="embedding", op="embedding", kind="gemm",
                       dims=("d0", "d1", "n", "v"), factors=(1, 1, 1, 2),
                       axes=((), (), (), (0,)), output=(("d0",), ("d1",), ("n",)))
    assert arg_groups(emb, 0, (64, 32), (8, 4, 32)) == (("v",), ("n",))
    assert arg_groups(emb, 1, (8, 4), (8, 4, 32)) == (("d0",), ("d1",))
    add = NodeSharding(name="add", op="add", kind="elementwise", dims=("d0", "d1", "d2"),
                       factors=(2, 1, 1), axes=((0,), (), ()),
                       output=(("d0",), ("d1",), ("d2",)))
    assert arg_groups(add, 1, (4, 32), (8, 4, 32)) == (("d1",), ("d2",))
    assert arg_groups(add, 1, (1, 4, 32), (8, 4, 32)) == ((), ("d1",), ("d2",))
    ln = NodeSharding(name="layer_norm", op="layer_norm", kind="norm",
                      dims=("d0", "d1", "d2"), factors=(1, 1, 1), axes=((), (), ()),
                      output=(("d0",), ("d1",), ("d2",)))
    assert arg_groups(ln, 2, (32,), (8, 4, 32)) == (("d2",),)


def test_operators_without_a_space_split_their_batch_only() -> None:
    sdpa = NodeSharding(name="sdpa", op="scaled_dot_product_attention", kind="",
                        dims=("batch",), factors=(2,), axes=((0,),))
    assert arg_groups(sdpa, 0, (8, 2, 4, 16), (8, 2, 4, 16)) == (("batch",), (), (), ())
    assert arg_groups(sdpa, 3, (1, 1, 4, 4), (8, 2, 4, 16)) == ((), (), (), ())
    assert placements(sdpa, (("batch",), (), (), ()), 1) == (0,)
    notes = strategy_notes([sdpa])
    assert len(notes) == 1 and "1 operator without an iteration space (sdpa)" in notes[0]
    assert strategy_notes([]) == []


def test_captured_graph_layouts_use_producer_mappings() -> None:
    """Every node of a graph with spaces gets a layout; the strategy plan of the pase
    search on a generated PaSE benchmark lays out on 4 devices."""
    from shardplan import registry
    from shardplan.generate import generate
    from shardplan.topology import flat

    g = generate("alexnet")
    plan = registry.run("strategy", "pase", g, flat(4), devices=4).plan
    sh = node_shardings(g, plan.strategy, [(plan.stages[0].nodes, 4)])
    assert len(sh) == g.num_nodes
    for s in sh:
        used = [a for axes in s.axes for a in axes]
        assert len(used) == len(set(used))  # an axis splits one dimension
        prod = 1
        for f in s.factors:
            prod *= f
        assert prod == 2 ** len(used)


def test_vocabulary_split_over_one_axis() -> None:
    """DTensor's vocabulary-parallel embedding takes one mesh axis: a split of 4 over a 2 x 2
    mesh runs as 2, and is noted."""
    space = {"kind": "gemm", "dims": [["d0", 4], ["d1", 8], ["n", 16], ["v", 64]],
             "output": [["d0"], ["d1"], ["n"]], "output_shape": [4, 8, 16], "inputs": {},
             "m": ["d0", "d1"], "n": ["n"], "k": ["v"], "weight": ["v", "n"]}
    g = Graph.from_arrays(name="emb", batch_size=4, fwd_flops=[1.0], src=[], dst=[],
                          names=["embedding"], ops=["embedding"], spaces=(space,))
    (sh,) = node_shardings(g, {"0": (1, 1, 1, 4)}, [((0,), 4)])
    assert sh.factors == (1, 1, 1, 2) and sh.planned == (1, 1, 1, 4)
    assert sh.axes == ((), (), (), (0,))
    (two,) = node_shardings(g, {"0": (2, 1, 1, 2)}, [((0,), 4)])
    assert two.planned is None and len(two.axes[3]) == 1


def test_batch_split_is_cut_to_the_micro_batch() -> None:
    """A plan made at batch 8 splits the batch over 4 devices; a run at micro-batch 1 or 6
    splits it by what divides the micro-batch (1, 2), keeps the other dimensions' splits,
    and says so; at micro-batch 4 nothing changes. A merged (batch x seq) leading dimension
    scales with the batch."""
    g = _linear_chain()
    strategy = {"0": (4, 1, 1), "1": (2, 2), "2": (2, 1, 2)}
    plain = node_shardings(g, strategy, [((0, 1, 2), 4)])
    for run, want in ((4, plain), (8, plain), (None, plain)):
        assert node_shardings(g, strategy, [((0, 1, 2), 4)], run_batch=run) == want
    one = node_shardings(g, strategy, [((0, 1, 2), 4)], run_batch=1)
    assert [s.factors for s in one] == [(1, 1, 1), (1, 2), (1, 1, 2)]
    assert [s.planned for s in one] == [(4, 1, 1), (2, 2), (2, 1, 2)]
    assert all(s.batch_cut for s in one) and one[1].axes[1] and one[2].axes[2]
    six = node_shardings(g, strategy, [((0, 1, 2), 4)], run_batch=6)
    assert [s.factors for s in six] == [(2, 1, 1), (2, 2), (2, 1, 2)]
    assert [s.planned for s in six] == [(4, 1, 1), None, None]
    (note,) = strategy_notes(six)
    assert note.startswith("1 configuration split the batch by a factor that does not divide "
                           "the micro-batch") and "linear [4, 1, 1] -> [2, 1, 1]" in note
    merged = {"kind": "gemm", "dims": [["d0", 64], ["n", 4], ["k", 16]],
              "output": [["d0"], ["n"]], "output_shape": [64, 4], "inputs": {},
              "m": ["d0"], "n": ["n"], "k": ["k"], "weight": ["n", "k"]}
    gm = Graph.from_arrays(name="m", batch_size=8, fwd_flops=[1.0], src=[], dst=[],
                           names=["addmm"], ops=["addmm"], spaces=(merged,))
    (sh,) = node_shardings(gm, {"0": (4, 1, 1)}, [((0,), 4)], run_batch=1)  # 8 rows
    assert sh.factors == (4, 1, 1) and sh.planned is None
