"""Every place fltune reaches into Ray's, Tune's, Optuna's or torch's internals (private modules, attributes, logger
names) or corrects their behaviour, each with its upstream issue where one exists and when it can go. Tested on the
versions constraints.txt pins; pyproject.toml bounds ray below its next minor for these. Ray and torch load inside
the functions: ``process`` imports this module as a command starts."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

Rule = tuple[tuple[str, ...], Callable[[BaseException, list[str]], bool] | None]
"""A kind of library record: how its message starts, and when such an error record is harmless (``process._Drop``)."""


# ---------------------------------------------------------------------------------------------- log records
def _never(error: BaseException, frames: list[str]) -> bool:
    """For a library's error records that are noise only when they are failed writes."""
    return False


def _stale_prune(error: BaseException, frames: list[str]) -> bool:
    """Tune's "Error handling checkpoint" for a pruned checkpoint already gone (a driver killed mid-prune, on a
    URI storage; local storage holds prunes: ``HeldPrunes``): harmless, the new checkpoint is registered before
    the prune."""
    return isinstance(error, FileNotFoundError) and "_delete_fs_path" in frames


def _superseded_sync(error: BaseException, frames: list[str]) -> bool:
    """Tune's "Saving experiment state … failed" on its own ``…-tmp-…`` file, renamed away before the copy
    that listed it ran; the next copy carries it."""
    return isinstance(error, FileNotFoundError) and "_upload_to_fs_path" in frames and "-tmp-" in str(error)


NOISE: dict[str, tuple[Rule, ...]] = {
    # a local Ray warns on every start that it enabled token authentication (ray-project/ray#64755); remove when
    # the warning can be turned off without opting out of authentication
    "ray._private.authentication.authentication_token_setup": ((("Token authentication is enabled",), None),),
    # a pool call's error left unread when a command ends on its first error or a stop (``WorkerPool.shutdown``):
    # Ray prints each at exit, by design
    "ray._private.worker": ((("Unhandled error",), None),),
    # Tune's stop advice names its own API: fltune prints its command's resume line (by design in Tune)
    "ray.tune.tune": (
        (("Stop signal received", "Experiment has been interrupted"), None),
        (("Experiment state snapshotting failed",), _never),  # its last save, on a full storage
    ),
    "ray.tune.trainable.trainable": ((("Restored on",), None),),  # every resumed trial, in its worker (by design)
    # races of Tune's background syncer with its own deletes (ray-project/ray#30073 narrowed them; these two records
    # remain); remove when Tune stops logging them
    "ray.tune.execution.tune_controller": ((("Trial %s: Error handling checkpoint",), _stale_prune),),
    "ray.tune.execution.experiment_state": ((("Saving experiment state to storage at ",), _superseded_sync),),
    # trials that never reported: fltune reads results from Tune's saved state (``Trial.last_result``)
    "ray.tune.analysis.experiment_analysis": ((("Failed to fetch metrics for",), None),),
    # a failed copy to full or read-only storage, which Tune logs and goes past: the job stops on it instead
    "ray.train._internal.syncer": ((("Last sync command failed",), _never),),
    # one INFO line per checkpoint in every trial's log, by design in Ray Train
    "ray.train._internal.storage": ((("Checkpoint successfully created at",), None),),
    # torch's FLOP counter, imported where Triton is kept out (``worker.skip_triton``), notes that it can't count
    # Triton kernels: none run there
    "torch.utils.flop_counter": ((("triton not found",), None),),
}
"""Logger → rules: Ray's and torch's records fltune drops (``process.quiet_libraries``). The loggers are named by their
private modules: a release that moves one brings its noise back."""

def mute_published_errors_after_a_stop(stopped: Callable[[], bool]) -> None:
    """Drop the errors Ray's services publish to the driver (its ``(raylet) …`` lines) once ``stopped()``: a stop
    sent to the process group reaches the local Ray's autoscaler monitor too, whose handler publishes its own death
    ("The autoscaler failed with the following error: Terminated with signal 15" and a stack) while the command is
    ending. The driver prints published errors from a thread of its own (``worker.listen_error_messages``) with no
    switch, so the printer it calls is wrapped; idempotent. Remove when ``ray.init`` can leave the monitor out of a
    local Ray (``RayParams.no_monitor`` is not passed through) or the monitor ends quietly on a signal."""
    ray = sys.modules.get("ray")
    if ray is None or getattr(ray._private.worker.print_to_stdstream, "__wrapped__", None) is not None:
        return
    printer = ray._private.worker.print_to_stdstream

    def printing(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        if not (data.get("pid") == "raylet" and stopped()):
            printer(data, *args, **kwargs)

    printing.__wrapped__ = printer  # type: ignore[attr-defined]
    ray._private.worker.print_to_stdstream = printing


RAY_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}
"""``ray.init``'s private ``_system_config`` for a local Ray: no idle workers prestarted. Client actors get processes
of their own, so prestarted ones only take CPU and memory from the start-up, and one still starting when a short
command ends aborts with a stack dump (ray-project/ray#40131). Remove when a public option turns prestarting off."""


# ---------------------------------------------------------------------------------------------- the driver's Ray
def local_ray_node() -> Any:
    """The local Ray node this driver started, else None; imports no Ray. Ray has no public handle on the node a
    driver started (``ray._private.worker._global_node``), which ``process.exit_now`` needs to stop its raylet
    and see whether its Ray died; remove with ``exit_now``'s need, when ``ray.shutdown`` is quick."""
    ray = sys.modules.get("ray")
    return None if ray is None else getattr(ray._private.worker, "_global_node", None)


