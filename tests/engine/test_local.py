"""The client optimiser ``make_optimizer`` builds from the training section: Nesterov SGD when
``training.nesterov`` (FedAlign's every method: ``SGD(..., momentum=0.9, nesterov=True)``,
``mmendiet/FedAlign:methods/fedavg.py``), plain momentum SGD otherwise; and the final personal round
``final_round`` runs, as each method declares it; the exact path trains without importing ``torch._dynamo``."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from fltune.config import build_config
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data
from fltune.engine.local import DeviceMeter, HostMeter, Trainer, final_round, make_optimizer, train_client
from fltune.engine.transfer import RoundInput, load_state
from fltune.methods.base import Method, Phase, effective_steps
from tests.engine.helpers import OpCount


def two_steps(*overrides: str) -> float:
    """w after two steps of d(2w)/dw = 2 from w = 0 at lr 0.1 with the configured optimiser."""
    training = build_config(overrides=["training.momentum=0.9", *overrides]).training
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = make_optimizer([w], training, lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        (2.0 * w).sum().backward()
        optimizer.step()
    return w.item()


def test_nesterov_setting_reaches_the_optimiser():
    """Heavy ball moves w by lr·g·(1 + 1.9) = 0.58 in two steps; Nesterov by lr·g·(1.9 + 2.71) = 0.922."""
    assert two_steps() == pytest.approx(-0.1 * 2.0 * 2.9, abs=1e-12)
    assert two_steps("training.nesterov=true") == pytest.approx(-0.1 * 2.0 * 4.61, abs=1e-12)
    assert 4.61 == pytest.approx(effective_steps(2, 0.9, nesterov=True))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
@pytest.mark.parametrize("setting", [
    {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}, {"momentum": 0.0, "weight_decay": 0.01},
])
def test_the_sgd_step_is_torchs_sgd_to_the_bit(setting, device):
    """``make_optimizer``'s SGD (``objective.sgd_step``, every path's one step) moves the weights as
    ``torch.optim.SGD`` does (on CUDA its multi-tensor kernels), bit for bit, over steps at changing lrs, a
    parameter without a gradient left alone."""
    torch.manual_seed(0)
    start = [torch.randn(5, 3, device=device), torch.randn(3, device=device), torch.randn(2, device=device)]
    ours, torchs = ([w.clone().requires_grad_() for w in start] for _ in range(2))
    optimizers = (make_optimizer(ours, build_config({"training": setting}).training, 0.1),
                  torch.optim.SGD(torchs, lr=0.1, **setting))
    for lr in (0.1, 0.05, 0.1):
        grads = [torch.randn_like(w) for w in start[:2]]  # the last weight gets none
        for params, optimizer in zip((ours, torchs), optimizers):
            optimizer.param_groups[0]["lr"] = lr
            for param, grad in zip(params, grads):
                param.grad = grad.clone()
            optimizer.step()
            optimizer.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(ours, torchs)) and torch.equal(ours[2], start[2])
    assert not torch.equal(ours[0], start[0])


def _final_round_setup(method: str, **training: object) -> tuple:
    """A synthetic 4-client run's config, data, method, model and round-(R+1) input: 60 samples a client and
    the MLP, so a phase is a few cheap batches (these tests check which batches and steps, not how many)."""
    cfg = build_config({"data": {"dataset": "synthetic", "subsample": 0.04}, "model": {"name": "mlp"},
                        "method": {"name": method}, "federation": {"clients": 4},
                        "training": {"local_epochs": 1, **training}})
    data = load_data(cfg)
    state = initial_state(cfg, data)
    inputs = RoundInput(round=cfg.federation.rounds + 1, seed=0, lr=0.01, global_state=state, server={})
    return cfg, data, build_method(cfg), inputs


def test_dittos_final_round_is_one_more_ditto_update_whose_personal_model_is_left_to_evaluate():
    """``final_round = "own"`` (FedCR's main_fed_ditto.py last round): every parameter of the client's
    personal model v trains for ``finetune_epochs`` (not ``local_epochs``) on Ditto's own objective, and v,
    not the global copy w, is what the evaluation then scores."""
    cfg, data, ditto, inputs = _final_round_setup("ditto", finetune_epochs=2)
    personal = {k: v + np.float32(0.05) for k, v in inputs.global_state.items()}
    cpu = torch.device("cpu")

    model = build_model_for(cfg, data)
    final_round(Trainer.of(ditto, model, data, cfg.training, cpu), 0, inputs, {"personal": personal})
    left = {k: v.detach().numpy() for k, v in model.state_dict().items()}

    def ditto_round(epochs: int) -> dict:
        training = cfg.training.model_copy(update={"local_epochs": epochs})
        out = train_client(Trainer.of(ditto, build_model_for(cfg, data), data, training, cpu), 0, inputs,
                           {"personal": personal})
        return out.state["personal"]

    two, one = ditto_round(2), ditto_round(1)
    assert all(np.array_equal(left[k], two[k]) for k in left)
    assert not all(np.array_equal(left[k], one[k]) for k in left)
    assert all(not np.array_equal(left[k], personal[k]) for k in left)  # body and head both trained


def test_a_tuning_final_round_trains_the_personal_part_on_its_client_model():
    """``final_round = "tune"`` (FedPer): the head moves from the client's own head, the shared body stays."""
    cfg, data, fedper, inputs = _final_round_setup("fedper", finetune_epochs=2)
    head = {k: v + np.float32(0.05) for k, v in inputs.global_state.items() if k.startswith("head.")}
    model = build_model_for(cfg, data)
    final_round(Trainer.of(fedper, model, data, cfg.training, torch.device("cpu")), 0, inputs, {"personal": head})
    left = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert all(np.array_equal(left[k], v) for k, v in inputs.global_state.items() if not k.startswith("head."))
    assert all(not np.array_equal(left[k], head[k]) and not np.array_equal(left[k], inputs.global_state[k])
               for k in head)


class _Recorder(Method):
    """FedAvg that records its batches and takes every ``slow``-th step at lr 0 (``ClientContext.step_lr``)."""

    name = "recorder"
    stored_models = passes_per_step = 1.0

    def __init__(self, epochs: int, steps: int | None, slow: int = 0) -> None:
        super().__init__()
        self.epochs, self.steps, self.slow, self.seen, self.batches = epochs, steps, slow, [], []

    def phases(self, ctx):
        return [Phase(epochs=self.epochs, steps=self.steps)]

    def backward(self, ctx, x, y):
        self.seen.append(y.clone())
        self.batches.append((x.clone(), y.clone()))
        if self.slow and len(self.seen) % self.slow == 0:
            ctx.step_lr = 0.0
        return super().backward(ctx, x, y)


@pytest.mark.parametrize("executor", [pytest.param("reference", marks=pytest.mark.extended), "exact"])
def test_a_phase_capped_at_steps_stops_mid_epoch_and_draws_no_epoch_past_its_cap(executor: str):
    """``Phase.steps`` (Per-FedAvg's iteration count): the first N batches of the uncapped phase's stream,
    the client's generator left where N batches leave it (a later epoch is never begun)."""
    cfg, data, _, inputs = _final_round_setup("fedavg", batch_size=4)
    n_b = -(-len(data.client_train[0]) // 4)
    runs = {}
    for steps in (None, n_b + 1, 2 * n_b):
        method = _Recorder(epochs=3, steps=steps)
        trainer = Trainer.of(method, build_model_for(cfg, data), data, cfg.training, torch.device("cpu"),
                             exact=executor == "exact")
        out = train_client(trainer, 0, inputs, {})
        runs[steps] = (method.seen, out.metrics["steps"])
    full, _ = runs[None]
    assert len(full) == 3 * n_b
    for steps in (n_b + 1, 2 * n_b):
        seen, taken = runs[steps]
        assert taken == len(seen) == steps and all(torch.equal(a, b) for a, b in zip(seen, full))


def test_a_step_at_another_lr_takes_that_lr_for_that_step_alone():
    """``ClientContext.step_lr`` = 0 on every second step: SGD with momentum then moves the weights on the
    slow steps by nothing but still folds their gradients into its buffer, and every other step runs at the
    phase's lr again: the hand-written loop over the same batches, bit for bit."""
    cfg, data, _, inputs = _final_round_setup("fedavg", batch_size=4, momentum=0.9)
    slow, model = _Recorder(epochs=1, steps=None, slow=2), build_model_for(cfg, data)
    train_client(Trainer.of(slow, model, data, cfg.training, torch.device("cpu")), 0, inputs, {})

    reference = build_model_for(cfg, data)
    load_state(reference, inputs.global_state)
    optimizer = torch.optim.SGD(reference.parameters(), lr=inputs.lr, momentum=0.9)
    for i, (x, y) in enumerate(slow.batches, start=1):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.param_groups[0]["lr"] = 0.0 if i % 2 == 0 else inputs.lr
        optimizer.step()
    assert len(slow.batches) > 2
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    assert not all(torch.equal(a, torch.from_numpy(inputs.global_state[k]))
                   for k, a in model.state_dict().items())


def test_the_exact_paths_training_and_evaluation_import_no_dynamo():
    """A process that trains clients on the exact path (kept SGD, FedRep's two phases) and evaluates never
    imports ``torch._dynamo``: any ``torch.optim.Optimizer`` would (~150 MiB per training process, issue 12's
    tree memory). In a fresh interpreter, since this one may have imported it already."""
    code = """
import sys, torch
from fltune.config import build_config
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data
from fltune.engine.evaluation import evaluate
from fltune.engine.local import Trainer, train_client
from fltune.engine.transfer import RoundInput
cfg = build_config({"data": {"dataset": "synthetic"}, "method": {"name": "fedrep"}, "federation": {"clients": 4},
                    "training": {"local_epochs": 1, "nesterov": True, "weight_decay": 0.01}})
data, cpu = load_data(cfg), torch.device("cpu")
method, model, state = build_method(cfg), build_model_for(cfg, data), initial_state(cfg, data)
trainer = Trainer.of(method, model, data, cfg.training, cpu, exact=True)
inputs = RoundInput(round=1, seed=0, lr=0.1, global_state=state, server={})
steps = sum(train_client(trainer, c, inputs, {}).metrics["steps"] for c in range(2))
evaluate(model, data, data.test_x, data.test_y, cpu)
print(steps > 0, "torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_device_meter_keeps_the_host_meters_figures_in_few_ops_a_step(bad):
    """The device meter sums what the host meter sums (same float64 bits), flags a client whose loss once
    was non-finite from the sum alone, and spends at most 8 ops a step (each a launch on a GPU)."""
    torch.manual_seed(0)
    steps = [(torch.rand(()) * 3, torch.randn(7, 10), torch.randint(0, 10, (7,))) for _ in range(5)]
    host, device, ops = HostMeter(torch.device("cpu")), DeviceMeter(torch.device("cpu")), OpCount()
    for loss, logits, y in steps:
        assert host.finite(loss)
        host.add(loss, logits, y)
        with ops:
            assert device.finite(loss)
            device.add(loss, logits, y)
    assert device.totals() == host.totals() and not device.totals()[3]
    assert ops.count <= 8 * len(steps)
    for loss in (torch.tensor(bad), torch.tensor(1.0)):  # a later finite loss does not hide it
        device.add(loss, steps[0][1], steps[0][2])
    assert device.totals()[3]
