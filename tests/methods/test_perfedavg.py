"""Per-FedAvg as the FedSOL authors' code runs it (``Lee-Gihun/FedSOL:algorithms/perfedavg/ClientTrainer.py``;
docs/methods.md §2): fltune's ``train_client`` against that code's loop written out by hand — one momentum SGD
for both steps, the lr switched per step, θ restored before step 2's update, ⌈n_b/E⌉ iterations per outer loop
on a batch stream that reshuffles when it runs out — for the local update and for the fine-tuning round."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator
from functools import cache

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from fltune.config import ExperimentConfig, build_config
from fltune.data.federated import FederatedData
from fltune.engine.batched import unbatchable
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data
from fltune.engine.batches import HostBatches
from fltune.engine.local import Trainer, final_training, train_client
from fltune.engine.transfer import RoundInput
from fltune.engine.rng import derive_seed
from fltune.engine.functional import batchable
from fltune.methods import get_method
from fltune.methods.base import Method
from fltune.methods.perfedavg import PerFedAvgTune, meta_phase
from tests.methods.helpers import make_ctx, tiny_model

PerFedAvg = get_method("perfedavg")
CPU = torch.device("cpu")
CLIENT, ROUND, LR = 1, 3, 0.05
State = dict[str, torch.Tensor]


def config(method: dict[str, object] | None = None, executor: str = "reference",
           **training: object) -> ExperimentConfig:
    """4 synthetic clients of 45 samples, the MLP, the code's optimiser (momentum 0.9, weight decay 1e-5)."""
    return build_config({
        "data": {"dataset": "synthetic", "subsample": 0.03}, "model": {"name": "mlp"},
        "method": {"name": "perfedavg", **(method or {})}, "federation": {"clients": 4},
        "training": {"momentum": 0.9, "weight_decay": 1e-5, **training}, "resources": {"executor": executor},
    })


@cache
def tiny_data() -> FederatedData:
    data = load_data(config())
    assert len(data.client_train[CLIENT]) == 45
    return data


def engine(method: Method, cfg: ExperimentConfig, kind: str, lr: float = LR) -> tuple[State, dict[str, float]]:
    """fltune's client update (``train_client`` on the ``kind`` executor): the weights it ends with, its metrics."""
    data = tiny_data()
    model = build_model_for(cfg, data)
    inputs = RoundInput(round=ROUND, seed=cfg.federation.seed, lr=lr, global_state=initial_state(cfg, data), server={})
    out = train_client(Trainer.of(method, model, data, cfg.training, CPU, exact=kind == "exact"), CLIENT, inputs, {})
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, out.metrics


def code_update(cfg: ExperimentConfig, loops: int, lr: float, beta: float, restore: bool = True) -> tuple[State, int]:
    """The authors' ``train``/``finetune`` loop on the client's batches (drawn as fltune draws them, from the
    client's seed): its final weights and the batches it took. ``restore=False`` drops the restore of θ."""
    data, training = tiny_data(), cfg.training
    model: nn.Module = build_model_for(cfg, data)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in initial_state(cfg, data).items()})
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0, momentum=training.momentum,
                                weight_decay=training.weight_decay)
    seed = derive_seed(cfg.federation.seed, ROUND, CLIENT)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    indices, size = tiny_data().client_train[CLIENT], training.batch_size
    kept = len(indices) // size * size if training.drop_last else len(indices)

    def loader() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return HostBatches(data, CPU).epoch(indices, size, generator, "none", kept)

    iter_loader, taken = loader(), 0

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal iter_loader, taken
        taken += 1
        try:
            return next(iter_loader)
        except StopIteration:
            iter_loader = loader()
            return next(iter_loader)

    len_loader = len(indices) // size if training.drop_last else math.ceil(len(indices) / size)  # DataLoader's len
    num_iter = math.ceil(len_loader / training.local_epochs)
    for _ in range(loops):
        for _ in range(num_iter):
            temp_net = copy.deepcopy(list(model.parameters()))
            for group in optimizer.param_groups:  # Step-1
                group["lr"] = lr
            x, y = next_batch()
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            for group in optimizer.param_groups:  # Step-2
                group["lr"] = beta
            x, y = next_batch()
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            if restore:
                for old_p, new_p in zip(model.parameters(), temp_net):
                    old_p.data = new_p.data.clone()
            optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, taken


def same(a: State, b: State) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# E = 3 and n_b = 5 (45 samples, B = 10, short last batch; or 40 kept of B = 8 with drop_last): n_b is not a
# multiple of E, so a round is 2·3·⌈5/3⌉ = 12 steps, two whole epochs and two batches into a third
UPDATES = [(10, False, 10 + 10 + 10 + 10 + 5, 12), (8, True, 40, 12)]


