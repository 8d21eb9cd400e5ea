"""Start N local processes (ranks), wait for all of them within a deadline, stop them all.

Shared by ``shardplan topology measure`` and ``shardplan train``: both spawn ranks that write
``rank{r}.err`` (a JSON object ``{"time", "error", ...}``) into a scratch directory when they
fail. No torch here: the targets import it in the children.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from shardplan.errors import ShardplanError

__all__ = ["read_rank_errors", "run_ranks", "settle"]

Failure = Callable[[Sequence[Any], int, float], str]


def run_ranks(target: Callable[..., None], args: Callable[[int], tuple[Any, ...]], nproc: int,
              *, timeout: float, what: str, failure: Failure, name: str = "shardplan-rank",
              hint: str = "") -> None:
    """Run ``target(*args(r))`` in ``nproc`` spawned processes and wait for all of them.

    Raises a one-line :class:`ShardplanError` when a rank exits non-zero (the text is
    ``failure(procs, rank, deadline)``) or when ``timeout`` seconds pass
    (``"<what> timed out after ..."`` followed by ``hint``). Every rank started is stopped
    before this returns or raises (terminate, then kill), so nothing is left running.
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args(r), daemon=True, name=f"{name}-{r}")
             for r in range(nproc)]
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        pending = {p.sentinel: r for r, p in enumerate(procs)}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                left = ", ".join(str(r) for r in sorted(pending.values()))
                raise ShardplanError(f"{what} timed out after {timeout:g} s "
                                     f"(rank{'s' if len(pending) > 1 else ''} {left} still "
                                     f"running){hint}")
            for sentinel in wait(list(pending), timeout=remaining):
                rank = pending.pop(sentinel)
                procs[rank].join()
                if procs[rank].exitcode != 0:
                    raise ShardplanError(failure(procs, rank, deadline))
    finally:
        started = [p for p in procs if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.terminate()
        for p in started:
            p.join(timeout=2.0)
            if p.is_alive():  # pragma: no cover - ignored SIGTERM
                p.kill()
                p.join()


def settle(procs: Sequence[Any], tmp: str, deadline: float, grace: float) -> None:
    """After one rank failed, give the others up to ``grace`` seconds to exit or write their
    error file: the first rank to exit is often a victim (its peer died)."""
    end = min(time.monotonic() + grace, deadline)
    while time.monotonic() < end and not all(
            not p.is_alive() or os.path.exists(os.path.join(tmp, f"rank{r}.err"))
            for r, p in enumerate(procs)):
        time.sleep(0.05)


def read_rank_errors(tmp: str, nproc: int) -> dict[int, dict[str, Any]]:
    """The error objects the ranks wrote, by rank (unreadable files are skipped)."""
    errors = {}
    for r in range(nproc):
        try:
            with open(os.path.join(tmp, f"rank{r}.err"), encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            errors[r] = data
    return errors
