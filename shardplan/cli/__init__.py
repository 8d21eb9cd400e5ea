"""The ``shardplan`` command line."""

from shardplan.cli.main import main

__all__ = ["main"]
