"""Commands of the contract whose issue has not landed yet: each says so and exits 2."""

from __future__ import annotations

import argparse

from shardplan.errors import NotImplementedYetError

_PENDING = {
    "partition": ("partition a graph onto a topology", "#3 (paper 000) and #4 (Parmesan)"),
    "map": ("map a plan's stages onto devices", "#5 (Parmesan device mapping)"),
    "strategy": ("choose per-layer parallel strategies", "#7 (PaSE)"),
    "cost": ("evaluate a plan's objective", "#3 (sharding cost) and #5 (max-stage)"),
    "simulate": ("simulate a plan's training iteration", "#6 (simulator)"),
    "report": ("write an HTML report of a plan", "#6 (reports)"),
    "train": ("run a plan with torch.distributed", "#8 (runtime)"),
}


def register(sub: argparse._SubParsersAction, name: str) -> None:
    """Register command ``name``, whose own module does not exist yet."""
    what, issue = _PENDING[name]
    p = sub.add_parser(name, help=f"{what} (not built yet: issue {issue})",
                       description=f"{what}. Not built yet: issue {issue}.")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def handler(args: argparse.Namespace) -> int:
        raise NotImplementedYetError(f"'shardplan {name}' is not implemented yet "
                                     f"(issue {issue})")

    p.set_defaults(handler=handler)
