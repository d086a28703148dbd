"""Shared fixtures: one real local Ray for the session, client actors shared per module, a real MLflow
sqlite store per test.

Tests that start Ray, a federation or a CLI subprocess, and the extended tier's, are marked ``slow`` here, so
``python -m pytest -m "not slow"`` is the fast loop (2 minutes); ``python -m pytest`` is the suite (15 minutes
on 2 cores); ``python -m pytest -m extended`` the second tier CI runs after it: a per-method property on every
method (the suite runs it on ``tests.methods.test_contract.CORE_METHODS``) and the longer fault, resume and
cluster paths whose property a test of the suite already proves on one path. A test that stays over ~2 s
without any of these is marked ``slow`` by hand (a method-wide one in the fast loop on ``CORE_METHODS`` only:
``each_method(others=pytest.mark.slow)``).

For a new test that needs them (they keep the suite within its 15 minutes on 2 cores):

- ``ray_session``: the session's one local Ray (2 CPUs), started once; a test that needs no cluster of its
  own (signals, crashes, several nodes do) runs on it, in-process (``fltune.cli.main``, Tune's ``fit``)
  rather than as a CLI subprocess that starts its own.
- ``pools``: the module's client actors: ``build_federation(cfg, pool=pools[2])`` runs on 2 warm actors,
  ``pools.with_driver(2)`` on 1 actor and this process, as ``run`` does by default. A run's numbers depend
  on its pool's worker count alone, so runs of any config share them; build a run without ``pool=`` only
  when the test is about how a run makes its own.
- ``mlflow_uri``: a fresh sqlite store, exported for subprocesses; ``needs_fmnist``: skips without the data.
- Sizes: 1-3 rounds, 3-10 clients, ``data.subsample`` ≤ 0.05 (a few hundred samples), the MLP or the
  FedAvg CNN (ResNet-56 methods on ``model.options={blocks: 1}``). A property of every method is checked once
  per method, in the extended tier outside ``CORE_METHODS`` (``tests/methods/test_contract.py``: sound and learning; ``tests/engine/test_federation.py``:
  bits on 1 or 2 workers and resumed, on each executor that trains it differently), not again per file.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from fltune.engine.pool import WorkerPlan, WorkerPool

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
needs_fmnist = pytest.mark.skipif(
    not (FMNIST_DIR / "train-images-idx3-ubyte.gz").exists(),
    reason="real FMNIST missing: apt-get install dataset-fashion-mnist",
)


def storages(obj: object) -> set[int]:
    """Where the tensors among ``obj``'s fields keep their data: which copy of a dataset it reads."""
    return {t.untyped_storage().data_ptr() for t in vars(obj).values() if hasattr(t, "untyped_storage")}


RAY_FIXTURES = frozenset({"ray_session", "two_nodes"})
"""Fixtures that start Ray (a test using one, directly or through another fixture, is slow)."""
SPAWNS = frozenset({"subprocess", "Popen", "multiprocessing"})
"""Names whose use in a test, or in a test helper it calls, means it starts a process (the CLI, a Ray node)."""


def _spawns(func: Callable, depth: int = 2) -> bool:
    """Whether ``func`` refers to ``subprocess``, or calls a function of the test tree that does."""
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    names = set(code.co_names)
    names.update(n for c in code.co_consts if isinstance(c, types.CodeType) for n in c.co_names)
    if names & SPAWNS:
        return True
    if depth == 0:
        return False
    scope = getattr(func, "__globals__", {})
    return any(
        inspect.isfunction(f) and f.__module__.startswith("tests") and _spawns(f, depth - 1)
        for f in (scope.get(n) for n in names)
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that starts Ray (through a Ray fixture) or spawns a process, and every test of
    the extended tier (``-m "not slow"`` is the fast loop: it runs neither)."""
    for item in items:
        function = getattr(item, "function", None)
        if (RAY_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("extended")
                or (function is not None and _spawns(function))):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fast_tests_start_no_ray(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test left out of ``slow`` that starts Ray in this process (the engine starts it and leaves it
    running) fails, so the fast loop stays fast and a missed marking shows at once."""

    def ray_up() -> bool:
        return "ray" in sys.modules and sys.modules["ray"].is_initialized()

    before = ray_up()
    yield
    if not before and ray_up() and request.node.get_closest_marker("slow") is None:
        pytest.fail("this test starts Ray: use the ray_session fixture (which marks it slow) or mark it slow")


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray with 2 CPUs, shared by the engine tests and shut down at the end.

    ``address="local"``: always a new instance of the tests' own, never one found through $RAY_ADDRESS or
    another user's ``ray start`` on the same machine (whose CPUs and load are not ours to count on).
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False,
                 log_to_driver=False)
    yield ray
    ray.shutdown()


class SharedPools:
    """Client actors shared by a test module's runs, started when first asked for and planned as a run of
    its own would be (a GPU share where there is one) at half a CPU each: ``pools[n]``, ``n`` actors;
    ``pools.with_driver(n)``, ``n`` workers of which worker 0 is this process (``WorkerPlan.in_driver``,
    what ``run`` on its own Ray does by default), so a run on it also checks a share trained in the driver
    against an actor's bits.

    Why: starting a torch worker process costs seconds, a tiny run a fraction of that, and a run's results
    depend only on its pool's worker count (``Federation``'s ``pool``); reused actors also check that nothing
    one run leaves in them changes the next one's numbers."""

    def __init__(self, cluster: dict[str, float]) -> None:
        self.cluster = cluster
        self.made: dict[WorkerPlan, WorkerPool] = {}

    def __getitem__(self, workers: int) -> WorkerPool:
        from fltune.config import build_config
        from fltune.engine.pool import plan_workers

        cfg = build_config(overrides=[f"resources.workers={workers}", "resources.cpus_per_worker=0.5"])
        return self._pool(plan_workers(cfg, self.cluster))

    def with_driver(self, workers: int) -> WorkerPool:
        """No GPU share: fltune refuses a driver's share beside GPU workers (``plan_workers``)."""
        from fltune.engine.pool import WorkerPlan

        return self._pool(WorkerPlan(workers=workers, cpus=0.5, gpus=0.0, in_driver=True))

    def _pool(self, plan: WorkerPlan) -> WorkerPool:
        from fltune.engine.pool import WorkerPool

        if plan not in self.made:
            self.made[plan] = WorkerPool(plan)
        return self.made[plan]


@pytest.fixture(scope="module")
def pools(ray_session) -> Iterator[SharedPools]:
    """This module's shared client actors (``SharedPools``), stopped when the module ends."""
    shared = SharedPools(ray_session.cluster_resources())
    yield shared
    for pool in shared.made.values():
        pool.shutdown()


@pytest.fixture()
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh sqlite MLflow store under tmp_path, also exported for subprocesses."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """Each test ends with the SIGINT and SIGTERM handlers it started with. A test that runs Tune's ``fit``
    itself (fltune's jobs put their handlers back: ``process.signal_handlers_kept``) leaves Tune's SIGINT
    handler installed, and the process's signal tests that ran after it found a SIGTERM handed to that stale
    handler: the suite's outcome depended on its order."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        if handler is not None:  # None: installed outside Python, which Python cannot put back
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def _partition_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep partition caches of tests out of the user's home."""
    monkeypatch.setenv("FLTUNE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
