"""The hash gate (issue 77): every built-in method and the MAN composites, two rounds of a tiny FMNIST run on
the ``exact`` executor (CPU, seed 0), hashed to the bit, against the hashes recorded on unchanged code.

A refactor of the method contract or the engine must leave every number a run computes as it was. Each
method's run is hashed in four parts (sha256 of dtype, shape and bytes of every array, keys sorted):

- ``global``: the final global state (every tensor of the state_dict);
- ``clients``: every client's kept state (Ditto's personal model, FedPer's head, SCAFFOLD's c_k, ...);
- ``server``: the method's server state (SCAFFOLD's c, FedCR's class Gaussians, ...);
- ``metrics``: each round's history, accuracies and losses of every protocol (global, all-model,
  personalised and its fine-tuned variant): timings (``*_s``) vary run to run and cost meters (``cost_*``)
  count declarations rather than training, so both are left out.

The runs go through the real round loop (``build_federation``, ``Federation.run``) on one client worker in
this process (``InProcessPool``; Ray only carries its arguments), or on ``--workers N`` Ray actors: a
run's bits depend on neither.

    PYTHONPATH=<tree> python bench/hash_gate.py            # compare with bench/tables/hash_gate.json
    PYTHONPATH=<tree> python bench/hash_gate.py --record   # write it (on unchanged code only)
    PYTHONPATH=<tree> python bench/hash_gate.py --only ditto,fedsol+man [--workers 2]

Last line ``identical N/M``; exit 1 when a method differs or is missing from the record, 2 on bad input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from rich.console import Console
from rich.table import Table

from fltune.assembly import build_federation
from fltune.config import ExperimentConfig, build_config
from fltune.data.federated import FederatedData
from fltune.engine.builders import load_data, torch_threads
from fltune.engine.dispatch import Pool
from fltune.engine.federation import Federation
from fltune.engine.pool import InProcessPool, WorkerPlan, WorkerPool
from fltune.errors import FLTuneError
from fltune.methods import METHODS, get_method

RECORD = Path(__file__).resolve().parent / "tables" / "hash_gate.json"
TINY = [
    "data.dataset=fmnist", "data.subsample=0.005", "partition.kind=dirichlet_prior", "partition.alpha=0.5",
    "partition.eval_fraction=0.2", "federation.clients=4", "federation.fraction=0.5", "federation.rounds=2",
    "training.local_epochs=1", "training.batch_size=16", "training.lr=0.05",
    "training.finetune_epochs=1", "tracking.enabled=false", "resources.executor=exact",
    "metrics.protocols=[global,all_model,personalized]",
]
"""300 FMNIST samples over 4 clients, 2 of them a round for 2 rounds (one client never trains, one trains
twice), a few local steps each; every protocol, fine-tuning included. Changing a line changes every hash."""
COMPOSITES = [f"{base}+man" for base in ("feddyn", "feddc", "fedsam", "fedasam", "fedspeed", "fedsol", "ditto")]
"""MAN on the MAN paper's other bases (``man`` is FedAvg's: the same bits as ``fedavg+man``), on FedSOL and on
Ditto (a modifier on a personal model's step)."""
PARTS = ("global", "clients", "server", "metrics")


def gate_methods() -> list[str]:
    """The 31 registered built-ins, then the 7 composites."""
    return [*sorted(METHODS), *COMPOSITES]


def gate_config(method: str, seed: int = 0) -> ExperimentConfig:
    """``TINY`` for ``method``; ResNet-56 methods on one block per stage, as the method tests train them."""
    small = ["model.options={blocks: 1}"] if get_method(method).default_model == "resnet56" else []
    return build_config(overrides=[*TINY, f"federation.seed={seed}", f"method.name={method}", *small])


def feed(digest: Any, value: Any) -> None:
    """Add ``value`` to ``digest`` canonically: mappings by sorted key, arrays and tensors as dtype, shape and
    bytes, floats as IEEE-754 doubles (so 0.1 + 0.2 and 0.3 differ), each tagged with its kind."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous().numpy()
    if isinstance(value, dict) or hasattr(value, "keys"):
        digest.update(b"{")
        for key in sorted(value.keys(), key=str):
            feed(digest, str(key))
            feed(digest, value[key])
        digest.update(b"}")
    elif isinstance(value, (list, tuple)):
        digest.update(b"[%d" % len(value))
        for item in value:
            feed(digest, item)
    elif isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        digest.update(f"a{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    elif isinstance(value, (bool, np.bool_)):
        digest.update(b"b1" if value else b"b0")
    elif isinstance(value, (int, np.integer)):
        digest.update(b"i%d" % int(value))
    elif isinstance(value, (float, np.floating)):
        digest.update(b"f" + struct.pack("<d", float(value)))
    elif isinstance(value, str) or value is None:
        digest.update(b"s" + repr(value).encode())
    else:
        raise TypeError(f"hash_gate: cannot hash a {type(value).__name__}")


def sha(value: Any) -> str:
    digest = hashlib.sha256()
    feed(digest, value)
    return digest.hexdigest()


def learned(history: Iterable[dict[str, float]]) -> list[dict[str, float]]:
    """Each round's metrics less its timings and cost meters (see the module docstring)."""
    return [{k: v for k, v in row.items() if not k.endswith("_s") and not k.startswith("cost_")} for row in history]


def hash_run(fed: Federation) -> dict[str, str]:
    """The four part hashes of a finished run, and ``hash``, theirs together."""
    parts = {
        "global": sha(fed.global_state),
        "clients": sha({cid: fed.client_store[cid] for cid in fed.client_store}),
        "server": sha(fed.server_state),
        "metrics": sha(learned(fed.history)),
    }
    return {"hash": sha(parts), **parts}


def run_method(method: str, data: FederatedData, pool: Pool, seed: int = 0) -> dict[str, str]:
    """Two rounds of ``method`` on ``data`` and ``pool``, hashed."""
    fed = build_federation(gate_config(method, seed), data, pool=pool)
    try:
        fed.run()
    finally:
        fed.close()
    return hash_run(fed)


def make_pool(workers: int) -> Pool:
    """0: one client worker in this process; N: N Ray actors of one CPU each (Ray started here if needed)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=max(1, workers), include_dashboard=False, configure_logging=False,
                 log_to_driver=False)
    return InProcessPool() if workers == 0 else WorkerPool(WorkerPlan(workers=workers, cpus=1.0, gpus=0.0))


def run_gate(methods: list[str], workers: int = 0, seed: int = 0) -> tuple[dict[str, dict[str, str]], dict[str, float]]:
    """Every method's hashes and seconds, the data loaded once (its partition depends on no method). One torch
    thread in this process too: its evaluations' kernels may round differently per thread count."""
    data = load_data(gate_config("fedavg", seed))
    pool = make_pool(workers)
    found, seconds = {}, {}
    try:
        for method in methods:
            began = time.perf_counter()
            with torch_threads(1):
                found[method] = run_method(method, data, pool, seed)
            seconds[method] = time.perf_counter() - began
    finally:
        pool.shutdown()
    return found, seconds


def commit_of(tree: Path) -> str:
    """The last commit that changed ``fltune/`` (the code hashed; a commit of bench or docs alone changes
    nothing), ``+dirty`` when its tracked files have changes since."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "-uno", "--", "fltune")
    return git("log", "-1", "--format=%h", "--", "fltune") + ("+dirty" if dirty else "")


def processor() -> str:
    """This machine's CPU model: torch picks its CPU kernels per instruction set, so bits hold per model."""
    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
             if line.startswith("model name")] if info.exists() else []
    return names[0] if names else platform.processor() or platform.machine()