def ray_node_alive(node: Any) -> bool:
    """Whether the raylet and GCS run and the GCS accepts connections (its port closes well before it ends)."""
    import socket

    from ray._private.ray_constants import PROCESS_TYPE_GCS_SERVER, PROCESS_TYPE_RAYLET

    if any(info.process.poll() is not None for kind in (PROCESS_TYPE_RAYLET, PROCESS_TYPE_GCS_SERVER)
           for info in node.all_processes.get(kind, [])):
        return False
    host, port = node.gcs_address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True


def stop_local_ray(node: Any, wait_s: float) -> None:
    """The first steps of ``ray.shutdown``, then the raylet stopped (SIGTERM, waited for ``wait_s``) so its workers
    do not linger; other services end with this process (Ray's fate sharing). Stopped first: the threads that print
    the workers' and raylet's lines (none may follow fltune's last one), and the driver's core worker, which ends
    this process with status 1 when it sees its raylet go. Ray's own shutdown waits on each process in turn:
    remove when it is quick."""
    import subprocess

    from ray._private import worker
    from ray._private.ray_constants import PROCESS_TYPE_RAYLET

    worker.disconnect()
    core = getattr(worker.global_worker, "core_worker", None)
    if core is not None:
        core.shutdown_driver()
    for info in node.all_processes.get(PROCESS_TYPE_RAYLET, []):
        info.process.terminate()
        try:
            info.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:  # ends with this process (Ray's fate sharing)
            pass


# ---------------------------------------------------------------------------------------------- Tune's pruning
class HeldPrunes:
    """Trial checkpoints Tune pruned, held until the job folder holds a state saved after the prune. Tune deletes
    checkpoints beyond ``num_to_keep`` before the state naming them is copied, so a driver killed in between
    resumes from a deleted checkpoint on every retry (ray-project/ray#27790; ray-project/ray#30073 narrowed it
    for cloud storage only). Remove when Tune prunes only after the state that supersedes a checkpoint is saved.
    Tune's deletes reach it through ``jobs.storage.AtomicLocalFiles``, whose whole-file writes work around
    ray-project/ray#58179 (remove with that fix); it stays there as its pyarrow base class is heavy to import.

    One per process (the driver deletes and copies through different filesystem copies). Tune's driver thread
    starts a copy only after the previous one ended (``_BackgroundSyncer``) and prunes between copies, so a copy
    *opened* after a prune may carry an older state, but one opening after that copy *ended* cannot. A driver
    killed while it holds some leaves superseded checkpoints on disk, never a missing one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: list[tuple[str, float]] = []  # (checkpoint, when pruned)
        self._passed: list[tuple[str, float]] = []  # (checkpoint, when the first copy opened after it ended)

    def hold(self, path: str) -> None:
        with self._lock:
            self._asked.append((path, time.monotonic()))

    def state_copied(self, opened: float, ended: float) -> None:
        """A copy of the job state, opened and ended (whole) at these ``time.monotonic()`` times."""
        with self._lock:
            ready = [path for path, since in self._passed if opened > since]
            self._passed = [(path, since) for path, since in self._passed if opened <= since]
            self._passed += [(path, ended) for path, asked in self._asked if opened > asked]
            self._asked = [(path, asked) for path, asked in self._asked if opened <= asked]
        self._delete(ready)

    def release(self) -> None:
        """Delete every held checkpoint: Tune's last save (``tune.py``, also when stopped) followed every prune."""
        with self._lock:
            ready = [path for path, _ in self._asked + self._passed]
            self._asked, self._passed = [], []
        self._delete(ready)

    @staticmethod
    def _delete(paths: list[str]) -> None:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)


PRUNES = HeldPrunes()


# ---------------------------------------------------------------------------------------------- Optuna, torch
def optuna_study(searcher: Any) -> Any:
    """The Optuna study inside Tune's ``OptunaSearch`` (its private ``_ot_study``, made in ``__init__`` when space,
    metric and mode are given): a new study's ``--warm-start`` trials are added to it. Remove when OptunaSearch
    exposes its study or takes finished trials (its ``evaluated_rewards`` refuses a define-by-run space)."""
    return searcher._ot_study


def optuna_trial_open(searcher: Any, trial_id: str) -> bool:
    """Whether Tune's OptunaSearch ``searcher`` suggested the trial ``trial_id`` and its Optuna storage has not seen
    it end (one that ended there is counted complete). A driver killed between Tune's save of its state and the
    searcher's resumes with a searcher that never suggested a trial (OptunaSearch raises ``KeyError``) or thinks an
    ended one runs while Tune replays its rounds from a checkpoint (Optuna refuses to update a finished trial).
    Reads OptunaSearch's private ``_ot_trials``, ``_ot_study`` and ``_completed_trials``; remove when OptunaSearch
    is saved in step with Tune's state."""
    trial = searcher._ot_trials.get(trial_id)
    if trial is None:
        return False
    if searcher._ot_study._storage.get_trial(trial._trial_id).state.is_finished():
        searcher._completed_trials.add(trial_id)
        return False
    return True


def compile_limits(graphs: int, threads: int) -> None:
    """Let ``torch.compile`` keep ``graphs`` graphs per function (dynamo's default, 8, recompiles a batched group
    step that serves every phase, shape and run of a process) and compile on ``threads`` threads, not every core
    (Tune's trials' workers compile at once). Both are settings of torch's private ``torch._dynamo.config`` and
    ``torch._inductor.config``; remove when ``torch.compile`` takes them as options."""
    import torch._dynamo.config
    import torch._inductor.config

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, graphs)
    torch._inductor.config.compile_threads = threads
