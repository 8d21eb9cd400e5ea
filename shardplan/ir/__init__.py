"""Value objects of the contract: graphs, topologies, plans, and their JSON files."""

from shardplan.ir.graph import GRAPH_FORMAT, Edge, Graph, Node
from shardplan.ir.io import (
    dumps,
    load,
    load_graph,
    load_plan,
    load_topology,
    read_json,
    save,
    write_atomic,
    write_json,
)
from shardplan.ir.parallel import ParallelConfig
from shardplan.ir.plan import PLAN_FORMAT, STATUSES, Objective, Plan, Stage
from shardplan.ir.settings import ExecutionSettings
from shardplan.ir.topology import TOPOLOGY_FORMAT, Device, Level, Link, Topology

__all__ = [
    "GRAPH_FORMAT", "PLAN_FORMAT", "STATUSES", "TOPOLOGY_FORMAT", "Device", "Edge",
    "ExecutionSettings", "Graph",
    "Level", "Link", "Node", "Objective", "ParallelConfig", "Plan", "Stage", "Topology",
    "dumps", "load",
    "load_graph", "load_plan", "load_topology", "read_json", "save", "write_atomic",
    "write_json",
]
