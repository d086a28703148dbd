"""Starting or joining Ray without importing torch, so Ray's processes start while torch imports and the dataset
loads on another thread (``api.start_federation``). Ray counts the GPUs itself, as for ``ray start``."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from fltune.errors import FLTuneError
from fltune.plugins import shipped
from fltune.process import drop_noise, handle_stop_signals
from fltune.workarounds import RAY_SYSTEM_CONFIG


def check_gcs(address: str | None) -> None:
    """Check that a ``host:port`` address (a head's GCS) accepts connections: where nothing listens, ``ray.init``
    retries for many minutes. Other forms (``auto``, ``local``, ``ray://…``) Ray answers at once."""
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
    """A command's start or join of Ray: the address checked first, one clear line when nothing is there, and
    fltune's stop handling reinstalled over Ray's (``process.handle_stop_signals``). True: a local Ray started."""
    check_gcs(address or os.environ.get("RAY_ADDRESS"))
    try:
        started = ensure_ray(address)
    except ConnectionError as err:  # no cluster there, or several and no address to choose one
        raise FLTuneError(f"--address {address or '$RAY_ADDRESS'}: {err}") from None
    handle_stop_signals()
    return started


def ensure_ray(address: str | None = None) -> bool:
    """Start a local Ray, or join ``address`` / $RAY_ADDRESS (the user's plugin files go along as ``py_modules``:
    ``fltune.plugins.shipped``). True when this call started a local Ray, which the process then owns alone."""
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
    # "local": a new instance even when another `ray start` left its address in /tmp/ray; its token note is
    # fltune's noise in a Python API user's process too (``workarounds.NOISE``)
    drop_noise("ray._private.authentication.authentication_token_setup")
    ray.init(address="local", num_cpus=os.cpu_count(), _system_config=RAY_SYSTEM_CONFIG, **kwargs)
    return True


def worker_setup() -> Callable[[], None]:
    """Ray's ``worker_process_setup_hook``: ``fltune.process.quiet_worker`` in every worker, imported from the driver's
    tree. Why not the module-name form: a worker runs its hook before it learns the driver's code paths, so it would
    import the *installed* fltune, and a driver run from another checkout would have its workers run other code. This
    closure, shipped by value, puts the driver's package root first (where that folder exists)."""
    root = str(Path(__file__).resolve().parents[2])

    def setup() -> None:
        import sys

        if root not in sys.path:
            sys.path.insert(0, root)
        from fltune.process import quiet_worker

        quiet_worker()

    return setup
