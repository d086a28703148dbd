"""Where a run's work goes: the :class:`Pool` of client workers, and how clients and probe tasks are dealt. Why a
protocol: the round loop only sends ``width()`` shards and gets results back in shard order, so it imports no Ray.
Results depend only on the shards: every client's randomness is keyed by (seed, round, client id)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from fltune.engine.batched import client_groups

if TYPE_CHECKING:
    from fltune.data.federated import FederatedData
    from fltune.engine.probes import ProbeTask
    from fltune.engine.worker import RunSpec

T = TypeVar("T")


class Pool(Protocol):
    """Client workers (``worker.ClientWorker``) serving the runs bound to them."""

    def width(self) -> int:
        """Shards a call is split into: one per worker."""

    def bind(self, spec: RunSpec) -> tuple[Any, FederatedData]:
        """A run's ``map`` handle (held for its life) and the workers' copy of its data, which the caller then reads."""

    def map(self, run: Any, method: str, shards: list[list[Any]], *args: Any,
            per_shard: Callable[[list[Any]], Any] | None = None) -> list[Any]:
        """``worker.method(run, *args, shard, per_shard(shard))`` on worker i for each non-empty shard i;
        the results in shard order. ``args`` are the same for every call (sent once)."""

    def shutdown(self) -> None:
        """Stop the workers."""


def deal(pool: Pool, run: Any, tasks: Sequence[ProbeTask[T]]) -> list[T]:
    """Probe tasks dealt to the workers in turn and run at once; the results in task order."""
    n = pool.width()
    parts = pool.map(run, "compute", [list(tasks[slot::n]) for slot in range(n)])  # empty ones last
    return [parts[i % n][i // n] for i in range(len(tasks))]


def balance(clients: list[int], sizes: list[int], workers: int, group: int = 1) -> list[list[int]]:
    """Longest-processing-time-first assignment of clients to workers (deterministic), in units of the
    batched executor's client groups (``group = 1``: single clients)."""
    shards: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    units = client_groups(clients, group)
    for unit in sorted(units, key=lambda u: (-sum(sizes[c] for c in u), u[0])):
        slot = min(range(workers), key=lambda i: (loads[i], i))
        shards[slot].extend(unit)
        loads[slot] += sum(sizes[c] for c in unit)
    return [sorted(s) for s in shards]
