"""Worker process pools that die with their parent and stop at once when it stops.

The searches that run in several processes (the sharding heuristic's restarts, the optimal
mapping's concurrent targets) take their pool from :func:`process_pool`:

- each worker ignores SIGINT (Ctrl-C is the parent's to answer) and takes SIGTERM's default
  action (a forked worker would otherwise inherit the command line's handler and survive it);
- each worker dies with its parent, even when the parent is killed with SIGKILL and runs no
  cleanup: on Linux the kernel sends it SIGKILL when the parent goes (``prctl`` with
  ``PR_SET_PDEATHSIG``, through ctypes); elsewhere a watchdog thread in the worker polls its
  parent id twice a second and exits when the parent is gone;
- when the block using the pool ends by an exception (KeyboardInterrupt, the SIGTERM the
  command line turns into one, an error), the workers are terminated at once instead of
  being waited for, so the parent answers within a fraction of a second; on a normal end the
  pool shuts down as usual.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

__all__ = ["mp_context", "process_pool"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_WATCH_SECONDS = 0.5


def mp_context() -> multiprocessing.context.BaseContext:
    """``fork`` on Linux (workers inherit the problem without pickling it), else ``spawn``."""
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _parent_death_signal() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); False when that
    is not available here."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(_WATCH_SECONDS)


def _init_worker(parent: int, initializer: Callable[..., Any] | None,
                 initargs: tuple[Any, ...]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not _parent_death_signal():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                         name="shardplan-parent-watch").start()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    if initializer is not None:
        initializer(*initargs)


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Stop the pool's workers now, without waiting for their tasks: SIGTERM, then SIGKILL
    after a second; then shut the pool down without waiting. The interrupt may have landed
    inside ``submit`` while it held the pool's lock: ``shutdown`` is skipped rather than
    waited for when the lock stays taken (the dead workers end the pool's thread anyway)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        with contextlib.suppress(Exception):
            p.terminate()
    end = time.monotonic() + 1.0
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(max(0.0, end - time.monotonic()))
            if p.is_alive():
                p.kill()
    lock = getattr(pool, "_shutdown_lock", None)
    if lock is None or lock.acquire(timeout=1.0):
        if lock is not None:
            lock.release()
        with contextlib.suppress(Exception):
            pool.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def process_pool(workers: int, *, initializer: Callable[..., Any] | None = None,
                 initargs: tuple[Any, ...] = ()) -> Iterator[ProcessPoolExecutor]:
    """A :class:`~concurrent.futures.ProcessPoolExecutor` of ``workers`` processes (see the
    module docstring): workers that die with this process, and that are terminated, not
    waited for, when the ``with`` block raises."""
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp_context(),
                               initializer=_init_worker,
                               initargs=(os.getpid(), initializer, initargs))
    try:
        yield pool
    except BaseException:
        _terminate(pool)
        raise
    pool.shutdown(wait=True, cancel_futures=True)
