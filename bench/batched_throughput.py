"""Training throughput of the batched executor against the exact per-client loop, side by side.

Workload: FMNIST IID, 100 clients × 600, 10 clients per round, E = 1, B = 50, per method in ``--methods``
(default FedAvg) on the FedAvg CNN, or on the method's own model (VIB methods: FedCR's VIB CNN). Both
executors train the very same round (same clients, seeds, global weights, the method's first server
payload) in this process, as one worker would: the exact path (a run's default executor) client after
client (``local.train_client``), the batched one as one group of 10 (``batched.train_group``). Rounds alternate
between the two, so a shared machine's load hits both alike. Figure: client-samples per second (median
over rounds). One line per method: ``ratio batched/exact <method> <ratio>``. ``--compile``: also the batched
executor with its step compiled (``resources.compile``; its compile time falls in the untimed first
round), and ``ratio compiled/batched <method> <ratio>``. ``--set K=V``: a config override for every path (e.g.
SimFAFL Table 2's SGD: ``--set training.momentum=0 --set training.grad_clip=10 --set training.batch_size=48``).

``--count``: instead of timing, count each path's host work per client-step: the aten ops it dispatches
(on a GPU, about one kernel launch each) and the Python function calls it makes. On a GPU a small model's
steps are bound by exactly this work, not by the arithmetic (issue 12: the H100's B0 steps were
host-bound), and the counts do not depend on the machine's speed, where a CPU's timings are dominated
by its arithmetic (on a GPU torch's foreach optimisers change the exact path's counts). Per step means
at the margin: a round of 3 epochs minus a round of 1, over the steps between, so a client's set-up and
result are left out; those are counted apart, as the ops of a round that do not grow with its steps (the
E = 1 round less its steps at the margin's rate: FedPAC-FedCR's class summaries, for one). Lines:
``ratio batched/exact <method> ops <x>`` and ``... calls <x>`` (below 1: a group step costs less host
work than its K exact steps). With ``--compile`` the compiled path too: its ops are the aten ops dispatched
outside the compiled graph plus the calls the graph's generated code makes to kernels (inductor's fused ones
and the aten ops it calls out to, e.g. convolutions: on a GPU a launch each), read from the profile since
dispatch does not see inside a graph; and ``ratio compiled/batched <method> ops <x>`` and ``... calls <x>``.

    python bench/batched_throughput.py [--methods fedavg ditto fedsam fedcr] [--rounds 3] [--threads 1]
                                       [--group 10] [--device cpu] [--count] [--compile] [--set K=V ...]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from fltune.config import build_config
from fltune.engine import batched
from fltune.engine.batched import client_groups, train_group
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data
from fltune.engine.local import Trainer, train_client
from fltune.engine.transfer import RoundInput
from fltune.engine.rng import round_clients
from fltune.methods import get_method

Train = Callable[[RoundInput, list[int]], None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["fedavg"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a worker's cpus_per_worker)")
    parser.add_argument("--group", type=int, default=10, help="resources.batch_clients")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--count", action="store_true", help="count ops and Python calls per step, don't time")
    parser.add_argument("--compile", action="store_true", help="also time the batched step compiled")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every path (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ratios = []
    for name in args.methods:
        if args.count:
            counts = step_counts(name, args.group, device, args.extra, args.compile)
            for path, (ops, calls, fixed) in counts.items():
                print(f"{name} {path:8s} {ops:7.1f} aten ops, {calls:7.1f} Python calls per client-step; "
                      f"{fixed:6.0f} aten ops a round besides")
            for i, what in enumerate(("ops", "calls")):
                ratios.append(f"ratio batched/exact {name} {what} {counts['batched'][i] / counts['exact'][i]:.3f}")
            if args.compile:
                for i, what in enumerate(("ops", "calls")):
                    ratios.append(f"ratio compiled/batched {name} {what} "
                                  f"{counts['compiled'][i] / counts['batched'][i]:.3f}")
            continue
        medians = method_rates(name, args.rounds, args.group, device, args.compile, args.extra)
        for path, value in medians.items():
            print(f"{name} {path:8s} {value:9.0f} client-samples/s")
        ratios.append(f"ratio batched/exact {name} {medians['batched'] / medians['exact']:.2f}")
        if args.compile:
            ratios.append(f"ratio compiled/batched {name} {medians['compiled'] / medians['batched']:.2f}")
    print("\n".join(ratios))


class Setup:
    """One method's round, ready for both executors: the same model, data, config and round inputs."""

    def __init__(
        self, name: str, group: int, device: torch.device, epochs: int = 1, subsample: float = 1.0,
        compiled: bool = False, extra: list[str] | None = None,
    ) -> None:
        model_name = get_method(name).model_for("fmnist") or "fedavg_cnn"
        self.cfg = cfg = build_config(overrides=[
            "data.dataset=fmnist", "partition.kind=iid", "federation.clients=100", "federation.fraction=0.1",
            f"method.name={name}", f"model.name={model_name}", f"training.local_epochs={epochs}",
            "training.batch_size=50", "tracking.enabled=false", f"data.subsample={subsample}", *(extra or []),
        ])
        self.data, self.method = data, method = load_data(cfg), build_method(cfg)
        model = build_model_for(cfg, data).to(device)
        self.start = initial_state(cfg, data)
        self.server = method.server_payload(method.init_server_state(self.start))
        tensors = {k: torch.tensor(v, device=device) for k, v in self.start.items()}
        trainer = Trainer.of(method, model, data, cfg.training, device, exact=True)  # a run's default executor

        def exact(inputs: RoundInput, clients: list[int]) -> None:
            for cid in clients:
                train_client(trainer, cid, inputs, {}, tensors)

        def batched(inputs: RoundInput, clients: list[int], compile_step: bool = False) -> None:
            for chunk in client_groups(clients, group):
                for _ in train_group(trainer, chunk, inputs, {}, tensors, compile_step):
                    pass

        self.train: dict[str, Train] = {"exact": exact, "batched": batched}
        if compiled:
            self.train["compiled"] = lambda inputs, clients: batched(inputs, clients, compile_step=True)

    def round(self, r: int) -> tuple[RoundInput, list[int], int]:
        """Round ``r``'s inputs (from the initial model), its clients and their samples."""
        fed = self.cfg.federation
        clients = round_clients(fed, r)
        inputs = RoundInput(round=r, seed=fed.seed, lr=self.cfg.training.lr, global_state=self.start,
                            server=self.server)
        return inputs, clients, sum(len(self.data.client_train[c]) for c in clients)


