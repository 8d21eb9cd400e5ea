""":class:`shardplan._workers.RayExecutor` against a stand-in for Ray (no Ray needed): how it
starts or joins a cluster, what it sends once, what comes back, and what it stops. The real
cluster is tested in ``test_workers_ray.py`` (skipped without Ray)."""

from __future__ import annotations

import sys
from concurrent.futures import Future

import pytest

from shardplan._workers import RayExecutor, executor
from shardplan.errors import ShardplanError


class _Ref:
    def __init__(self, value):
        self.value = value

    def future(self) -> Future:
        f: Future = Future()
        f.set_result(self.value)
        return f


class _FakeRay:
    """Runs each task at once in this process; records what the executor asked of it."""

    def __init__(self, initialized: bool = False, fail: Exception | None = None) -> None:
        self.initialized = initialized
        self.fail = fail
        self.inits: list[dict] = []
        self.puts: list[object] = []
        self.cancelled: list[tuple[object, bool]] = []
        self.shutdowns = 0
        self.options: list[dict] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **kw):
        self.inits.append(kw)
        if self.fail is not None:
            raise self.fail
        self.initialized = True

    def remote(self, **options):
        self.options.append(options)
        fake = self

        class _Remote:
            def __init__(self, fn):
                self.fn = fn

            def remote(self, *args):
                values = [a.value if isinstance(a, _Ref) else a for a in args]
                ref = _Ref(self.fn(*values))
                fake.submitted.append(ref)
                return ref

        return _Remote

    submitted: list[_Ref]

    def put(self, obj) -> _Ref:
        self.puts.append(obj)
        return _Ref(obj)

    def cancel(self, ref, force: bool = False) -> None:
        self.cancelled.append((ref, force))
        if len(self.cancelled) == 1:
            raise RuntimeError("already finished")  # Ray's complaint: ignored

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.initialized = False


@pytest.fixture
def fake_ray(monkeypatch):
    def make(**kw) -> _FakeRay:
        ray = _FakeRay(**kw)
        ray.submitted = []
        monkeypatch.setitem(sys.modules, "ray", ray)
        return ray

    return make


_SEEN: list[tuple] = []


def _remember(*args) -> None:
    _SEEN.append(args)


def _total(xs: list[int], k: int) -> tuple[int, list]:
    return sum(xs) * k, list(_SEEN)


def test_local_starts_ray_with_the_workers_cpus_and_stops_it(fake_ray):
    ray = fake_ray()
    ex = RayExecutor("local", 3)
    assert [kw["num_cpus"] for kw in ray.inits] == [3] and "address" not in ray.inits[0]
    assert ray.options == [{"num_cpus": 1}]  # one CPU per task
    ex.close()
    assert ray.shutdowns == 1
    RayExecutor("local", 0).close()
    assert ray.inits[-1]["num_cpus"] == 1


def test_an_address_joins_that_cluster(fake_ray):
    ray = fake_ray()
    RayExecutor("auto", 3).close()
    assert ray.inits[0]["address"] == "auto" and "num_cpus" not in ray.inits[0]


def test_a_running_ray_is_used_and_left_running(fake_ray):
    ray = fake_ray(initialized=True)
    ex = RayExecutor("nowhere-reachable.invalid:1", 2)  # not dialled: Ray is up already
    assert ray.inits == []
    ex.close()
    assert ray.shutdowns == 0


@pytest.mark.parametrize("error", [ConnectionError("refused\nretrying..."),
                                   RuntimeError("refused"), ValueError("refused")])
def test_a_failed_start_is_one_line(fake_ray, error):
    fake_ray(fail=error)
    with pytest.raises(ShardplanError,
                       match=r"^cannot reach the Ray cluster at 'auto': refused$"):
        RayExecutor("auto", 1)


def test_tasks_get_the_initializer_and_large_arguments_once(fake_ray):
    ray = fake_ray()
    _SEEN.clear()
    big = [1, 2, 3]
    ex = RayExecutor("local", 2, initializer=_remember, initargs=({"ctx": 1}, "tag"))
    assert ray.puts == [{"ctx": 1}, "tag"]  # the initializer's arguments, once
    f1 = ex.submit(_total, big, 2)
    f2 = ex.submit(_total, big, 3)
    assert f1.result() == (12, [({"ctx": 1}, "tag")])
    assert f2.result()[0] == 18
    assert ray.puts[2:] == [big]  # the list is put once, the scalars never
    other = [1, 2, 3]  # equal, but another object: put again
    assert ex.submit(_total, other, 1).result()[0] == 6 and ray.puts[3:] == [other]
    assert [r[0] for r in ex.map(_total, [[1], [2, 2]], [10, 100])] == [10, 400]
    assert _SEEN == [({"ctx": 1}, "tag")] * 5  # before each task
    with pytest.raises(ValueError):  # iterables of different lengths
        list(ex.map(_total, [[1]], [1, 2]))
    ex.close()


def test_no_initializer(fake_ray):
    fake_ray()
    with executor(1, ray="local") as ex:
        assert ex.submit(divmod, 7, 2).result() == (3, 1)


def test_the_block_raising_cancels_every_task_and_stops_ray(fake_ray):
    ray = fake_ray()
    with pytest.raises(KeyError), executor(2, ray="local") as ex:
        ex.submit(divmod, 7, 2)
        ex.submit(divmod, 9, 2)
        raise KeyError("stop")
    assert [force for _, force in ray.cancelled] == [True, True]  # the first one raised
    assert [r for r, _ in ray.cancelled] == ray.submitted
    assert ray.shutdowns == 1


def test_a_normal_end_cancels_nothing(fake_ray):
    ray = fake_ray()
    with executor(2, ray="local") as ex:
        ex.submit(divmod, 7, 2)
    assert ray.cancelled == [] and ray.shutdowns == 1


def test_without_ray_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    with pytest.raises(ShardplanError,
                       match=r"^--ray needs Ray: pip install 'shardplan\[ray\]'$"):
        RayExecutor("local", 1)


def test_a_failed_start_without_a_message_names_the_error(fake_ray):
    fake_ray(fail=ConnectionError())
    with pytest.raises(ShardplanError, match="cannot reach the Ray cluster at 'auto': .*"
                                             "ConnectionError"):
        RayExecutor("auto", 1)


QUIET = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}


def test_ray_is_started_and_joined_quietly(fake_ray):
    """No dashboard, no worker logs on the command line's stderr, Ray's logging left alone:
    for a local Ray and a cluster alike."""
    ray = fake_ray()
    RayExecutor("local", 2).close()
    RayExecutor("auto", 2).close()
    assert ray.inits == [{"num_cpus": 2, **QUIET}, {"address": "auto", **QUIET}]


def test_mp_context_forks_on_linux_only(monkeypatch):
    import multiprocessing

    from shardplan import _workers

    monkeypatch.setattr(_workers.sys, "platform", "linux")
    # fork itself, even when the process's default start method is another one
    default = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    try:
        assert _workers.mp_context().get_start_method() == "fork"
    finally:
        multiprocessing.set_start_method(default, force=True)
    monkeypatch.setattr(_workers.sys, "platform", "darwin")  # fork exists, but is unsafe
    assert _workers.mp_context().get_start_method() == "spawn"
    monkeypatch.setattr(_workers.sys, "platform", "linux")
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert _workers.mp_context().get_start_method() == "spawn"
