"""Argument types shared by the command line (:mod:`shardplan.cli`) and the runtime's own
entry point (``python -m shardplan.runtime``, which must not import the CLI): each turns a
flag's text into a value or raises :class:`argparse.ArgumentTypeError` with one line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["byte_size", "nonnegative_int", "positive_float", "positive_int", "ray_address",
           "size_int"]


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


def size_int(kind: str) -> Callable[[str], int]:
    """A positive integer within :data:`shardplan._limits.LIMITS` for ``kind`` (argparse
    names the flag before the one line saying why)."""
    def parse(text: str) -> int:
        from shardplan._limits import check_size
        from shardplan.errors import ShardplanError

        v = positive_int(text)
        try:
            check_size("", v, kind)
        except ShardplanError as exc:
            raise argparse.ArgumentTypeError(str(exc).strip()) from None
        return v

    parse.__name__ = f"{kind}_size"
    return parse


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6,
          "mib": 2**20, "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12,
          "tib": 2**40, "p": 2**50, "pb": 10**15, "pib": 2**50}


def byte_size(text: str) -> float:
    """``16GiB``, ``1.5e10``, ``512MB``, ``80 GB`` -> bytes (KB/MB/GB/TB powers of 1000,
    KiB/MiB/GiB/TiB and K/M/G/T of 1024): the same units everywhere a size of memory is
    given (``--memory-limit``, ``--memory-bytes``, ``--gpu-memory``, ``gpu_memory=``), at
    most :data:`shardplan._limits.LIMITS` ``memory``."""
    import math

    t = text.strip().lower().replace(" ", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a size like 16GiB or 1.5e10, got "
                                         f"{text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    from shardplan._limits import check_size
    from shardplan.errors import ShardplanError

    try:
        check_size("", value, "memory")
    except ShardplanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


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