def method_rates(
    name: str, rounds: int, group: int, device: torch.device, compiled: bool, extra: list[str],
) -> dict[str, float]:
    """Median client-samples/s of the exact and the batched executor (and the compiled batched step) on
    ``rounds`` timed rounds."""
    setup = Setup(name, group, device, compiled=compiled, extra=extra)
    rates: dict[str, list[float]] = {path: [] for path in setup.train}
    for r in range(1, rounds + 2):  # round 1 warms both up and is not timed
        inputs, clients, samples = setup.round(r)
        for path, train in setup.train.items():
            began = time.perf_counter()
            train(inputs, clients)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if r > 1:
                rates[path].append(samples / (time.perf_counter() - began))
    return {path: statistics.median(values) for path, values in rates.items()}


class _Ops(TorchDispatchMode):
    """Counts the aten ops dispatched under it (what reaches the kernels, after vmap's batching rules)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def _graphs_unseen() -> Iterator[None]:
    """Compiled steps run outside the op counter: under a dispatch mode dynamo would run them eagerly (and
    the counter would count the eager ops)."""
    compile_step = batched.compile_step

    def unseen(step: Callable[..., Any]) -> Callable[..., Any]:
        compiled = compile_step(step)

        def run(*args: Any, **kwargs: Any) -> Any:
            with _disable_current_modes():
                return compiled(*args, **kwargs)
        return run

    with patch.object(batched, "compile_step", unseen):
        yield


KERNEL_HELPERS = "torch._C._dynamo.guards."
"""The generated code's own helpers (allocations, size and alignment asserts): not kernels."""


def _graph_kernels(stats: pstats.Stats) -> int:
    """Calls made by inductor's generated code (the modules in its cache folder) to anything but its helpers
    and Python: a compiled kernel (a builtin) or an aten op it calls out to, a launch each on a GPU."""
    folder = cache_dir()
    return sum(
        count for (file, _, name), (*_, callers) in stats.stats.items()  # type: ignore[attr-defined]
        if file == "~" and name.startswith("<built-in method") and KERNEL_HELPERS not in name
        for (caller, _, _), (count, *_) in callers.items() if caller.startswith(folder))


def step_counts(
    name: str, group: int, device: torch.device, extra: list[str], compiled: bool,
) -> dict[str, tuple[float, float, float]]:
    """Per path, (aten ops, Python calls) per client-step at the margin: round 2 with E = 3 minus with E = 1,
    over the client-steps between (round 1 warms up); then the aten ops of the E = 1 round that the margin
    leaves out (its clients' set-up and results). All of each client's data (600 samples, 12 steps an epoch
    at B 50, 13 at Table 2's 48): an epoch's set-up (its shuffles, its labels' gather, VIB's ε) is shared by
    its steps, so the counts per step depend on how many there are, and these are a paper run's. Ops and
    calls are counted in separate runs of the round, since the op counter is Python that the profiler would
    count."""
    totals: dict[str, list[tuple[int, float, int]]] = {}
    for epochs in (1, 3):
        setup = Setup(name, group, device, epochs, compiled=compiled, extra=extra)
        inputs, clients, _ = setup.round(2)
        size = setup.cfg.training.batch_size
        steps = epochs * sum(-(-len(setup.data.client_train[c]) // size) for c in clients)
        for path, train in setup.train.items():
            train(*setup.round(1)[:2])
            ops, profile = _Ops(), cProfile.Profile()
            with ops, _graphs_unseen():
                train(inputs, clients)
            profile.runcall(train, inputs, clients)
            stats = pstats.Stats(profile)
            totals.setdefault(path, []).append((steps, ops.count + _graph_kernels(stats), stats.total_calls))
    out = {}
    for path, (a, b) in totals.items():
        ops = (b[1] - a[1]) / (b[0] - a[0])
        out[path] = (ops, (b[2] - a[2]) / (b[0] - a[0]), a[1] - ops * a[0])
    return out


if __name__ == "__main__":
    main()
