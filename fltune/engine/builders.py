"""Turning a validated config into the run's parts: data, model, method. Shared by driver and workers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from torch import nn

from fltune.config import ExperimentConfig
from fltune.data.datasets import load_dataset, normalised, subsample
from fltune.data.federated import FederatedData, build_federated_data
from fltune.engine.rng import derive_seed
from fltune.errors import FLTuneError
from fltune.methods import get_method
from fltune.methods.base import Method, State, to_numpy
from fltune.models import build_model, default_model


def load_data(cfg: ExperimentConfig) -> FederatedData:
    """Dataset + seeded, disk-cached partition."""
    loaded = load_dataset(cfg.data.dataset, cfg.data.root, cfg.data.download)
    dataset = subsample(normalised(loaded, cfg.data.normalise), cfg.data.subsample, cfg.federation.seed)
    part = cfg.partition
    data = build_federated_data(
        dataset, kind=part.kind, num_clients=cfg.federation.clients, seed=cfg.federation.seed, alpha=part.alpha,
        classes_per_client=part.classes_per_client, shards_per_client=part.shards_per_client,
        min_size=part.min_size, eval_fraction=part.eval_fraction, val_fraction=part.val_fraction,
        pool_test=part.pool_test, test_per_client=part.test_per_client, cache_dir=part.cache_dir,
    )
    check_drop_last(cfg, data)
    return data if cfg.metrics.test else data.without_test()


def check_drop_last(cfg: ExperimentConfig, data: FederatedData) -> None:
    """Refuse, before Ray, ``training.drop_last`` with a client smaller than one batch: it would train no step,
    weigh nothing, and SCAFFOLD or FedNova would divide by its zero steps."""
    if not cfg.training.drop_last:
        return
    sizes = [len(train) for train in data.client_train]
    smallest = min(range(len(sizes)), key=sizes.__getitem__)
    if sizes[smallest] < cfg.training.batch_size:
        raise FLTuneError(f"training.drop_last: client {smallest} has {sizes[smallest]} training samples, fewer than "
                          f"training.batch_size {cfg.training.batch_size}, so it would train no step; allowed: "
                          f"training.batch_size ≤ {sizes[smallest]}, a split with larger clients, or drop_last false")


def model_name(cfg: ExperimentConfig) -> str:
    """``auto`` → the method's own model if it needs one, else the dataset's default."""
    if cfg.model.name != "auto":
        return cfg.model.name
    return get_method(cfg.method.name).model_for(cfg.data.dataset) or default_model(cfg.data.dataset)


def build_model_for(cfg: ExperimentConfig, data: FederatedData) -> nn.Module:
    """The dataset's model, extended by the method's ``adapt_model`` hook."""
    return model_of(cfg, data.input_shape, data.num_classes)


def model_of(cfg: ExperimentConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """:func:`build_model_for` from the data's shape alone (a saved model, a calibration)."""
    return build_method(cfg).adapt_model(build_model(model_name(cfg), input_shape, num_classes, **cfg.model.options))


MODEL_FILES = ("model.pt", "clients.pt", "model.json")
"""A saved run's weights: the global ``state_dict`` (``torch.load``-able), each client's own weights where the
method keeps some ({client id: the entries that differ from the global ones}), and the model's input shape and
classes, which with the run's config rebuild the module (``saved_model``)."""


def save_model(folder: Path, data: FederatedData, global_state: State, personal: Mapping[int, State]) -> Path:
    """Write ``MODEL_FILES`` (``clients.pt`` only with ``personal`` weights) into ``folder``; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(_tensors(global_state), folder / MODEL_FILES[0])
    if personal:
        torch.save({cid: _tensors(state) for cid, state in personal.items()}, folder / MODEL_FILES[1])
    shape = {"input_shape": list(data.input_shape), "num_classes": data.num_classes}
    (folder / MODEL_FILES[2]).write_text(json.dumps(shape) + "\n")
    return folder


def _tensors(state: State) -> dict[str, torch.Tensor]:
    return {key: torch.from_numpy(value.copy()) for key, value in state.items()}


def saved_model(cfg: ExperimentConfig, folder: Path, client: int | None = None) -> nn.Module:
    """The module ``save_model`` wrote into ``folder`` for the run of ``cfg``, in eval mode: the global weights,
    or ``client``'s own model (the global weights overridden by its personal ones)."""
    shape = json.loads((folder / MODEL_FILES[2]).read_text())
    model = model_of(cfg, tuple(shape["input_shape"]), shape["num_classes"])
    state = torch.load(folder / MODEL_FILES[0], weights_only=True)
    if client is not None:
        clients = cfg.federation.clients
        if not 0 <= client < clients:
            raise FLTuneError(f"client: {client} is not a client of this run; allowed: 0 to {clients - 1}")
        personal = folder / MODEL_FILES[1]
        state.update(torch.load(personal, weights_only=True).get(client, {}) if personal.is_file() else {})
    model.load_state_dict(state)
    return model.eval()


def initial_state(cfg: ExperimentConfig, data: FederatedData,
                  model: Callable[[FederatedData], nn.Module] | None = None) -> State:
    """The round-0 global model (of ``model``, default the config's), initialised from the run's seed alone."""
    torch.manual_seed(derive_seed(cfg.federation.seed, -1, -1))
    return to_numpy((model or partial(build_model_for, cfg))(data).state_dict())


def build_method(cfg: ExperimentConfig) -> Method:
    method_cls = get_method(cfg.method.name)
    return method_cls(cfg.method.params)


def resolve_augment(cfg: ExperimentConfig, data: FederatedData) -> str:
    """``auto`` = the dataset's own default (crop+flip for CIFAR/SVHN, none for FMNIST/EMNIST)."""
    return data.augment if cfg.data.augment == "auto" else cfg.data.augment


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` torch threads (as a ``cpus_per_worker`` worker), then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)
