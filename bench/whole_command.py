"""The whole ``python cli.py run …`` command against a tight single-process PyTorch loop, start to exit.

Workload (issue 12, item 4): FedAvg, FMNIST IID, 100 clients × 600, 10 per round, E = 1, B = 50, global
evaluation every round, 5 rounds. Both sides are timed as subprocesses from spawn to exit (imports, data
loading, Ray start-up, MLflow, shutdown included), in pairs run back to back, and the process tree's
resident memory (the process plus every descendant: Ray's GCS, raylet and workers) is sampled every
0.2 s from /proc. The tight loop trains the same clients on the same samples in one process with every
core and evaluates the global model on the test set after every round. Last lines: ``ratio <cmd/tight>``
(median wall clock; goal ≤ 1.15), ``memory_ratio`` (peak tree RSS), ``memory_ratio_pss``
(peak tree PSS, shared pages counted once: see ``tree_memory``) and ``memory_pss_gb`` (the command's peak
tree PSS in 10^9 bytes; goal ≤ 2). Sizes elsewhere print in GiB (2^30 bytes). At the command's
peak, its PSS is also split by part (``part``): the driver, the client workers and Ray's own services.

    python bench/whole_command.py [--pairs 3] [--rounds 5] [--before /path/to/older/checkout] [--set K=V ...]

``--before``: also time that checkout's command in every pair (a third run, same conditions), so a change
is measured before and after in one run on a shared machine (``ratio_before``). ``--set``: a config
override added to the command (and to ``--before``'s), to weigh a setting such as the resources plan.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")


def command(rounds: int, mlflow_uri: str, repo: Path = REPO, extra: tuple[str, ...] = ()) -> list[str]:
    """The issue's CPU workload as a user types it (in the checkout ``repo``), plus ``--set`` overrides
    ``extra`` (e.g. a resources setting to weigh)."""
    return [
        sys.executable, str(repo / "cli.py"), "run", "--method", "fedavg", "--dataset", "fmnist", "--partition",
        "iid", "--clients", "100", "--fraction", "0.1", "--rounds", str(rounds), "--local-epochs", "1",
        "--batch-size", "50", "--seed", "0", "--set", "metrics.protocols=[global]", "--set", "metrics.every=1",
        "--set", f"tracking.uri={mlflow_uri}", *(arg for item in extra for arg in ("--set", item)),
    ]


def tree_memory(root: int) -> tuple[int, int, dict[str, int]]:
    """(RSS, PSS, PSS by part) bytes of ``root`` and all its descendants (read from /proc; vanished
    processes count 0).

    RSS counts a page shared by several processes once per process: every Ray worker maps the same torch
    libraries (~0.5 GB resident each for the CUDA build), so the summed RSS overstates what the tree holds.
    PSS splits each shared page among its sharers: its sum is the memory the tree really occupies."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    rss, parts, todo = 0, dict.fromkeys(("driver", "workers", "ray"), 0), [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
            parts[_part(pid, root)] += _pss_kib(Path(f"/proc/{pid}/smaps_rollup").read_text()) * 1024
        except OSError:
            pass
    return rss, sum(parts.values()), parts


def _part(pid: int, root: int) -> str:
    """The command's own process, a Ray worker process (client actors, and idle workers Ray keeps ready
    to become one) or one of Ray's services (GCS, raylet, dashboard, agents, monitors)."""
    if pid == root:
        return "driver"
    name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    return "workers" if name.startswith((b"ray::ClientWorker", b"ray::IDLE")) else "ray"


def _pss_kib(smaps_rollup: str) -> int:
    return next((int(line.split()[1]) for line in smaps_rollup.splitlines() if line.startswith("Pss:")), 0)


Run = tuple[float, float, float, list[tuple[float, str]], dict[str, float]]


def measure(argv: list[str], env: dict[str, str]) -> Run:
    """(wall seconds from spawn to exit, peak tree RSS and PSS in GiB, (seconds since spawn, line) of its
    output, the PSS by part in GiB at the PSS peak)."""
    lines: list[tuple[float, str]] = []
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO, text=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - start, line.rstrip()))

    reader = threading.Thread(target=read)
    reader.start()
    peak_rss = peak_pss = 0
    peak_parts: dict[str, int] = {}
    while proc.poll() is None:
        rss, pss, parts = tree_memory(proc.pid)
        peak_rss = max(peak_rss, rss)
        if pss > peak_pss:
            peak_pss, peak_parts = pss, parts
        time.sleep(0.2)
    wall = time.perf_counter() - start
    reader.join()
    if proc.returncode != 0:
        sys.exit(f"{argv[1]} exited {proc.returncode}:\n" + "\n".join(line for _, line in lines[-20:]))
    return wall, peak_rss / 2**30, peak_pss / 2**30, lines, {k: v / 2**30 for k, v in peak_parts.items()}


