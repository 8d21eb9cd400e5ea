"""``shardplan``: the command line, a thin layer over the Python API.

Each command lives in its own module of this package with a ``register(subparsers)`` function
that adds its parser and sets ``handler``. Errors a user can cause are
:class:`~shardplan.errors.ShardplanError` and end as one line on stderr with exit status 2.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from shardplan.cli._common import OneLineParser
from shardplan.errors import ShardplanError

__all__ = ["build_parser", "main"]

# Order of the commands in --help; each is the module ``shardplan.cli.<name>``.
_COMMAND_MODULES = (
    "capture", "inspect", "importer", "generate", "topology", "partition", "map", "strategy",
    "cost", "simulate", "report", "train", "demo",
)


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="shardplan",
        description="Plan how to train a PyTorch model on many devices: capture its graph, "
                    "partition, map onto a topology, simulate, run.",
    )
    from shardplan import __version__

    parser.add_argument("--version", action="version", version=f"shardplan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name in _COMMAND_MODULES:
        importlib.import_module(f"shardplan.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 user error)."""
    # One thread per process: with 2 cores, oversubscription makes torch 15-70x slower.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.handler(args)
    except ShardplanError as exc:
        sys.stderr.write(f"shardplan: error: {exc}\n")
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a file that cannot be read or written: the user's to fix
        where = f": {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"shardplan: error: {exc.strerror or exc}{where}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("shardplan: error: interrupted\n")
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
