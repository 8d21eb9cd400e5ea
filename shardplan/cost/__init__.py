"""The cost model shared by every planner and the simulator: time and memory of stages.

- compute: :func:`node_seconds`, :func:`stage_compute_seconds`,
  :func:`partition_compute_seconds` (measured seconds when the graph has them, else FLOPs at a
  fraction of the device's peak; Parmesan's c_u);
- communication: :func:`transfer_seconds` (latency + bytes / bandwidth of the routed pair),
  its matrix and elementwise forms, :func:`stage_traffic` and :func:`stage_transfer_seconds`
  (Parmesan's c_m), :func:`allreduce_seconds` (ring);
- memory: :func:`stage_memory_bytes`, :func:`partition_memory_bytes`,
  :func:`partition_memory_breakdown` (parameters, gradients, optimizer state, activations of
  the micro-batches in flight, :func:`in_flight_microbatches`);
- the sharding cost of paper 000 (section 2.1): :func:`sharding_cost`,
  :func:`sharding_terms`, :func:`weight_imbalance`, :func:`cross_edge_cost`;
- :func:`lower_bound_seconds`, and :class:`CostModel`, which bundles a graph, a topology and
  the execution settings with precomputed arrays for hot loops
  (:meth:`CostModel.from_settings`);
- the one stage-time model (:mod:`shardplan.cost._pipeline`): :func:`stage_times` gives a
  placed partition's per-replica compute, messages, all-reduce and memory
  (:class:`StageTimes`); equations 3, 6 and 7 of Parmesan and the simulator-consistent
  ``overlap`` objective are named views of it (:data:`VIEWS`, :func:`view_seconds`); the
  formulas themselves are written once in :mod:`shardplan.cost._formulas`.

Everything is NumPy: a whole partition is a few ``np.bincount`` over its assignment array.
"""

from shardplan.cost._compute import (
    loss_charge,
    matmul_peak_flops,
    node_seconds,
    partition_compute_seconds,
    roofline_seconds,
    split_work,
    stage_compute_seconds,
)
from shardplan.cost._formulas import (
    OPTIMIZER_FLOPS,
    message_seconds,
    optimizer_seconds,
    ring_allreduce_seconds,
    work_seconds,
)
from shardplan.cost._llm import (
    BlockLayout,
    LLMCosts,
    block_layout,
    llm_costs,
    precision_bytes,
    saved_bytes,
    stage_nodes,
)
from shardplan.cost._memory import (
    OPTIMIZER_STATE,
    SCHEDULES,
    in_flight_microbatches,
    optimizer_state_factor,
    partition_memory_breakdown,
    partition_memory_bytes,
    stage_memory_bytes,
)
from shardplan.cost._model import CostModel, lower_bound_seconds, plan_arrays
from shardplan.cost._pipeline import (
    OBJECTIVE_NAMES,
    VIEWS,
    StageTimes,
    pipeline_factor,
    stage_times,
    view_of_objective,
    view_seconds,
)
from shardplan.cost._sharding import (
    SHARDING_OBJECTIVE,
    component_weights,
    cross_edge_cost,
    plan_components,
    sharding_cost,
    sharding_terms,
    weight_imbalance,
)
from shardplan.cost._transfer import (
    allreduce_seconds,
    cut_tensors,
    inverse_bandwidth,
    stage_traffic,
    stage_transfer_seconds,
    transfer_seconds,
    transfer_seconds_matrix,
    transfer_seconds_pairs,
)

__all__ = [
    "OPTIMIZER_STATE", "SCHEDULES", "CostModel", "allreduce_seconds", "cut_tensors",
    "in_flight_microbatches", "inverse_bandwidth", "loss_charge", "lower_bound_seconds",
    "node_seconds",
    "optimizer_state_factor", "partition_compute_seconds", "partition_memory_breakdown",
    "partition_memory_bytes", "plan_arrays", "split_work", "stage_compute_seconds",
    "stage_memory_bytes", "stage_traffic", "stage_transfer_seconds", "transfer_seconds",
    "transfer_seconds_matrix", "transfer_seconds_pairs",
]
__all__ += ["OBJECTIVE_NAMES", "OPTIMIZER_FLOPS", "VIEWS", "StageTimes", "message_seconds",
            "optimizer_seconds", "pipeline_factor", "ring_allreduce_seconds", "roofline_seconds",
            "matmul_peak_flops",
    "stage_times",
            "view_of_objective", "view_seconds", "work_seconds"]
__all__ += ["SHARDING_OBJECTIVE", "component_weights", "cross_edge_cost", "plan_components",
            "sharding_cost", "sharding_terms", "weight_imbalance"]
__all__ += ["BlockLayout", "LLMCosts", "block_layout", "llm_costs", "precision_bytes",
            "saved_bytes", "stage_nodes"]
