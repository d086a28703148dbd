"""The Ray actor that trains clients: stateless between calls, so any worker can train any client. A worker serves one
run at a time: the run arrives by reference with every call (``WorkerPool.bind``). Per call it trains its share of the
round's clients in turn and returns one partial weighted sum (aggregate.py) plus each client's upload, state and
metrics. When a probe needs every local model (``RunSpec.keep_latest``: ``all_model``, H_N/H_D) and
``client_model`` rebuilds them, the worker returns the updates instead of its partial sum and the driver sums them
in the worker's order, so each client's weights travel once."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from fltune.config import ExperimentConfig
from fltune.data.federated import FederatedData
from fltune.engine.aggregate import WeightedSum
from fltune.engine.builders import resolve_augment
from fltune.engine.batches import Batch, HostBatches
from fltune.engine.evaluation import batch_scores, eval_batch_count, read_scores, score_sums, total_scores
from fltune.engine.executors import Executor
from fltune.engine.transfer import RoundInput, device_states, load_changed, load_state, state_on_device
from fltune.engine.probes import ClientMeter, ProbeTask
from fltune.engine.rng import derive_seed, use_deterministic_cuda
from fltune.methods.base import ClientResult, Method, State, Upload, client_model, to_numpy

T = TypeVar("T")

STAGED_BYTES = 64 * 2**20
"""Bytes of personal weights ``ClientWorker.evaluate_clients`` stages on the device in one copy: bounds memory."""


@dataclass(frozen=True)
class RunSpec:
    """What a worker needs to serve one run: its config, data and parts, as the driver's ``Federation`` holds them."""

    cfg: ExperimentConfig
    data: FederatedData
    method: Callable[[], Method]
    model: Callable[[FederatedData], nn.Module]
    executor: Executor
    keep_latest: bool = False  # return each client's local model (the all_model protocol, H_N/H_D need them)
    rebuild: bool = True
    """With ``keep_latest``: let the driver rebuild the local models it can; False ships every one (the
    reference of tests/engine/test_federation_probes.py)."""


@dataclass
class WorkerResult:
    """One worker's share of a round: its weighted sum as ``partial``, or the summands as ``updates`` (weight
    and update per client, in training order) for the driver to add up (:meth:`summed`)."""

    partial: WeightedSum
    uploads: dict[int, Upload] = field(default_factory=dict)
    states: dict[int, dict[str, Any]] = field(default_factory=dict)
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    latest: dict[int, State] = field(default_factory=dict)
    """Local models shipped as they are (those not rebuilt from ``updates``)."""
    updates: dict[int, tuple[float, State]] = field(default_factory=dict)

    def summed(self) -> WeightedSum:
        """The worker's weighted sum: ``partial``, or ``updates`` added in the worker's order (the same bits)."""
        if not self.updates:
            return self.partial
        total = WeightedSum()
        for weight, update in self.updates.values():
            total.add(weight, update)
        return total

    def local_models(self) -> dict[int, State]:
        """Every trained client's local model: shipped, or rebuilt from its update (exact: ``_pack`` checked)."""
        rebuilt = {cid: client_model(update, self.states[cid]) for cid, (_, update) in self.updates.items()}
        return {**rebuilt, **self.latest}