@pytest.mark.parametrize("kind", ["reference", "exact"])
@pytest.mark.parametrize("batch_size, drop_last, epoch_samples, steps", UPDATES)
def test_the_local_update_is_the_authors_loop_bit_for_bit(kind: str, batch_size: int, drop_last: bool,
                                                          epoch_samples: int, steps: int) -> None:
    cfg = config(local_epochs=3, batch_size=batch_size, drop_last=drop_last)
    beta = PerFedAvg.Params().beta
    state, metrics = engine(build_method(cfg), cfg, kind)
    expected, taken = code_update(cfg, loops=3, lr=LR, beta=beta)

    assert same(state, expected)
    assert taken == metrics["steps"] == steps == 2 * 3 * math.ceil(5 / 3)
    assert metrics["samples"] == 2 * epoch_samples + 2 * batch_size  # stopped mid-epoch, after 2 batches
    # the comparison sees a wrong method: another β or a missing restore ends elsewhere
    assert not same(state, code_update(cfg, loops=3, lr=LR, beta=2 * beta)[0])
    assert not same(state, code_update(cfg, loops=3, lr=LR, beta=beta, restore=False)[0])


@pytest.mark.parametrize("finetune_lr", [None, 0.03])
@pytest.mark.parametrize("kind", ["reference", "exact"])
def test_the_fine_tuning_round_is_the_authors_finetune_bit_for_bit(kind: str, finetune_lr: float | None) -> None:
    """τ = 1 with E = 5: 2·⌈n_b/E⌉ = 2·⌈12/5⌉ = 6 steps (45 samples, B = 4), half an epoch; every parameter
    trains, though ``finetune_params`` is ``personal``; step 1 at the round's lr, step 2 at the method's β."""
    cfg = config({"beta": 0.02}, local_epochs=5, batch_size=4, finetune_epochs=1, finetune_lr=finetune_lr)
    method = build_method(cfg)
    assert cfg.training.finetune_params == "personal" and method.params.beta == 0.02
    final = final_training(Trainer.of(method, build_model_for(cfg, tiny_data()), tiny_data(), cfg.training, CPU))
    assert isinstance(final.method, PerFedAvgTune) and final.training.local_epochs == 5
    state, metrics = engine(final.method, cfg, kind)
    expected, taken = code_update(cfg, loops=1, lr=finetune_lr or LR, beta=0.02)

    assert same(state, expected)
    assert taken == metrics["steps"] == 6 and metrics["samples"] == 6 * 4
    assert not same(state, code_update(cfg, loops=1, lr=finetune_lr or LR, beta=0.01)[0])
    assert not same(state, code_update(cfg, loops=1, lr=finetune_lr or LR, beta=0.02, restore=False)[0])


@pytest.mark.parametrize("samples, batch_size, epochs, steps, phase_epochs", [
    (45, 10, 3, 12, 3),  # n_b 5: ⌈5/3⌉ = 2 iterations per outer loop
    (40, 8, 3, 12, 3),  # drop_last's 40 kept of 45: n_b = 40/8 = 5 exactly
    (500, 50, 5, 20, 2),  # FedSOL's setting (B 50, E 5) on a 500-sample client: n_b 10, 2 epochs of batches
    (30, 50, 5, 10, 10),  # one short batch: still ⌈1/5⌉ = 1 iteration per outer loop, 10 epochs of it
    (0, 50, 5, 0, 0),  # no batch: no step
])
def test_the_phase_counts_the_codes_iterations(samples: int, batch_size: int, epochs: int, steps: int,
                                               phase_epochs: int) -> None:
    ctx = dataclasses.replace(make_ctx(tiny_model()), num_samples=samples, batch_size=batch_size, epochs=epochs)
    (phase,) = PerFedAvg().phases(ctx)
    assert (phase.steps, phase.epochs, phase.prefixes, phase.lr) == (steps, phase_epochs, None, None)
    assert meta_phase(ctx, 1, 0.5).steps == steps // epochs and meta_phase(ctx, 1, 0.5).lr == 0.5


def test_beta_must_be_positive_and_defaults_to_the_authors_config() -> None:
    assert PerFedAvg.Params().beta == 0.01
    for bad in (0.0, -0.01):
        with pytest.raises(ValidationError, match="beta"):
            PerFedAvg.Params(beta=bad)


def test_training_and_tuning_fall_back_to_per_client_under_the_batched_executor() -> None:
    """Neither step has a functional form (a restore and a per-step lr): ``resources.executor: batched``
    trains both the rounds and the final round client by client, on the exact path tested above."""
    cfg = config(executor="batched", finetune_epochs=1)
    method, model = build_method(cfg), build_model_for(cfg, tiny_data())
    final = final_training(Trainer.of(method, model, tiny_data(), cfg.training, CPU)).method
    assert not batchable(type(method)) and not batchable(type(final))
    for hooks in (method, final):
        reason = unbatchable(cfg, hooks, model)
        assert reason is not None and "backward of its own" in reason
