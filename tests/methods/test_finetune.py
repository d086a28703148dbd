"""The final personal round (``FineTune``): what it trains, as FedCR's last round does (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fltune.config import build_config
from fltune.engine.local import Trainer, train_client
from fltune.engine.transfer import RoundInput
from fltune.methods.finetune import FineTune, tuned_prefixes
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data
from fltune.methods import get_method
from fltune.models import build_model


@pytest.mark.parametrize("method, model, tuned", [
    ("fedavg", "mlp", ("head.",)),  # FedAvg-FT: nothing personal, the head is tuned
    ("fedper", "mlp", ("head.",)),  # the personal head
    ("fedsr", "vib_mlp", ("head.",)),  # FedSR-FT: its personal r(z|y), C live in the head: the whole head
    ("lg_fedavg", "mlp", ("body.",)),  # LG-FedAvg: the personal lower layers, the shared top two frozen
])
def test_the_personal_part_is_tuned_or_else_the_head(method: str, model: str, tuned: tuple[str, ...]) -> None:
    algo = get_method(method)()
    net = algo.adapt_model(build_model(model, (1, 4, 4), 3))
    prefixes = tuned_prefixes(algo, net)
    assert {k.split(".")[0] + "." for k in prefixes} == set(tuned)
    if method == "lg_fedavg":
        assert set(prefixes) == {"body.fc1.linear.weight", "body.fc1.linear.bias"}


@pytest.mark.parametrize("method, whole, changed", [
    ("lg_fedavg", False, {"body."}), ("fedper", False, {"head."}),
    ("fedbabu", True, {"body.", "head."}),  # finetune_params: all (FedSOL's code): every parameter, FedBABU's head too
])
def test_tuning_moves_only_the_tuned_part(method: str, whole: bool, changed: set[str]) -> None:
    cfg = build_config({"data": {"dataset": "synthetic"}, "method": {"name": method},
                        "federation": {"clients": 4}, "training": {"finetune_epochs": 2, "grad_clip": 10.0}})
    data = load_data(cfg)
    algo, model = build_method(cfg), build_model_for(cfg, data)
    state = initial_state(cfg, data)
    inputs = RoundInput(round=cfg.federation.rounds + 1, seed=0, lr=0.1, global_state=state, server={})
    tuner = FineTune(algo, 2, None, whole)
    out = train_client(Trainer.of(tuner, model, data, cfg.training, torch.device("cpu")), 0, inputs, {})
    assert out.metrics["steps"] > 0
    after = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    moved = {k for k in state if not np.array_equal(state[k], after[k])}
    assert {k.split(".")[0] + "." for k in moved} == changed