def timeline(lines: list[tuple[float, str]], wall: float) -> str:
    """When the header and each round's line appeared, and the exit: where the command's time goes."""
    marks = [f"{'header' if line.startswith('fltune run') else line.split()[1]} {t:.1f}"
             for t, line in lines if line.startswith(("fltune run", "round "))]
    return "  ".join([*marks, f"exit {wall:.1f}"])


def tight_loop(rounds: int) -> None:
    """The reference: round_overhead.py's plain-PyTorch FedAvg round (same clients, samples and steps as
    fltune's), then the global model on the test set after every round."""
    sys.path.insert(0, str(REPO / "bench"))
    import torch
    from round_overhead import tight_round

    from fltune.config import build_config
    from fltune.data.augment import to_float
    from fltune.engine.builders import build_model_for, initial_state, load_data
    from fltune.engine.rng import sample_clients

    cfg = build_config(overrides=[
        "method.name=fedavg", "data.dataset=fmnist", "partition.kind=iid", "federation.clients=100",
        "federation.fraction=0.1", f"federation.rounds={rounds}", "training.local_epochs=1",
        "training.batch_size=50", "tracking.enabled=false",
    ])
    torch.set_num_threads(os.cpu_count() or 1)
    data = load_data(cfg)
    model = build_model_for(cfg, data)
    global_state = {k: torch.tensor(v) for k, v in initial_state(cfg, data).items()}
    fed = cfg.federation
    for r in range(1, fed.rounds + 1):
        clients = sample_clients(fed.seed, r, fed.clients, fed.clients_per_round)
        global_state = tight_round(model, data, global_state, clients, cfg.training)
        model.load_state_dict(global_state)
        model.eval()
        correct = 0
        with torch.no_grad():
            for s in range(0, len(data.test_y), 1000):
                logits = model(to_float(data.test_x[s:s + 1000], data.mean, data.std))
                correct += int((logits.argmax(1) == data.test_y[s:s + 1000]).sum())
        print(f"round {r} acc_global={correct / len(data.test_y):.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", type=Path, help="another checkout whose command joins every pair")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for the command (and --before's), e.g. resources.workers=1")
    parser.add_argument("--tight", action="store_true", help=argparse.SUPPRESS)  # the reference's own process
    args = parser.parse_args()
    if args.tight:
        tight_loop(args.rounds)
        return
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    runs: dict[str, list[Run]] = {"command": [], "tight": [], "before": []}
    extra = tuple(args.extra)
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            uri = f"sqlite:///{tmp}/mlflow{pair}.db"
            if args.before:
                before_env = {**env, "PYTHONPATH": f"{args.before.resolve()}{os.pathsep}{env['PYTHONPATH']}"}
                runs["before"].append(measure(command(args.rounds, uri, args.before.resolve(), extra), before_env))
            runs["command"].append(measure(command(args.rounds, uri, extra=extra), env))
            runs["tight"].append(measure([sys.executable, __file__, "--tight", "--rounds", str(args.rounds)], env))
            for name, done in runs.items():
                if done:
                    wall, rss, pss, lines, _ = done[-1]
                    print(f"pair {pair + 1} {name:8s} {wall:5.1f} s RSS {rss:.2f} GiB PSS {pss:.2f} GiB  "
                          f"{timeline(lines, wall)}", flush=True)
    final = [line for _, line in runs["command"][-1][3] if line.startswith(f"round {args.rounds}/")]
    print("command's last round:", final[-1] if final else "(not shown)")
    wall = {name: statistics.median(r[0] for r in done) for name, done in runs.items() if done}
    rss = {name: max(r[1] for r in done) for name, done in runs.items() if done}
    pss = {name: max(r[2] for r in done) for name, done in runs.items() if done}
    for name in wall:
        print(f"{name:8s} wall {wall[name]:.1f} s (median)  peak tree RSS {rss[name]:.2f} GiB  PSS {pss[name]:.2f} GiB")
    parts = max(runs["command"], key=lambda r: r[2])[4]
    print("part " + "  ".join(f"{k} {v:.2f} GiB" for k, v in parts.items()) + "  (the command's PSS at its peak)")
    if args.before:
        print(f"ratio_before {wall['before'] / wall['tight']:.3f}")
        print(f"memory_ratio_before {rss['before'] / rss['tight']:.3f}")
    print(f"ratio {wall['command'] / wall['tight']:.3f}")
    print(f"memory_ratio {rss['command'] / rss['tight']:.3f}")
    print(f"memory_ratio_pss {pss['command'] / pss['tight']:.3f}")
    print(f"memory_pss_gb {pss['command'] * 2**30 / 1e9:.3f}  (the command's peak tree PSS in 10^9 bytes; goal ≤ 2)")


if __name__ == "__main__":
    main()
