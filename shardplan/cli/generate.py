"""``shardplan generate KIND``: write a synthetic graph (layered, chain, random-dag)."""

from __future__ import annotations

import argparse

from shardplan.cli._common import (
    add_output,
    declare_files,
    emit,
    nonnegative_float,
    nonnegative_int,
    positive_int,
)
from shardplan.errors import ShardplanError
from shardplan.generate import BENCHMARKS, GENERATORS, generate, generator_options

__all__ = ["register"]

# argparse dest -> (generator keyword, flag as the user typed it).
_OPTIONS = {
    "nodes": ("num_nodes", "--nodes"),
    "seed": ("seed", "--seed"),
    "width": ("width", "--width"),
    "first_width": ("first_width", "--first-width"),
    "max_fanin": ("max_fanin", "--max-fanin"),
    "skip_probability": ("skip_probability", "--skip-probability"),
    "dangling": ("dangling", "--dangling"),
    "edge_probability": ("edge_probability", "--edge-probability"),
    "avg_degree": ("avg_degree", "--avg-degree"),
    "weight_low": ("weight_low", "--weight-low"),
    "weight_high": ("weight_high", "--weight-high"),
    "params_per_weight": ("params_per_weight", "--params-per-weight"),
    "batch_size": ("batch_size", "--batch-size"),
    "name": ("name", "--name"),
}


def _probability(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text!r}") \
            from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text!r}")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``generate`` command to ``sub``."""
    kinds = [*GENERATORS, *BENCHMARKS]
    p = sub.add_parser(
        "generate", help="write a synthetic graph (layered, chain, random-dag)",
        description="Write a seeded synthetic computation graph. layered: random layered DAG "
                    "like paper 000's experiments (defaults: 1001 nodes = 1 input + 10 layers "
                    "of 100); chain: a path; random-dag: each edge i->j (i<j) with probability "
                    "p. Node FLOPs and bytes follow from random integer weights (a dense layer "
                    "per node). alexnet, inception-v3, rnnlm, transformer: the PaSE paper's "
                    "benchmarks with iteration spaces (fixed sizes; --batch-size, --name).")
    p.add_argument("kind", choices=kinds, metavar="KIND", help=" | ".join(kinds))
    p.add_argument("--nodes", type=positive_int, help="number of nodes (layered: 1001, "
                   "others: 100)")
    p.add_argument("--seed", type=nonnegative_int, help="random seed (default 0)")
    g = p.add_argument_group("layered")
    g.add_argument("--width", type=positive_int, help="nodes per layer (default 100)")
    g.add_argument("--first-width", type=positive_int,
                   help="nodes in the first layer (default 1: one input node)")
    g.add_argument("--max-fanin", type=positive_int,
                   help="most predecessors from the previous layer (default 3)")
    g.add_argument("--skip-probability", type=_probability,
                   help="probability of a skip edge per node of layer >= 2 (default 0)")
    g.add_argument("--dangling", action="store_true", default=None,
                   help="allow outputs no one reads outside the last layer")
    r = p.add_argument_group("random-dag")
    r.add_argument("--edge-probability", type=_probability, help="p of each edge i->j")
    r.add_argument("--avg-degree", type=nonnegative_float,
                   help="mean in+out degree (default 4; instead of --edge-probability)")
    a = p.add_argument_group("node attributes (every kind)")
    a.add_argument("--weight-low", type=nonnegative_int, help="lowest weight (default 1)")
    a.add_argument("--weight-high", type=nonnegative_int, help="highest weight (default 10)")
    a.add_argument("--params-per-weight", type=nonnegative_float,
                   help="parameters per unit of weight (default 1e6)")
    a.add_argument("--batch-size", type=positive_int,
                   help="batch size of the FLOPs and activations (default 32)")
    a.add_argument("--name", help="graph name (default KIND-N)")
    add_output(p)
    declare_files(p, outputs=("output",))
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    kind = args.kind
    takes = generator_options(kind)
    options = {}
    for dest, (key, flag) in _OPTIONS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if key not in takes:
            raise ShardplanError(f"{flag} does not apply to 'generate {kind}'")
        options[key] = value
    if not getattr(args, "output", None) and not getattr(args, "json", False):
        raise ShardplanError("say where the graph goes: -o FILE or --json")
    graph = generate(kind, **options)
    emit(args, graph, what="graph")
    return 0