class ClientWorker:
    """Trains and evaluates clients on one CPU slot or GPU fraction (wrapped by ``ray.remote`` in the pool)."""

    def __init__(self, threads: int, in_driver: bool = False) -> None:
        """A process that sees no GPU keeps Triton out (``skip_triton``): round 1's FLOP meter would import
        it. ``in_driver``: the driver's share (``pool.InProcessPool``), whose plan reserves no GPU."""
        torch.set_num_threads(max(1, threads))
        sees_gpu = torch.cuda.is_available()
        if not sees_gpu:
            skip_triton()
        gpu = not in_driver and sees_gpu and _has_gpu()
        self.device = torch.device("cuda" if gpu else "cpu")
        self.run_id: str | None = None

    def _attach(self, run_ref: list) -> FederatedData:
        """Switch to ``run_ref``'s run unless served last; it comes with every call, so restarts need no setup."""
        ref = run_ref[0]
        if ref.hex() != self.run_id:
            import ray

            spec: RunSpec = ray.get(ref)
            model = spec.model(spec.data).to(self.device)
            self.spec, self.trainer = spec, spec.executor.trainer(
                spec.method(), model, spec.data, spec.cfg.training, self.device, resolve_augment(spec.cfg, spec.data))
            if self.device.type == "cuda":
                use_deterministic_cuda(spec.cfg.resources.deterministic)
            self.run_id = ref.hex()
        return self.spec.data

    def train(
        self, run_ref: list, inputs: RoundInput, builders: Sequence[Callable[[], ClientMeter]], client_ids: list[int],
        states: dict[int, dict[str, Any]],
    ) -> WorkerResult:
        """Train ``client_ids`` unit by unit as the run's executor groups them; stop after a unit in which one
        diverged (the round is lost anyway). ``builders``: probes' meters of each client (``Probe.client_meter``)."""
        self._attach(run_ref)
        result = WorkerResult(partial=WeightedSum())
        global_tensors = state_on_device(inputs.global_state, self.device)
        for unit in self.spec.executor.train(self, client_ids, inputs, states, global_tensors, builders):
            diverged = False
            for cid, out in unit:
                self._keep(result, cid, out)
                diverged = diverged or bool(out.metrics["diverged"])
            release_free_memory()
            if diverged:
                break
        return self._pack(result)

    def _keep(self, result: WorkerResult, cid: int, out: ClientResult) -> None:
        """Add a trained client (local model in ``self.trainer.model``); with ``keep_latest`` :meth:`_pack` decides later."""
        result.uploads[cid], result.states[cid], result.metrics[cid] = out.upload, out.state, out.metrics
        if self.spec.keep_latest:
            result.updates[cid] = (out.weight, out.update)
            result.latest[cid] = to_numpy(self.trainer.model.state_dict())
        else:
            result.partial.add(out.weight, out.update)

    def _pack(self, result: WorkerResult) -> WorkerResult:
        """What ships: the updates alone when ``client_model`` rebuilds every local model exactly, else
        the partial sum and every local model."""
        rebuilt = self.spec.rebuild and all(
            _identical(client_model(update, result.states[cid]), result.latest[cid])
            for cid, (_, update) in result.updates.items()
        )
        if rebuilt:
            result.latest = {}
        else:
            result.partial = result.summed()
            result.updates = {}
        return result

    def evaluate_clients(
        self, run_ref: list, inputs: RoundInput, finetune: bool, client_ids: list[int],
        states: dict[int, dict[str, Any]],
    ) -> dict[int, tuple[int, float, int]]:
        """Personalised protocol: each client's own model (after its final round when ``finetune``) on its
        held-out split, in chunks of at most ``STAGED_BYTES`` of weights; scores are read once per shard."""
        data = self._attach(run_ref)
        global_tensors = state_on_device(inputs.global_state, self.device)
        per_chunk = max(1, STAGED_BYTES // sum(v.nbytes for v in inputs.global_state.values()))
        if finetune:  # whole groups: a final round's groups are the run's, not the shard's
            per_chunk = -(-per_chunk // self.spec.executor.group) * self.spec.executor.group
        sums: dict[int, torch.Tensor] = {}
        for first in range(0, len(client_ids), per_chunk):
            chunk = client_ids[first:first + per_chunk]
            sums.update(self._score_chunk(data, inputs, finetune, chunk, states, global_tensors))
        scores = read_scores(torch.cat(list(sums.values()))) if sums else []
        out, start = {}, 0
        for cid, part in sums.items():
            out[cid] = total_scores(scores[start:start + len(part)], len(data.client_eval[cid]))
            start += len(part)
        return out

    def _score_chunk(
        self, data: FederatedData, inputs: RoundInput, finetune: bool, chunk: list[int],
        states: dict[int, dict[str, Any]], global_tensors: dict[str, torch.Tensor],
    ) -> dict[int, torch.Tensor]:
        """``score_sums`` of each client of ``chunk``, left on the device. Held-out images and personal weights
        go over in one copy each; a client's load skips weights it shares with the one before (``load_changed``)."""
        held_out = {cid: data.client_eval[cid] for cid in chunk}
        idx = torch.from_numpy(np.concatenate(list(held_out.values())).astype(np.int64))
        xs, ys = data.x[idx].to(self.device), data.y[idx].to(self.device)
        offsets = dict(zip(chunk, np.cumsum([0, *(len(rows) for rows in held_out.values())]).tolist()))
        if finetune:
            ready = self.spec.executor.final(self, chunk, inputs, states, global_tensors)
        else:
            ready = self._client_models(inputs, chunk, states, global_tensors)
        sums = {}
        for cid in ready:
            rows = slice(offsets[cid], offsets[cid] + len(held_out[cid]))
            scorer = self.trainer.method.personal_scorer(self.trainer.model, self._train_batches(data, inputs, cid))
            sums[cid] = score_sums(scorer, data, xs[rows], ys[rows], self.device,
                                   range(eval_batch_count(len(held_out[cid]))))
        return {cid: sums[cid] for cid in chunk}

    def _train_batches(self, data: FederatedData, inputs: RoundInput, cid: int) -> Callable[[], Iterator[Batch]]:
        """``cid``'s training batches for ``personal_scorer``, one epoch per call, from a generator seeded one
        round past ``inputs.round`` so its draws are apart from every training and fine-tuning draw."""
        generator = torch.Generator().manual_seed(derive_seed(inputs.seed, inputs.round + 1, cid))
        return partial(HostBatches(data, self.device).epoch, data.client_train[cid], self.trainer.training.batch_size,
                       generator, self.trainer.augment)

    def _client_models(
        self, inputs: RoundInput, chunk: list[int], states: dict[int, dict[str, Any]],
        global_tensors: dict[str, torch.Tensor],
    ) -> Iterator[int]:
        """Each client of ``chunk`` in turn, ``self.trainer.model`` holding its client model."""
        starts = [client_model(inputs.global_state, states.get(cid, {})) for cid in chunk]
        loaded: dict[str, Any] = {}
        for cid, load in zip(chunk, device_states(starts, self.device, inputs.global_state, global_tensors)):
            load_changed(self.trainer.model, load, loaded)
            yield cid

    def evaluate_split(
        self, run_ref: list, state: State, split: str, batches: list[int],
    ) -> list[tuple[int, float]]:
        """Per-batch (correct, summed loss) of ``state`` on ``split``'s ``batches`` (``Federation.evaluate_state``)."""
        data = self._attach(run_ref)
        load_state(self.trainer.model, state)
        x, y = data.split(split)
        scores = batch_scores(self.trainer.model, data, x, y, self.device, batches)
        release_free_memory()
        return scores

    def compute(self, run_ref: list, tasks: list[ProbeTask[T]]) -> list[T]:
        """Probe computations (``Federation.compute``) in turn on this worker's device (a GPU a trial may lack)."""
        data = self._attach(run_ref)
        results = [task(self.spec.cfg, data, self.device) for task in tasks]
        release_free_memory()
        return results

    def ready(self, run_ref: list) -> None:
        """Fetch the run and build its model now (``WorkerPool.bind``), while the driver starts up."""
        self._attach(run_ref)

    def pid(self) -> int:
        """Process id (tests kill it to check that a lost worker is replaced)."""
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


try:  # glibc's malloc_trim; None off glibc (macOS, musl)
    _MALLOC_TRIM: Any = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
except (OSError, AttributeError):
    _MALLOC_TRIM = None


def release_free_memory() -> None:
    """Hand the heap's free pages back to the OS after a call and after each client or group. glibc keeps freed
    activations for reuse, but a worker is mostly idle between calls, when what it holds is its real footprint;
    re-faulting the pages is cheap next to training (docs/performance.md)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def skip_triton() -> None:
    """Make ``import triton`` fail here, as if not installed, in a process that sees no GPU. Why: torch imports
    Triton whenever its compiler or FLOP counter loads, holding memory a CPU worker never uses; torch's check is
    an import that may fail, and Python fails an import whose ``sys.modules`` entry is None."""
    from fltune.process import drop_noise

    if "triton" not in sys.modules:
        sys.modules["triton"] = None  # type: ignore[assignment]
        drop_noise("torch.utils.flop_counter")  # its note that it can't count Triton kernels (``workarounds.NOISE``)


def _identical(rebuilt: State, trained: State) -> bool:
    """Whether a rebuilt local model is the trained one: the same keys, dtypes, shapes and bytes."""
    if rebuilt.keys() != trained.keys():
        return False
    pairs = ((np.asarray(rebuilt[k]), v) for k, v in trained.items())
    return all(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in pairs)


def _has_gpu() -> bool:
    import ray

    return bool(ray.get_gpu_ids()) if ray.is_initialized() else True
