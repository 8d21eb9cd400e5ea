"""The local launcher: one spawned process per rank, a run of several configs, failure
handling. No torch here: the ranks import it; the launcher only waits.

Ranks meet through a ``FileStore`` in a temporary directory (no ports to pick). Each rank
writes ``rank{r}.json`` (its results, atomically), ``rank{r}.err`` (when and why it failed)
and ``rank{r}.log`` (its stdout and stderr, so that torch's warnings stay out of the user's
terminal); rank 0 writes the parameters tests ask for to ``params.pt`` (read back
weights-only). The parent waits on all of them: the first rank to exit with an error stops
the others (SIGTERM, then SIGKILL) and the run fails with one line naming the rank that
failed first; a run exceeding its time limit fails the same way. A dead rank therefore never
hangs the run: its peers see the broken connection or the process-group timeout, and the
parent sees its exit at once. SIGTERM or SIGHUP to the launcher stops the ranks and removes
the temporary directory (:class:`shardplan._ranks.Terminated`); if the launcher is killed
outright, its ranks die with it (parent-death signal).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from typing import Any

from shardplan._ranks import read_rank_errors, run_ranks, settle
from shardplan.errors import ShardplanError
from shardplan.ir.io import write_atomic
from shardplan.runtime._config import RunResult

__all__ = ["launch", "rank_main"]

_GRACE = 3.0


def _write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def rank_main(rank: int, world: int, configs: list[Any], tmpdir: str) -> None:
    """Body of one spawned rank: join the group, run every config in turn, write results.

    Exits through ``os._exit`` once its results are written, as ``topology measure``'s
    ranks do, so that no interpreter teardown can fail a finished run: a standalone gloo
    script here aborted at exit (``terminate called without an active exception``), and
    one FSDP calibration run had a rank killed by SIGABRT, which three more runs did not
    reproduce (so where that one died is not known)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["LOCAL_RANK"] = str(rank)  # one host: CUDA device = rank modulo GPU count
    if sys.platform.startswith("linux") and os.path.exists("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    fd = os.open(os.path.join(tmpdir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        import torch
        import torch.distributed as dist

        from shardplan.runtime._worker import init_distributed, run_config

        torch.set_num_threads(1)
        timeout = max(c.timeout for c in configs)
        init_distributed(rank, world, os.path.join(tmpdir, "store"), timeout)
        results = []
        for cfg in configs:
            res = run_config(cfg, rank, world)
            results.append(res)
            dist.barrier()
        if rank == 0:
            if any(r.params is not None for r in results):
                tmp = os.path.join(tmpdir, "params.pt.tmp")
                torch.save([r.params for r in results], tmp)
                os.replace(tmp, os.path.join(tmpdir, "params.pt"))
            _write(os.path.join(tmpdir, "rank0.json"),
                   json.dumps([r.to_dict() for r in results]).encode())
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
        first = (str(exc).strip().splitlines() or [""])[0]
        kind = "" if isinstance(exc, ShardplanError) else f"{type(exc).__name__}: "
        err = {"time": time.time(), "error": f"{kind}{first[:300]}",
               "user_error": isinstance(exc, ShardplanError),
               "traceback": traceback.format_exc()}
        _write(os.path.join(tmpdir, f"rank{rank}.err"), json.dumps(err).encode())
        sys.stderr.write(err["traceback"])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(configs: Sequence[Any], nproc: int, *, time_limit: float | None = None,
           keep_logs: str | None = None) -> list[RunResult]:
    """Run ``configs`` one after another on ``nproc`` fresh local processes.

    Parameters
    ----------
    configs : sequence of TrainConfig
        Every config's ``world_size`` must be ``nproc`` (``single`` runs on rank 0 alone).
    nproc : int
    time_limit : float, optional
        Seconds for the whole launch (default: the largest config timeout plus a minute per
        config).
    keep_logs : str, optional
        Copy the ranks' logs into this directory.

    Returns
    -------
    list of RunResult
        Rank 0's result of each config.

    Raises
    ------
    ShardplanError
        A rank failed (the first to fail is named, with its error), or the time ran out.
    Terminated
        SIGTERM or SIGHUP: the ranks were stopped and the temporary directory removed.
    """
    if nproc < 1:
        raise ShardplanError("a run needs at least one process")
    limit = time_limit or (max(c.timeout for c in configs) + 60.0 * len(configs))
    with tempfile.TemporaryDirectory(prefix="shardplan-train-") as tmp:
        try:
            run_ranks(rank_main, lambda r: (r, nproc, list(configs), tmp), nproc,
                      timeout=limit, what="training",
                      failure=lambda procs, rank, deadline: _failure(procs, rank, tmp,
                                                                     deadline))
        finally:
            if keep_logs:
                os.makedirs(keep_logs, exist_ok=True)
                for r in range(nproc):
                    src = os.path.join(tmp, f"rank{r}.log")
                    if os.path.exists(src):
                        with open(src, "rb") as fh:
                            write_atomic(os.path.join(keep_logs, f"rank{r}.log"), fh.read())
        with open(os.path.join(tmp, "rank0.json"), encoding="utf-8") as fh:
            results = [RunResult.from_dict(d) for d in json.load(fh)]
        params_path = os.path.join(tmp, "params.pt")
        if os.path.exists(params_path):  # tests only: torch is imported for them
            import torch

            for res, params in zip(results, torch.load(params_path, weights_only=True),
                                   strict=True):
                res.params = params
        return results


def _failure(procs: Sequence[Any], rank: int, tmp: str, deadline: float) -> str:
    """One line naming the rank that failed first and why."""
    settle(procs, tmp, deadline, _GRACE)
    errors = read_rank_errors(tmp, len(procs))
    silent = [r for r, p in enumerate(procs) if r not in errors and p.exitcode not in (0, None)]
    if silent:  # killed or crashed without a word: the cause; its peers are victims
        dead = rank if rank in silent else silent[0]
        code = procs[dead].exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 \
            else f"exited with code {code}"
        return f"training failed: rank {dead} {how}; the other ranks were stopped"
    users = [r for r in errors if errors[r].get("user_error")]
    pool = users or list(errors)
    first = min(pool, key=lambda r: float(errors[r].get("time", 0.0)))
    return f"training failed on rank {first}: {errors[first]['error']}"
