"""Turning a validated config into the run's parts: data, model, method. Shared by driver and workers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
    model = build_model(model_name(cfg), data.input_shape, data.num_classes, **cfg.model.options)
    return build_method(cfg).adapt_model(model)


def initial_state(cfg: ExperimentConfig, data: FederatedData) -> State:
    """The round-0 global model, initialised from the run's seed alone."""
    torch.manual_seed(derive_seed(cfg.federation.seed, -1, -1))
    return to_numpy(build_model_for(cfg, data).state_dict())


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
