"""Starting or joining Ray, without importing torch: a command calls this first, so Ray's processes start
while torch imports and the dataset loads on another thread (``cli.start_federation``). Ray counts the
GPUs itself (its NVIDIA detection), as it does for ``ray start``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray


def ensure_ray(address: str | None = None) -> bool:
    """Start a local Ray, or join ``address`` / $RAY_ADDRESS (no local resource arguments when joining).
    True when this call started a local Ray: the process then owns it and its node alone."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {
        "include_dashboard": False, "log_to_driver": True, "configure_logging": False,
        "runtime_env": {"worker_process_setup_hook": worker_setup()},
    }
    if address:
        ray.init(address=address, **kwargs)
        return False
    # "local": a new instance even when another `ray start` on this machine left its address in /tmp/ray.
    # No idle workers prestarted for the driver: here the client actors started in processes of their
    # own anyway, so those took CPU and memory from the start-up, and one still starting when a short
    # command ended aborted with a stack dump.
    ray.init(address="local", num_cpus=os.cpu_count(),
             _system_config={"prestart_worker_first_driver": False}, **kwargs)
    return True


def worker_setup() -> Callable[[], None]:
    """Ray's ``worker_process_setup_hook`` for this job: it runs ``fltune.driver.quiet_worker`` (no
    SystemExit noise, no library chatter) in every worker, imported from the tree this driver runs.

    Why not the hook's module-name form: a worker runs its hook before it learns the driver's code paths
    (Ray adds the script's folder on its first task), so naming ``fltune.driver`` imported the *installed*
    fltune there, and every later import reused it: a driver run from another checkout (``python
    cli.py``, a benchmark's older clone) had its workers run different code. This closure is shipped by
    value and puts the driver's package root first; on a node without that folder the workers import the
    fltune installed there, as Ray's own code paths do."""
    root = str(Path(__file__).resolve().parents[2])

    def setup() -> None:
        import importlib
        import sys

        if root not in sys.path:
            sys.path.insert(0, root)
        importlib.import_module("fltune.driver").quiet_worker()

    return setup
