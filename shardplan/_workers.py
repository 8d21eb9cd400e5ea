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

The same searches run on a Ray cluster instead when given its address (:func:`executor` with
``ray=ADDRESS``; ``shardplan plan --ray``, ``partition --algorithm heuristic --ray``): every
task becomes a Ray task, returned as a :class:`concurrent.futures.Future`, so the search code is
the same for both. Tasks carry their deadlines as seconds left, never as a clock reading
(clocks of different machines do not agree), and results are combined in task order, so a
seed gives the same plan whatever the worker count or backend.
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
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

__all__ = ["RayExecutor", "executor", "mp_context", "process_pool", "ray_address"]

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
    # Futures the caller cancelled must not be in the pool's queue when the workers die:
    # Python 3.11's pool then sets an error on every queued future, and one already
    # cancelled raises InvalidStateError in the pool's thread (a traceback on stderr). Their
    # items stay (the pool's thread may be about to look one up by the id it took from its
    # queue: removing the item was a KeyError traceback there, `plan --time-limit` shorter
    # than the search); each gets a fresh future nobody waits on, which takes the error.
    # The pool's thread (taken now: ``shutdown`` forgets it) must also leave the interpreter's
    # exit hook, which would write to that thread's wake-up pipe while the thread, its
    # workers gone, closes it (an OSError traceback after Ctrl-C's one line, Python 3.11).
    import concurrent.futures.process as cf_process

    thread = getattr(pool, "_executor_manager_thread", None)
    wakeups = getattr(cf_process, "_threads_wakeups", None)
    if thread is not None and wakeups is not None:
        with contextlib.suppress(Exception):
            wakeups.pop(thread, None)
    items = getattr(pool, "_pending_work_items", None)
    if isinstance(items, dict):
        for item in list(items.values()):
            if item.future.cancelled():
                item.future = Future()
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
        pool.shutdown(wait=True, cancel_futures=True)  # (an interrupt here terminates too)
    except BaseException:
        _terminate(pool)
        raise


# --------------------------------------------------------------------------------- Ray
_SCALARS = (int, float, str, bytes, bool, type(None))


def _ray_call(n_init: int, initializer: Callable[..., Any] | None, *rest: Any) -> Any:
    """Body of every Ray task: the pool's initializer (cheap by contract: it stores its
    arguments), then the task's function."""
    init_args, fn, args = rest[:n_init], rest[n_init], rest[n_init + 1:]
    if initializer is not None:
        initializer(*init_args)
    return fn(*args)


def ray_address(address: str) -> tuple[str, int] | None:
    """The ``(host, port)`` a Ray address names (``HOST:PORT``, ``ray://HOST:PORT``, an IPv6
    host in brackets: ``[::1]:6379``), None for ``local`` and ``auto``; anything else (no
    host, a port that is not a number in 1..65535, whitespace) raises
    :class:`~shardplan.errors.ShardplanError` in one line."""
    from shardplan.errors import ShardplanError

    if address in ("local", "auto"):
        return None
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]") and ":" in host
    if bracketed:
        host = host[1:-1]
    if not (sep and host and port.isascii() and port.isdigit() and 0 < int(port) < 65536
            and not any(c.isspace() or c in "[]/" for c in host)
            and (bracketed or ":" not in host)):
        raise ShardplanError(f"--ray expects local, auto or HOST:PORT (port 1-65535), got "
                             f"{address!r}")
    return host, int(port)


def _check_reachable(address: str) -> None:
    """A ``HOST:PORT`` that accepts no connection: one line now, instead of Ray's minutes of
    retries."""
    import socket

    from shardplan.errors import ShardplanError

    target = ray_address(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=5) as conn:
            answers = _speaks_http2(conn)
    except OSError as exc:
        raise ShardplanError(f"cannot reach the Ray cluster at {address!r}: "
                             f"{exc.strerror or exc}") from None
    if not answers:  # Ray would retry for minutes, logging every attempt on stderr
        raise ShardplanError(f"cannot reach the Ray cluster at {address!r}: something "
                             f"listens there but does not answer as Ray's gRPC server does "
                             f"(within {_ANSWER_SECONDS:g} s)")


#: Seconds a Ray address has to answer the HTTP/2 greeting.
_ANSWER_SECONDS = 5.0


