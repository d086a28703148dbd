"""Where a run's work goes: the :class:`Pool` of client workers a ``Federation`` is handed, and how a round's
clients and a probe's tasks are dealt to its workers.

Why a protocol: the round loop only sends units of work — clients, evaluation batches, probe tasks — and gets
their results back in unit order. Whether the workers are Ray actors, this process or both (engine/pool.py),
which worker runs which unit, and how a call's arguments reach them (Ray's object store), is the pool's
business, so the loop imports no Ray. Results depend only on the units, never on which worker ran one:
every client's randomness is keyed by (seed, round, client id).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from fltune.config import ExperimentConfig
    from fltune.data.federated import FederatedData
    from fltune.engine.probes import ProbeTask

T = TypeVar("T")


class Pool(Protocol):
    """Client workers (``worker.ClientWorker``) serving the runs bound to them."""

    def width(self) -> int:
        """Workers: what a call's work is cut by (``units``)."""

    def bind(self, cfg: ExperimentConfig, data: FederatedData, keep_latest: bool) -> tuple[Any, FederatedData]:
        """A run's handle for ``map`` (held for the run's life), and its data as the workers read it, which
        the caller reads from then on (so the pool may keep one copy for all)."""

    def map(self, run: Any, method: str, units: list[list[Any]], *args: Any,
            per_unit: Callable[[list[Any]], Any] | None = None) -> Iterator[Any]:
        """``worker.method(run, *args, unit, per_unit(unit))`` for each unit, on whichever worker is free; the
        results in unit order, each as soon as it and those before it are done. ``args`` are the same for
        every call (sent once)."""

    def shutdown(self) -> None:
        """Stop the workers."""


def deal(pool: Pool, run: Any, tasks: Sequence[ProbeTask[T]]) -> list[T]:
    """Probe tasks on the pool's workers (``ClientWorker.compute``), one unit each; the results in task order."""
    return [result for part in pool.map(run, "compute", [[task] for task in tasks]) for result in part]


UNITS_PER_WORKER = 8
"""Units a call's work is cut into per worker (``units``) where one item is small (an evaluation batch): few
enough that a call's fixed cost stays small, enough that a late worker takes fewer of them."""

TRAINING_UNITS_PER_WORKER = 2
"""The same for a round's clients: a call costs more than a client's training would alone (measured:
docs/performance.md, "Start-up of `run`"), so the clients go out in about two units a worker, and a late
or slow worker still takes fewer."""


def units(items: list[Any], workers: int, per_worker: int = UNITS_PER_WORKER) -> list[list[Any]]:
    """``items`` cut in order into about ``per_worker`` units a worker."""
    size = max(1, -(-len(items) // (workers * per_worker)))
    return [items[start:start + size] for start in range(0, len(items), size)]
