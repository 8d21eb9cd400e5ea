"""Helpers shared by the tests."""

from __future__ import annotations

from collections.abc import Sequence

from shardplan.cli.main import main


def run_cli(argv: Sequence[str]) -> int:
    """Run the real ``shardplan`` command line in-process; returns its exit status
    (argparse's own exits included)."""
    try:
        return main(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
