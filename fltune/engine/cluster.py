"""Starting or joining Ray, without importing torch: a command calls this first, so Ray's processes start
while torch imports and the dataset loads on another thread (``cli.start_federation``). Ray counts the
GPUs itself (its NVIDIA detection), as it does for ``ray start``."""

from __future__ import annotations

import os
from typing import Any

import ray


def ensure_ray(address: str | None = None) -> None:
    """Start a local Ray, or join ``address`` / $RAY_ADDRESS (no local resource arguments when joining)."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {
        "include_dashboard": False, "log_to_driver": True, "configure_logging": False,
        "runtime_env": {"worker_process_setup_hook": "fltune.driver.quiet_worker"},  # no SystemExit noise
    }
    if address:
        ray.init(address=address, **kwargs)
    else:
        # "local": a new instance even when another `ray start` on this machine left its address in /tmp/ray.
        # No idle workers prestarted for the driver: here the client actors started in processes of their
        # own anyway, so those took CPU and memory from the start-up, and one still starting when a short
        # command ended aborted with a stack dump.
        ray.init(address="local", num_cpus=os.cpu_count(),
                 _system_config={"prestart_worker_first_driver": False}, **kwargs)
