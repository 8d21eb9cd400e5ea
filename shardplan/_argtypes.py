"""Argument types shared by the command line (:mod:`shardplan.cli`) and the runtime's own
entry point (``python -m shardplan.runtime``, which must not import the CLI): each turns a
flag's text into a value or raises :class:`argparse.ArgumentTypeError` with one line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["nonnegative_int", "positive_float", "positive_int", "ray_address"]


def _parse(text: str, convert: Callable[[str], Any], ok: Callable[[Any], bool],
           expected: str) -> Any:
    """``convert(text)`` when it parses and passes ``ok``, else one line: ``expected ...``."""
    try:
        v = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(v):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    return int(_parse(text, int, lambda v: v >= 1, "a positive integer"))


def nonnegative_int(text: str) -> int:
    return int(_parse(text, int, lambda v: v >= 0, "an integer >= 0"))


def positive_float(text: str) -> float:
    return float(_parse(text, float, lambda v: v > 0 and v != float("inf"),
                        "a positive number"))


def ray_address(text: str) -> str:
    """A ``--ray`` address (``local``, ``auto``, ``HOST:PORT``), checked by
    :func:`shardplan._workers.ray_address`."""
    from shardplan._workers import ray_address as parse
    from shardplan.errors import ShardplanError

    try:
        parse(text)
    except ShardplanError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--ray ")) from None
    return text