def _speaks_http2(conn: Any) -> bool:
    """Whether the peer of ``conn`` answers an HTTP/2 client greeting (the connection
    preface and an empty SETTINGS frame) with a SETTINGS frame within
    :data:`_ANSWER_SECONDS`, as every gRPC server (Ray's GCS, Ray Client) must (RFC 9113,
    section 3.4). A port that accepts connections but says nothing, or speaks another
    protocol, answers False."""
    conn.settimeout(_ANSWER_SECONDS)
    conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    head = b""
    try:
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                return False
            head += chunk
    except OSError:  # timed out or reset
        return False
    return head[3] == 4  # the frame type: SETTINGS


class RayExecutor:
    """Tasks on a Ray cluster behind the part of the :class:`~concurrent.futures.Executor`
    interface the searches use (``submit``, ``map``).

    Parameters
    ----------
    address : str
        ``local`` (start Ray in this process, with ``workers`` CPUs), ``auto`` (the cluster
        this machine belongs to) or a cluster address (``HOST:PORT``, ``ray://HOST:PORT``).
    workers : int
        CPUs of a local Ray; a cluster's own resources decide otherwise.
    initializer, initargs
        Run in a worker before its first task (as a process pool's initializer); the
        arguments go to Ray's object store once.

    Notes
    -----
    Large arguments repeated across tasks (a search's problem) are put in the object store
    once, keyed by identity. Ray is an optional dependency (``pip install 'shardplan[ray]'``);
    without it, one line says so.
    """

    def __init__(self, address: str, workers: int, initializer: Callable[..., Any] | None
                 = None, initargs: tuple[Any, ...] = ()) -> None:
        from shardplan.errors import ShardplanError

        ray_address(address)  # a malformed address is refused with or without Ray
        try:
            import ray
        except ImportError:
            raise ShardplanError("--ray needs Ray: pip install 'shardplan[ray]'") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            _check_reachable(address)
            kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                  "configure_logging": False}
            try:
                if address == "local":
                    ray.init(num_cpus=max(1, workers), **kw)
                else:
                    ray.init(address=address, **kw)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
                raise ShardplanError(f"cannot reach the Ray cluster at {address!r}: "
                                     f"{first}") from None
            self._started = True
        self._remote = ray.remote(num_cpus=1)(_ray_call)
        self._initializer = initializer
        self._init_refs = [ray.put(a) for a in initargs]
        self._kept: dict[int, tuple[Any, Any]] = {}
        self._refs: list[Any] = []

    def _arg(self, a: Any) -> Any:
        if isinstance(a, _SCALARS):
            return a
        got = self._kept.get(id(a))
        if got is None or got[0] is not a:
            got = (a, self._ray.put(a))
            self._kept[id(a)] = got
        return got[1]

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` as a Ray task; a :class:`concurrent.futures.Future` of its
        result."""
        ref = self._remote.remote(len(self._init_refs), self._initializer, *self._init_refs,
                                  fn, *(self._arg(a) for a in args))
        self._refs.append(ref)
        return ref.future()

    def map(self, fn: Callable[..., Any], *iterables: Any) -> Iterator[Any]:
        futures = [self.submit(fn, *args) for args in zip(*iterables, strict=True)]
        return (f.result() for f in futures)

    def cancel_all(self) -> None:
        """Cancel every task not finished (running ones are interrupted)."""
        for ref in self._refs:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)

    def close(self) -> None:
        self._kept.clear()
        self._refs.clear()
        if self._started:
            self._ray.shutdown()


@contextlib.contextmanager
def executor(workers: int, *, ray: str | None = None,
             initializer: Callable[..., Any] | None = None,
             initargs: tuple[Any, ...] = ()) -> Iterator[Any]:
    """:func:`process_pool` of ``workers`` processes, or a :class:`RayExecutor` on the
    cluster at ``ray`` when given; the block's exception cancels what is still running."""
    if ray is None:
        with process_pool(workers, initializer=initializer, initargs=initargs) as pool:
            yield pool
        return
    ex = RayExecutor(ray, workers, initializer, initargs)
    try:
        yield ex
    except BaseException:
        ex.cancel_all()
        raise
    finally:
        ex.close()