def compare(found: dict[str, dict[str, str]], recorded: dict[str, dict[str, str]]) -> dict[str, str]:
    """Per method: ``identical``, ``not recorded`` or ``DIFFERS (parts)``."""
    verdicts = {}
    for method, hashes in found.items():
        old = recorded.get(method)
        if old is None:
            verdicts[method] = "not recorded"
        elif old["hash"] == hashes["hash"]:
            verdicts[method] = "identical"
        else:
            verdicts[method] = f"DIFFERS ({', '.join(p for p in PARTS if old.get(p) != hashes[p])})"
    return verdicts


def print_table(verdicts: dict[str, str], found: dict[str, dict[str, str]], seconds: dict[str, float]) -> None:
    table = Table(title="hash gate (exact executor, CPU)")
    for column in ("method", "verdict", "hash", "s"):
        table.add_column(column)
    for method, verdict in verdicts.items():
        style = "green" if verdict == "identical" else "bold red"
        table.add_row(method, f"[{style}]{verdict}[/]", found[method]["hash"][:12], f"{seconds[method]:.1f}")
    Console(width=100).print(table)


def parse_only(text: str | None) -> list[str]:
    """``--only``'s names, each checked to be a gate method; all of them when absent."""
    every = gate_methods()
    if text is None:
        return every
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in every]
    if unknown or not names:
        raise FLTuneError(f"--only: {', '.join(unknown) or 'no name'} is not a gate method; allowed: "
                          f"a comma-separated list of {', '.join(every)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help=f"write {RECORD.name} (all methods) instead of comparing")
    parser.add_argument("--only", help="comma-separated methods (default: all 38)")
    parser.add_argument("--workers", type=int, default=0, help="0: in this process (default); N: N Ray actors")
    parser.add_argument("--seed", type=int, default=0, help="federation.seed (the record's is 0)")
    args = parser.parse_args(argv)
    try:
        methods = parse_only(args.only)
        if args.record and args.only:
            raise FLTuneError("--record: writes all 38 methods' hashes on one commit; allowed without --only")
        if args.workers < 0:
            raise FLTuneError(f"--workers: {args.workers}; allowed: 0 (this process) or a positive count")
    except FLTuneError as err:
        print(f"hash_gate: {err}", file=sys.stderr)
        return 2
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the record is CPU's bits; torch reads this at CUDA's first use
    start = time.perf_counter()
    found, seconds = run_gate(methods, args.workers, args.seed)
    if args.record:
        record = {"commit": commit_of(RECORD.parents[2]), "torch": torch.__version__, "cpu": processor(),
                  "config": TINY, "methods": found}
        RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(found)} methods in {RECORD} ({time.perf_counter() - start:.0f} s)")
        return 0
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {"methods": {}}
    if record.get("cpu", processor()) != processor():
        print(f"recorded on {record['cpu']}, this is {processor()}: bits differ between CPU models; "
              "record on unchanged main here first (--record)")
    verdicts = compare(found, record["methods"])
    print_table(verdicts, found, seconds)
    same = sum(v == "identical" for v in verdicts.values())
    print(f"wall {time.perf_counter() - start:.0f} s")
    print(f"identical {same}/{len(verdicts)}")
    return 0 if same == len(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
