"""Measure this machine: ``shardplan topology measure``.

Starts N local torch.distributed processes and times what the cost model needs: ping-pong
between every ordered pair (bandwidth and latency), collectives by size and group, and the
fixed costs of a training run on the runtime's own programs (operator dispatch, DTensor,
pipelining, FSDP gathers, optimizer steps). Returns a ``shardplan.topology/1``.

It runs the runtime, so it sits above it (``docs/architecture.md``): it may import the
runtime, capture, the workload, the strategy tables and :mod:`shardplan.topology`, whose
``build("measure", ...)`` it serves by registering :func:`measure` there on import. Only the
ranks import torch (inside the worker's functions); importing this package does not.

======================  =================================================================
module                  holds
======================  =================================================================
``_measure``            :func:`measure` (the parent: starts the ranks, fits the links, builds
                        the topology), :func:`fit_link`, :func:`reshard_overhead`
``_worker``             one rank: messages and collectives
``_overheads``          a rank's fixed costs of a training run
``_programs``           what the runtime's DTensor and pipelining programs add
``_timing``             shared sizes and :func:`typical_seconds`
======================  =================================================================
"""

from __future__ import annotations

from shardplan.measure._measure import BACKENDS, DEFAULT_SIZES, fit_link, measure, reshard_overhead
from shardplan.topology import register_builder

__all__ = ["BACKENDS", "DEFAULT_SIZES", "fit_link", "measure", "reshard_overhead"]

register_builder("measure", measure)
