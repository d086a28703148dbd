"""What a run costs as its clients grow, with every client's state present: peak memory, checkpoint bytes and
seconds per round at 100, 1,000 and 10,000 clients (issue 63).

Workload: SCAFFOLD (c_k per client) and Ditto (a personal model per client) with FedDyn's MLP on FMNIST
(synthetic data when FMNIST is missing), an IID split of the seeded share of the data that gives every client
6 samples (what 10,000 clients get of FMNIST's 60,000), so a round's training is the same work at every size;
10 clients a round on 2 workers (Ray actors, own local Ray), one local epoch, no evaluation (``metrics.every``
past the rounds measured). Round 1 trains its 10 clients; their
states then fill every other client's slot through the store's own write path (``ClientStore.update``, as
the round loop stores a round's states), as after a long run, and a checkpoint takes them all (the log's
first, full file). Then ``--rounds`` rounds, each followed by a checkpoint as a Tune trial writes it
(``write_states`` of ``state_dict``). Measured, each size in its own process: the peak of the summed PSS of
the whole process tree (the run's process, its Ray and its workers; read from /proc every 0.1 s) over the
measured rounds; the bytes a round's checkpoint writes (the trial's checkpoint file plus the store's new log
file); s/round with its checkpoint; and the seconds to partition the data. Last lines: ``memory_ratio``,
``checkpoint_ratio``, ``time_ratio``: the largest size over the smallest, the worst method first.

SCAFFOLD keeps its server c as a running sum (``method.server_mean=running``, the opt-in that reads only the
round's clients); ``--server-mean exact`` measures the default, which re-sums every client's c_k each round.

    python bench/client_scale.py [--methods scaffold,ditto] [--clients 100,1000,10000] [--rounds 3]
                                 [--server-mean running|exact]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MB = 2**20
SAMPLES = 6
"""Training samples per client."""
TRAIN = {"fmnist": 60000, "synthetic": 6000}


def tree_pss(root: int) -> int:
    """Bytes of PSS summed over ``root`` and every process below it (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += next(int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:"))
    return total


class Peak(threading.Thread):
    """The largest ``tree_pss`` of this process seen since the last ``reset``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0

    def run(self) -> None:
        import os

        while True:
            self.peak = max(self.peak, tree_pss(os.getpid()))
            time.sleep(0.1)

    def reset(self) -> None:
        self.peak = 0


def one(method: str, clients: int, rounds: int, dataset: str, server_mean: str) -> dict[str, float]:
    import ray

    from fltune.assembly import build_federation
    from fltune.config import build_config
    from fltune.engine.builders import load_data
    from fltune.methods import get_method
    from fltune.methods._drift import sum_over_clients
    from fltune.tune.trainable import STATE_FILE, write_states

    peak = Peak()
    peak.start()
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    cfg = build_config(overrides=[
        f"data.dataset={dataset}", f"data.subsample={min(1.0, clients * SAMPLES / TRAIN[dataset])}",
        "partition.kind=iid", f"metrics.every={rounds + 2}", "model.name=mlp", f"method.name={method}",
        f"federation.clients={clients}", f"federation.fraction={10 / clients}", f"federation.rounds={rounds + 2}",
        "training.local_epochs=1", "training.batch_size=10", "metrics.protocols=[global]",
        "resources.workers=2", "tracking.enabled=false",
        *([f"method.server_mean={server_mean}"] if "server_mean" in get_method(method).Params.model_fields else []),
    ])
    start = time.perf_counter()
    data = load_data(cfg)
    partition_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="client-scale-") as folder:
        fed = build_federation(cfg, data, folder=Path(folder) / "run")
        fed.open()
        fed.step()
        trained = [fed.client_store[cid] for cid in sorted(fed.client_store)]
        start = time.perf_counter()
        for first in range(0, clients, 256):
            fed.client_store.update({cid: trained[cid % len(trained)] for cid in range(first, min(first + 256, clients))
                                     if cid not in fed.client_store})
        if server_mean == "running":  # the running sums as training would leave them over the filled store
            fed.server_state = {**fed.server_state, **{
                name: sum_over_clients(fed.client_store, name.removesuffix("_sum"))[0]
                for name in fed.server_state if name.endswith("_sum")}}
        write_states(Path(tempfile.mkdtemp(dir=folder)), [fed.state_dict()])
        fill_s = time.perf_counter() - start
        log = Path(folder) / "run" / "clients" / "log"
        peak.reset()
        times, written = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            fed.step()
            checkpoint = Path(tempfile.mkdtemp(dir=folder))
            write_states(checkpoint, [fed.state_dict()])
            times.append(time.perf_counter() - start)
            entry = log / f"{fed.round:09d}.npz"
            written.append((checkpoint / STATE_FILE).stat().st_size + (entry.stat().st_size if entry.exists() else 0))
        memory = peak.peak
        fed.close()
    return {"peak_mb": memory / MB, "checkpoint_mb": sum(written) / len(written) / MB,
            "round_s": sum(times) / len(times), "partition_s": partition_s, "fill_s": fill_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="scaffold,ditto")
    parser.add_argument("--clients", default="100,1000,10000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server-mean", choices=["running", "exact"], default="running",
                        help="method.server_mean of the methods that have it (SCAFFOLD)")
    parser.add_argument("--one", nargs=3, metavar=("METHOD", "CLIENTS", "DATASET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.rounds, args.one[2], args.server_mean)))
        return
    from allmodel_transfer import dataset  # this folder is on the path when run as a script

    data = dataset()
    sizes = [int(n) for n in args.clients.split(",")]
    sizes = [n for n in sizes if n * SAMPLES <= TRAIN[data]]
    figures: dict[str, dict[int, dict[str, float]]] = {}
    print(f"dataset {data}, model mlp, 10 clients a round, {args.rounds} rounds, a checkpoint each, "
          f"server_mean {args.server_mean} (SCAFFOLD)")
    print(f"{'method':9} {'clients':>7} {'peak MB':>8} {'ckpt MB':>8} {'s/round':>8} {'partition s':>11} {'fill s':>7}")
    for method in args.methods.split(","):
        for n in sizes:
            run = subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), "--server-mean",
                                  args.server_mean, "--one", method, str(n), data], capture_output=True, text=True,
                                 check=True)
            row = figures.setdefault(method, {})[n] = json.loads(run.stdout.strip().splitlines()[-1])
            print(f"{method:9} {n:7d} {row['peak_mb']:8.0f} {row['checkpoint_mb']:8.2f} {row['round_s']:8.2f} "
                  f"{row['partition_s']:11.2f} {row['fill_s']:7.1f}", flush=True)
    low, high = sizes[0], sizes[-1]
    for name, key in (("memory_ratio", "peak_mb"), ("checkpoint_ratio", "checkpoint_mb"), ("time_ratio", "round_s")):
        ratios = {method: rows[high][key] / rows[low][key] for method, rows in figures.items()}
        worst = max(ratios.values())
        print(f"{name} {worst:.2f} ({', '.join(f'{m} {r:.2f}' for m, r in ratios.items())}; {high} over {low} clients)")


if __name__ == "__main__":
    main()
