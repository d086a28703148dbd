"""Starting or joining Ray, without importing torch: a command calls this first, so Ray's processes start
while torch imports and the dataset loads on another thread (``api.start_federation``). Ray counts the
GPUs itself (its NVIDIA detection), as it does for ``ray start``."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from fltune.errors import FLTuneError
from fltune.plugins import shipped
from fltune.process import handle_stop_signals


def check_gcs(address: str | None) -> None:
    """A cluster address of the form ``host:port`` (a head's GCS) accepts connections: for one where nothing
    listens, ``ray.init`` retries for many minutes, printing a warning every few seconds. Other forms
    (``auto``, ``local``, ``ray://…``) are left to Ray, which answers them at once."""
    if not address or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise FLTuneError(f"--address {address}: the port is not a number; allowed: host:port of a Ray head's GCS")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise FLTuneError(f"--address {address}: no Ray cluster answers there ({reason}); allowed: host:port of "
                          "a running Ray head's GCS (ray start --head), auto, or none for a local Ray") from None


def start_ray(address: str | None) -> bool:
    """A command's start or join of Ray: the address checked first (``check_gcs``), one clear line when there
    is nothing to join, and fltune's stop handling installed again after the handlers Ray installs as it
    starts (``process.handle_stop_signals``). True when this started a local Ray of its own."""
    check_gcs(address or os.environ.get("RAY_ADDRESS"))
    try:
        started = ensure_ray(address)
    except ConnectionError as err:  # no cluster there, or several and no address to choose one
        raise FLTuneError(f"--address {address or '$RAY_ADDRESS'}: {err}") from None
    handle_stop_signals()
    return started


def ensure_ray(address: str | None = None) -> bool:
    """Start a local Ray, or join ``address`` / $RAY_ADDRESS (no local resource arguments when joining; the
    files and packages of the user's methods, models and datasets go along as Ray's ``py_modules``, which
    the config's validation loaded before: ``fltune.plugins.shipped``). True when this call started a local
    Ray: the process then owns it and its node alone, whose workers read the user's files where they are."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {
        "include_dashboard": False, "log_to_driver": True, "configure_logging": False,
        "runtime_env": {"worker_process_setup_hook": worker_setup()},
    }
    if address:  # the user's own code, named by reference, reaches the workers of every node
        kwargs["runtime_env"]["py_modules"] = shipped() or None
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
    """Ray's ``worker_process_setup_hook`` for this driver: it runs ``fltune.process.quiet_worker`` (no
    SystemExit noise, no library chatter) in every worker, imported from the tree this driver runs.

    Why not the hook's module-name form: a worker runs its hook before it learns the driver's code paths
    (Ray adds the script's folder on its first task), so naming ``fltune.process`` imported the *installed*
    fltune there, and every later import reused it: a driver run from another checkout (``python
    cli.py``, a benchmark's older clone) had its workers run different code. This closure is shipped by
    value and puts the driver's package root first; on a node without that folder the workers import the
    fltune installed there, as Ray's own code paths do."""
    root = str(Path(__file__).resolve().parents[2])

    def setup() -> None:
        import sys

        if root not in sys.path:
            sys.path.insert(0, root)
        from fltune.process import quiet_worker

        quiet_worker()

    return setup
