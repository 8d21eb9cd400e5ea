"""Process pools that stop at once (shardplan/_workers.py)."""

from __future__ import annotations

import concurrent.futures.process as cf_process
import time

import pytest

from shardplan._workers import process_pool

pytestmark = pytest.mark.multiprocess


def test_interrupted_pool_leaves_the_exit_hook() -> None:
    """Ctrl-C inside the block: the workers are terminated, and the pool's thread leaves
    the interpreter's exit hook, which would otherwise write to the wake-up pipe the thread
    closes (an OSError traceback under the one-line message; the thread used to be looked
    up after ``shutdown`` had forgotten it, so it was never removed)."""
    seen = []
    with pytest.raises(KeyboardInterrupt), process_pool(1) as pool:
        pool.submit(time.sleep, 30)
        thread = pool._executor_manager_thread
        seen.append(thread)
        assert thread in cf_process._threads_wakeups
        raise KeyboardInterrupt
    assert seen[0] is not None and seen[0] not in cf_process._threads_wakeups
    seen[0].join(5.0)
    assert not seen[0].is_alive()
