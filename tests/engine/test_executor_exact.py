"""The gate of the fast client executor (issue 12 item 1): ``resources.executor=exact`` (data on the
worker's device, table normalisation, metrics read once per client, reused optimisers) gives the same bits
as ``reference`` (today's loop) for every method — final global state, client store, every client's
upload and metrics — including a client whose loss turns non-finite, and through a real Federation.

Most runs are in-process (``train_client`` and the method's ``aggregate``, as a worker and the round
loop call them), so every method fits in seconds; one Ray test checks the worker wiring end to end.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

import numpy as np
import pytest
import torch

from fltune.assembly import build_federation
from fltune.config import ExperimentConfig, build_config
from fltune.data.federated import FederatedData
from fltune.engine.aggregate import WeightedSum
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data, resolve_augment
from fltune.engine.federation import Federation
from fltune.engine.local import Trainer, train_client
from fltune.engine.transfer import RoundInput
from fltune.engine.pool import WorkerPlan, WorkerPool
from fltune.engine.rng import round_clients, use_deterministic_cuda
from fltune.methods import get_method
from fltune.methods.base import Aggregate, ServerContext
from tests.methods.test_contract import each_method

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
"""The gate runs on every device this machine has: on CUDA both paths use the reproducible kernels a
worker picks (``resources.deterministic``), so they must agree to the bit there too."""
# 4 clients, 2 a round, 2 rounds: clients that return, clients never sampled, several steps each; crop,
# flip and cutout draw from the batch generator, so the draw order of both paths is checked too.
TINY = [
    "data.dataset=synthetic", "data.subsample=0.03", "data.augment=crop_flip_cutout",
    "partition.kind=dirichlet_prior", "partition.alpha=0.5", "partition.eval_fraction=0.2",
    "federation.clients=4", "federation.fraction=0.5", "federation.rounds=2", "training.local_epochs=1",
    "training.batch_size=12", "training.lr=0.05", "tracking.enabled=false",
]
Run = tuple[dict[str, np.ndarray], dict[int, dict[str, Any]], list[dict[int, Any]]]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One torch thread, as each worker has: tiny steps on two threads of a shared machine wait on each
    other far longer than they compute."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> Iterator[torch.device]:
    if request.param == "cpu":
        yield torch.device("cpu")
        return
    flags = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark)
    use_deterministic_cuda(True)
    yield torch.device("cuda")
    torch.use_deterministic_algorithms(flags[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[1], flags[2]


def tiny_config(method: str, *extra: str) -> ExperimentConfig:
    small = ["model.options={blocks: 1}"] if get_method(method.split("+")[0]).default_model == "resnet56" else []
    return build_config(overrides=[*TINY, f"method.name={method}", *small, *extra])


@cache
def tiny_data() -> FederatedData:
    return load_data(tiny_config("fedavg"))


def run_in_process(cfg: ExperimentConfig, data: FederatedData, kind: str, device: torch.device) -> Run:
    """Every round as the workers and ``Federation.step`` compute it, in this process on one executor:
    (final global state, client store, each round's per-client results). Stops at a diverged round."""
    method, model = build_method(cfg), build_model_for(cfg, data).to(device)
    trainer = Trainer.of(method, model, data, cfg.training, device, resolve_augment(cfg, data),
                         exact=kind == "exact")
    fed, training = cfg.federation, cfg.training
    global_state = initial_state(cfg, data)
    server_state, store, rounds = method.init_server_state(global_state), {}, []
    for r in range(1, fed.rounds + 1):
        inputs = RoundInput(r, fed.seed, training.lr * training.lr_decay ** (r - 1), global_state,
                            method.server_payload(server_state))
        total, results = WeightedSum(), {}
        for cid in round_clients(fed, r):
            results[cid] = train_client(trainer, cid, inputs, store.get(cid, {}))
            total.add(results[cid].weight, results[cid].update)
        rounds.append(results)
        if any(out.metrics["diverged"] for out in results.values()):
            break
        ids = sorted(results)
        aggregate = Aggregate(total.mean(), total.total_weight, {c: results[c].state for c in ids},
                              {c: results[c].metrics for c in ids}, {c: results[c].upload for c in ids})
        store = {**store, **aggregate.client_states}
        update = method.aggregate(ServerContext(r, global_state, aggregate, server_state, store, fed.clients))
        global_state, server_state = update.global_state, update.server_state
        store = {**store, **update.client_states}
    return global_state, store, rounds


def assert_same(a: Any, b: Any, where: str) -> None:
    """Bitwise equality of nested dicts/lists of arrays, tensors and numbers (NaN equals NaN)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        same_nans = (a.isnan() == b.isnan()).all() and torch.equal(a.nan_to_num(), b.nan_to_num())
        assert torch.equal(a, b) or same_nans, where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), where
    elif hasattr(a, "__dataclass_fields__"):
        assert_same(vars(a), vars(b), where)
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"


def assert_executors_agree(cfg: ExperimentConfig, device: torch.device) -> Run:
    reference = run_in_process(cfg, tiny_data(), "reference", device)
    exact = run_in_process(cfg, tiny_data(), "exact", device)
    assert_same(exact, reference, cfg.method.name)
    return exact


@pytest.mark.parametrize("method", each_method(others=pytest.mark.slow))
def test_exact_path_gives_the_reference_bits(method, device):
    _, store, rounds = assert_executors_agree(tiny_config(method), device)
    assert len(rounds) == 2 and not any(m.metrics["diverged"] for r in rounds for m in r.values())
    assert all(m.metrics["steps"] > 1 for r in rounds for m in r.values())


@pytest.mark.parametrize("setting", [
    ["training.optimizer=adam", "training.weight_decay=0.001"],
    ["training.nesterov=true", "training.grad_clip=1.0", "training.lr_decay=0.5"],
    ["training.momentum=0", "training.weight_decay=0.01"],
])
def test_exact_path_agrees_under_every_optimiser_setting(setting, device):
    """Adam's moments, Nesterov's buffer with clipping and a decaying lr, plain SGD with weight decay and no
    buffer at all, each fresh per client and phase (FedRep's two phases): the exact path keeps the reference's bits."""
    assert_executors_agree(tiny_config("fedrep", *setting), device)


def test_a_diverging_client_gives_the_reference_results(device):
    """The reference stops a client at its first non-finite loss; the exact path notices once per client
    and re-runs it on the reference path, so the diverged round's metrics and results are the same."""
    _, _, rounds = assert_executors_agree(tiny_config("fedavg", "training.lr=10000", "training.local_epochs=3"),
                                         device)
    diverged = [m.metrics for m in rounds[-1].values() if m.metrics["diverged"]]
    assert diverged and all(np.isnan(m["train_loss"]) for m in diverged)


@pytest.fixture(scope="module")
def pool(ray_session):
    made = WorkerPool(WorkerPlan(workers=2, cpus=1.0, gpus=0.0))
    yield made
    made.shutdown()


@pytest.mark.parametrize("method", ["fedavg", "fedrep"])
def test_federation_on_ray_is_the_same_with_either_executor(pool, method):
    """Through the workers and the round loop, with the personalised protocol's fine-tuning (FedRep's
    head) on the same executor: same global state, client store and history."""
    runs = {}
    for kind in ("reference", "exact"):
        cfg = tiny_config(method, f"resources.executor={kind}", "federation.rounds=3",
                          "metrics.protocols=[global,all_model,personalized]", "training.finetune_epochs=1")
        fed = build_federation(cfg, tiny_data(), pool=pool)
        try:
            fed.run()
        finally:
            fed.close()
        history = [{k: v for k, v in row.items() if not k.endswith("_s")} for row in fed.history]  # timings
        runs[kind] = (fed.global_state, dict(fed.client_store), history)
    assert_same(runs["exact"], runs["reference"], method)
    assert "acc_personalized" in runs["exact"][2][-1]  # the fine-tuning ran on both paths


@pytest.mark.parametrize("method", ["fedavg", "scaffold", "fedcr"])
def test_drop_last_gives_the_reference_bits_and_trains_and_weighs_full_batches(method, device):
    """``training.drop_last``: each epoch's short last batch is dropped on both paths alike, so a client
    takes floor(n/B) steps an epoch and weighs floor(n/B)·B in a weighted average (FedAlign's code). FedCR folds its
    epoch's statistics by ``num_samples``, which is then the kept count."""
    cfg = tiny_config(method, "training.drop_last=true", "training.local_epochs=2", "training.batch_size=10")
    _, _, rounds = assert_executors_agree(cfg, device)
    data, batch = tiny_data(), cfg.training.batch_size
    assert any(len(data.client_train[c]) % batch for r in rounds for c in r)  # some client had a short batch
    for results in rounds:
        for cid, out in results.items():
            full = len(data.client_train[cid]) // batch
            assert (out.metrics["steps"], out.metrics["samples"]) == (2 * full, 2 * full * batch)
            assert out.weight == (full * batch if build_method(cfg).weighted_by_samples else 1.0)  # SCAFFOLD: a mean
