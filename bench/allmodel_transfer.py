"""What the ``all_model`` protocol costs in transfer and checkpoint, with local models rebuilt or shipped.

Workload: FedAvg's CNN on FMNIST (synthetic data when FMNIST is missing; the model is the same), the
defaults' 100 clients at fraction 0.1 (10 a round) on 2 workers, 2 rounds of 1 local epoch (training
time is not measured), ``metrics.protocols=[all_model]``. Three runs of the same seed: ``none`` (no
probe keeps local models: ``protocols=[global]``), ``shipped`` (every worker returns its partial sum and
each client's local model, the path before ``client_model``) and ``rebuilt`` (the default: the
workers return each client's update and the driver rebuilds the local models). Measured: the bytes of
the round's worker results pickled (what Ray moves from the workers to the driver, its numpy buffers
included) and of the checkpoint (``pickle.dumps(fed.state_dict())``, as a Tune trial writes it) after
the last round. Sizes do not depend on machine load. Last line: ``ratio <rebuilt/shipped transfer>``.

    python bench/allmodel_transfer.py [--method fedavg] [--workers 2]
"""

from __future__ import annotations

import argparse
import pickle
from dataclasses import replace

import ray

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.errors import DatasetMissing
from fltune.data.datasets import load_dataset

MB = 1e6


def dataset() -> str:
    try:
        load_dataset("fmnist")
        return "fmnist"
    except DatasetMissing:
        return "synthetic"


def measure(overrides: list[str], path: str) -> tuple[list[int], int, int]:
    """(bytes the workers returned per round, checkpoint bytes, local models held) of one run."""
    fed = build_federation(build_config(overrides=overrides))
    sizes: list[int] = []
    try:
        fed.open()
        if path == "shipped":
            fed.run_ref = ray.put(replace(fed.spec(fed.data, keep_latest=True), rebuild=False))
        assert fed.pool is not None
        plain_map = fed.pool.map

        def measured_map(run: ray.ObjectRef, method: str, *args, **kwargs):
            results = plain_map(run, method, *args, **kwargs)
            if method == "train":
                sizes.append(sum(len(pickle.dumps(r, protocol=5)) for r in results))
            return results

        fed.pool.map = measured_map  # type: ignore[method-assign]
        for _ in fed.rounds():
            pass
        return sizes, len(pickle.dumps(fed.state_dict(), protocol=5)), len(fed.latest)
    finally:
        fed.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    base = [f"data.dataset={dataset()}", "data.subsample=0.25", f"method.name={args.method}",
            "federation.clients=100", "federation.fraction=0.1", "federation.rounds=2", "training.local_epochs=1",
            f"resources.workers={args.workers}", "tracking.enabled=false"]
    ray.init(address="local", num_cpus=max(2, args.workers), include_dashboard=False, log_to_driver=False)
    print(f"{base[0]} {args.method}: 100 clients, 10 a round, {args.workers} workers, 2 rounds")
    transfer = {}
    for path, protocols in (("none", "[global]"), ("shipped", "[all_model]"), ("rebuilt", "[all_model]")):
        sizes, checkpoint, held = measure([*base, f"metrics.protocols={protocols}"], path)
        transfer[path] = sum(sizes) / len(sizes)
        print(f"{path:8s} transfer_mb_per_round {transfer[path] / MB:.1f}  checkpoint_mb {checkpoint / MB:.1f}"
              f"  ({held} local models held)")
    ray.shutdown()
    print(f"ratio {transfer['rebuilt'] / transfer['shipped']:.3f}")


if __name__ == "__main__":
    main()
