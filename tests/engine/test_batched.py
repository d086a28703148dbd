"""The batched executor (engine/batched.py): client by client it follows the exact path up to float
rounding; runs are deterministic and independent of the worker count; unsupported methods fall back."""

from __future__ import annotations

import logging
import statistics
import weakref
from typing import Any

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.data.augment import to_float
from fltune.engine.batched import (
    _common_phases, _group, _GroupEpoch, _padded, _Tally, client_groups, client_noise, train_group, unbatchable,
)
from fltune.engine.builders import build_method, build_model_for, initial_state, load_data
from fltune.engine import local
from fltune.engine.federation import Federation
from fltune.engine.batches import HostBatches
from fltune.engine.local import Trainer, train_client
from fltune.engine.transfer import RoundInput
from fltune.engine.dispatch import balance
from fltune.engine.functional import batchable
from fltune.engine.rng import derive_seed
from fltune.methods import METHODS, get_method
from fltune.methods.base import ClientResult, Method, Phase
from fltune.methods.objective import ClientByClient, draw_noise
from fltune.models import build_model
from tests.conftest import SharedPools, needs_fmnist
from tests.engine.helpers import OpCount

CPU = torch.device("cpu")
LOCAL = [  # unequal clients (152..461 samples) and B = 32: every client ends its epochs on a short batch
    "data.dataset=synthetic", "data.subsample=0.3", "model.name=mlp", "partition.kind=dirichlet", "partition.alpha=0.3",
    "federation.clients=6", "training.batch_size=32", "training.local_epochs=1", "tracking.enabled=false",
]
FEDERATION = [
    "data.dataset=synthetic", "model.name=mlp", "partition.kind=dirichlet_prior", "federation.clients=10",
    "federation.fraction=0.4", "federation.rounds=2", "training.local_epochs=1", "training.batch_size=32",
    "training.lr=0.05", "metrics.protocols=[global]", "tracking.enabled=false", "resources.batch_clients=2",
]


def round_one(overrides: list[str], lr: float = 0.01) -> tuple:
    """Config, data, method, model, round-1 input and global tensors of a ``LOCAL`` run: round 1 from the
    initial model with the method's first server payload; SCAFFOLD gets a non-zero server c, FedPAC-FedCR
    non-zero class centroids."""
    cfg = build_config(overrides=[*LOCAL, *overrides])
    data, method = load_data(cfg), build_method(cfg)
    model = build_model_for(cfg, data)
    start = initial_state(cfg, data)
    rng = np.random.default_rng(0)
    server = {**method.server_payload(method.init_server_state(start)),
              "c": {k: rng.normal(0, 0.01, v.shape).astype(v.dtype) for k, v in start.items()},
              "centroids": rng.normal(0, 0.1, (data.num_classes, model.feature_dim)).astype(np.float32)}
    inputs = RoundInput(round=1, seed=0, lr=lr, global_state=start, server=server)
    return cfg, data, method, model, inputs, {k: torch.tensor(v) for k, v in start.items()}


def grouped(method, model, data, cfg, device=CPU, augment="none") -> Trainer:
    """The parts a batched worker trains ``method`` with (its device pool of ``data``)."""
    return Trainer.of(method, model, data, cfg.training, device, augment, exact=True)


def exact_and_batched(overrides: list[str], group: list[int], lr: float = 0.01) -> list[tuple[dict, dict]]:
    """Per client of ``group`` (``round_one``): ((arrays, metrics) on the exact path, (arrays, metrics)
    batched with the whole group at once); arrays: the update, the personal state (``personal:`` keys) and
    the upload (``upload:``)."""
    cfg, data, method, model, inputs, tensors = round_one(overrides, lr)
    exact = {cid: train_client(Trainer.of(method, model, data, cfg.training, CPU), cid, inputs, {}, tensors)
             for cid in group}
    batched = dict(train_group(grouped(method, model, data, cfg), group, inputs, {}, tensors))
    return [(arrays_and_metrics(exact[cid]), arrays_and_metrics(batched[cid])) for cid in group]


def arrays_and_metrics(out: ClientResult) -> tuple[dict, dict]:
    personal = {f"personal:{k}": v for k, v in out.state.get("personal", {}).items()}
    upload = {f"upload:{k}": v for k, v in out.upload.items()}
    return {**out.update, **personal, **upload}, out.metrics


VIB = ["model.name=vib_mlp", "model.options={dim_z: 16, samples: 4}"]
NEW_METHODS = [  # the step beyond one loss's gradient: SAM's two evaluations, Ditto's second model, VIB's ε
    ["method.name=ditto", "method.lam=0.5"], ["method.name=fedsam", "method.rho=0.5"],
    ["method.name=fedasam", "method.rho=1.0"], ["method.name=fedspeed", "method.lam=0.5", "method.rho=0.5"],
    ["method.name=fedsr", "method.alpha_l2r=0.1", "method.alpha_cmi=0.1", *VIB],
    ["method.name=fedcr", "method.beta=0.1", *VIB], ["method.name=simfafl", "method.beta1=0.1", *VIB],
    ["method.name=fedsol", "method.rho=1.0", "method.scope=all"], ["method.name=fedsol", "method.rho=2.0"],
]


def ids(overrides: list[str]) -> str:
    return "-".join(s.split("=")[-1] for s in overrides if not s.startswith("model."))


EVERY_BATCHED = [  # every method the batched executor trains, with its terms switched on
    ["method.name=fedavg"], ["method.name=fedprox", "method.mu=0.1"], ["method.name=scaffold"],
    ["method.name=fedrep"], ["method.name=lg_fedavg"], ["method.name=fedbabu"], ["method.name=fedper"],
    ["method.name=feddyn", "method.alpha=0.1"], ["method.name=feddc", "method.alpha=0.1"], ["method.name=fednova"],
    *NEW_METHODS, ["method.name=fedpac_fedcr", "method.lam=0.5"], ["method.name=knnper"], ["method.name=local_only"],
]


def test_every_batched_method_is_checked_against_the_exact_path():
    """A method the batched executor trains (no backward of its own, no ResNet-56's BatchNorm, an objective reading
    no client module) is in ``EVERY_BATCHED``, which checks its batched step against the exact path's."""
    checked = {s.removeprefix("method.name=") for overrides in EVERY_BATCHED for s in overrides
               if s.startswith("method.name=")}
    assert checked == {name for name, cls in METHODS.items() if batchable(cls) and cls.default_model != "resnet56"}


def slow_where(cases: list[list[str]], methods: tuple[str, ...],
               mark: pytest.MarkDecorator = pytest.mark.slow) -> list:
    """``cases`` as parameters, those of ``methods`` marked ``mark``: ``slow`` (the fast loop leaves them out)
    or ``extended`` (the suite too)."""
    return [pytest.param(o, marks=mark) if {f"method.name={m}" for m in methods} & set(o) else o for o in cases]


@pytest.mark.parametrize("overrides", slow_where([
    *EVERY_BATCHED,
    ["training.nesterov=true", "training.weight_decay=1e-3", "training.grad_clip=0.5"],
    ["training.momentum=0"],
    ["training.drop_last=true"], ["method.name=fedcr", "method.beta=0.1", *VIB, "training.drop_last=true"],
    ["method.name=fedcr", "method.beta=0.1", "method.centroids=overall", *VIB],
], ("ditto", "fedsr", "fedcr", "fedsol")), ids=ids)  # a second model or a VIB model's draws: seconds each
def test_each_client_follows_the_exact_path(overrides):
    """Masking (fewer steps for smaller clients, short last batches), the SGD state and every method's
    functional step: each client's weights, personal state, upload and metrics match the exact path's up
    to float rounding in a group with clients of other sizes (a wrong or missing step moves weights by
    ~lr·g ≈ 1e-3). VIB clients draw the exact path's ε (their own generators), so they match too."""
    assert_follows_exact(overrides, [0, 1, 2, 3])


@pytest.mark.parametrize("overrides", [["method.name=fedavg"], ["method.name=fedrep"], *NEW_METHODS], ids=ids)
def test_a_client_alone_follows_the_exact_path(overrides):
    """One client per group: the vmapped step of a single client is the exact path's step."""
    assert_follows_exact(overrides, [3])


def assert_follows_exact(overrides: list[str], group: list[int]) -> None:
    for (exact_state, exact_metrics), (state, metrics) in exact_and_batched(overrides, group):
        assert exact_state.keys() == state.keys()
        for key in state:
            np.testing.assert_allclose(state[key], exact_state[key], rtol=1e-3, atol=1e-4, err_msg=key)
        assert {k: metrics[k] for k in ("samples", "steps", "diverged")} == {
            k: exact_metrics[k] for k in ("samples", "steps", "diverged")}
        assert metrics["train_loss"] == pytest.approx(exact_metrics["train_loss"], rel=1e-5)
        assert metrics["train_acc"] == pytest.approx(exact_metrics["train_acc"], abs=1e-2)


@pytest.mark.parametrize("overrides", [
    ["method.name=fedrep"], ["method.name=lg_fedavg"], ["method.name=ditto", "method.lam=0.5"],
    ["method.name=fedcr", "method.beta=0.1", *VIB], ["method.name=fedsr", *VIB],
], ids=ids)
def test_a_final_round_in_groups_follows_the_exact_one(overrides):
    """The last round's pass over every client, batched (``ClientWorker._final_rounds``): each client's
    tuned head (FedRep, and FedCR's and FedSR's VIB nets, whose train-mode forward averages the net's S
    sampled z: ε from the client's own generator), tuned body (LG-FedAvg) or Ditto's own round ends on the
    exact path's weights up to float rounding, in a group with clients of other sizes."""
    cfg, data, method, model, inputs, tensors = round_one([*overrides, "training.finetune_epochs=2"], lr=0.05)
    inputs = RoundInput(round=cfg.federation.rounds + 1, seed=0, lr=0.05, global_state=inputs.global_state, server={})
    group, start = [0, 1, 2, 3], {k: v.clone() for k, v in model.state_dict().items()}
    exact = {}
    for cid in group:
        local.final_round(Trainer.of(method, model, data, cfg.training, CPU), cid, inputs, {}, tensors)
        exact[cid] = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = grouped(method, model, data, cfg)
    final = local.final_training(trainer)
    assert batchable(type(final.method))
    for cid, result in train_group(final, group, inputs, {}, tensors):
        local.final_model(trainer, inputs, result, tensors)
        assert any(not torch.equal(exact[cid][k], start[k]) for k in start)  # the round trained something
        for key, value in model.state_dict().items():
            torch.testing.assert_close(value, exact[cid][key], rtol=1e-3, atol=1e-4, msg=key)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
@pytest.mark.parametrize("overrides", slow_where([
    ["method.name=fedavg"], ["method.name=ditto", "method.lam=0.5", "training.grad_clip=0.5"],
    ["method.name=fedsam", "method.rho=0.5", "training.grad_clip=100"],
    ["method.name=simfafl", "method.beta1=0.1", *VIB],
], ("ditto", "fedsam", "simfafl"), pytest.mark.extended), ids=ids)  # a compile each: seconds; the suite compiles FedAvg's
def test_a_compiled_step_follows_the_eager_one(overrides, device):
    """``resources.compile``: the group step through torch.compile gives each client the eager batched step's
    weights, states and metrics up to float rounding (fused kernels round differently) in a group with
    clients of other sizes and short last batches, and it compiled one graph for all its steps (each padded
    to B: a graph per short batch's size was a compile each). Clipping with momentum (ρ = 0.9 here) and a
    method's second gradient is where torch 2.11's inductor once stepped by (1 + ρ)·g
    (``_GroupTrainer._take``); on CUDA the kernels are Triton's, not the CPU's C++."""
    cfg, data, method, model, inputs, tensors = round_one(overrides)
    model.to(device)
    tensors = {k: v.to(device) for k, v in tensors.items()}
    runs = []
    torch._dynamo.reset()
    counters.clear()
    for compiled in (False, True):
        out = dict(train_group(grouped(method, model, data, cfg, torch.device(device)), [0, 1, 2, 3], inputs, {},
                               tensors, compiled=compiled))
        runs.append({cid: arrays_and_metrics(result) for cid, result in out.items()})
    assert counters["stats"]["unique_graphs"] == 1
    for cid, ((eager, eager_metrics), (state, metrics)) in enumerate(zip(runs[0].values(), runs[1].values())):
        assert eager.keys() == state.keys()
        for key in state:
            np.testing.assert_allclose(state[key], eager[key], rtol=1e-4, atol=1e-5, err_msg=f"{cid} {key}")
        assert {k: metrics[k] for k in ("samples", "steps", "diverged")} == {
            k: eager_metrics[k] for k in ("samples", "steps", "diverged")}
        assert metrics["train_loss"] == pytest.approx(eager_metrics["train_loss"], rel=1e-5)


def test_a_compiled_step_keeps_its_graph_for_groups_of_other_lengths():
    """Groups of as many clients but with more or fewer steps in their epochs reuse the compiled graph: a
    step's views have the same shape and strides whatever the epoch's length (a strided one compiled again)."""
    cfg, data, method, model, inputs, tensors = round_one(["method.name=fedavg"])
    groups = [[0, 1], [2, 3]]
    steps = [max(-(-len(data.client_train[c]) // cfg.training.batch_size) for c in group) for group in groups]
    assert steps[0] != steps[1]
    torch._dynamo.reset()
    counters.clear()
    for group in groups:
        for _ in train_group(grouped(method, model, data, cfg), group, inputs, {}, tensors, compiled=True):
            pass
    assert counters["stats"]["unique_graphs"] == 1


def test_a_diverging_client_stops_like_on_the_exact_path():
    """A non-finite loss stops that client before its step (masked from then on), as the exact path breaks."""
    pairs = exact_and_batched(["method.name=fedavg"], [0, 3], lr=1e6)
    assert [m["diverged"] for _, (_, m) in pairs] == [1.0, 1.0]
    assert [m["steps"] for (_, m), _ in pairs] == [m["steps"] for _, (_, m) in pairs]


def test_groups_depend_on_the_client_list_alone_and_travel_whole():
    assert client_groups([7, 2, 9, 4, 5], 2) == [[2, 4], [5, 7], [9]]
    sizes = [100, 5, 80, 60, 40, 10, 30, 20, 90, 70]
    clients = [0, 2, 3, 5, 6, 8, 9]
    for workers in (1, 2, 3):
        shards = balance(clients, sizes, workers, group=3)
        assert sorted(c for s in shards for c in s) == clients
        regrouped = sorted(g for s in shards for g in client_groups(s, 3))
        assert regrouped == client_groups(clients, 3)
    assert balance(clients, sizes, 2) == balance(clients, sizes, 2, group=1)


def laid_out(overrides: list[str], group: list[int], augment_kind: str = "none", epoch: int = 0):
    """(group, its epoch ``epoch`` laid out, the data, B) for round 1 of ``LOCAL`` + ``overrides``."""
    cfg = build_config(overrides=[*LOCAL, *overrides])
    data, method = load_data(cfg), build_method(cfg)
    model = build_model_for(cfg, data)
    start = initial_state(cfg, data)
    inputs = RoundInput(round=1, seed=0, lr=0.01, global_state=start, server=method.server_payload(start))
    tensors = {k: torch.tensor(v) for k, v in start.items()}
    trainer = grouped(method, model, data, cfg, augment=augment_kind)
    source = trainer.source
    group = _group(trainer, group, inputs, {}, tensors)
    phases = _common_phases(method, group.contexts)[0]
    for e in range(epoch):  # earlier epochs' draws: the shuffle at its start, augmentation at each step
        earlier = group.epoch(source, phases, e, cfg.training.batch_size)
        for s in range(len(earlier.sizes)):
            earlier.step(s, augment_kind, group)
    return group, group.epoch(source, phases, epoch, cfg.training.batch_size), data, cfg


@pytest.mark.parametrize("augment_kind", ["none", "crop_flip_cutout"])
def test_a_group_epoch_holds_each_clients_own_batches(augment_kind):
    """Step by step, client k's rows are the batches its own exact-path stream gives (its generator's
    shuffle and augmentation draws, in order, in its second epoch too), padded with zeros to the step's
    largest batch; a client whose batches ran out has none, and weight marks the real rows."""
    clients = [0, 1, 2, 3]
    group, epoch, data, cfg = laid_out(["training.local_epochs=2"], clients, augment_kind, epoch=1)
    seeds = [derive_seed(0, 1, cid) for cid in clients]
    streams = []
    for cid, seed in zip(clients, seeds):
        generator = torch.Generator().manual_seed(seed)
        first = list(HostBatches(data, CPU).epoch(data.client_train[cid], cfg.training.batch_size, generator,
                                                  augment_kind))
        streams.append(HostBatches(data, CPU).epoch(data.client_train[cid], cfg.training.batch_size, generator,
                                                    augment_kind))
        assert first  # the first epoch's draws came first
    assert len(epoch.sizes) == max(-(-len(data.client_train[c]) // cfg.training.batch_size) for c in clients)
    for s in range(len(epoch.sizes)):
        step = epoch.step(s, augment_kind, group)
        for k, stream in enumerate(streams):
            n = step.counts[k]
            own = next(stream, None)
            assert n == (0 if own is None else len(own[1]))
            if n:
                assert torch.equal(step.images()[k, :n], own[0]) and torch.equal(step.y[k, :n], own[1])
            assert not step.images()[k, n:].any() and not step.y[k, n:].any()
            assert step.weight[k].tolist() == [1.0] * n + [0.0] * (epoch.sizes[s] - n)
        assert step.active.tolist() == [n > 0 for n in step.counts]
    assert all(next(stream, None) is None for stream in streams)


@pytest.mark.parametrize("method", [["method.name=fedavg"], ["method.name=simfafl", *VIB]], ids=ids)
def test_a_group_gathers_a_steps_batches_in_as_many_ops_for_any_group_size(method):
    """One index gathers all K clients' images from the device pool, and the rest of a step (labels, masks,
    VIB's ε) are views of its epoch's: a step's data ops do not grow with K (on a GPU each would be a kernel
    launch, and K host gathers and copies, or K draws, cost more than the step)."""
    counts = []
    for group in ([0, 1], [0, 1, 2, 3, 4, 5]):
        laid_group, epoch, _, _ = laid_out(method, group)
        ops = OpCount()
        with ops:
            epoch.step(0, "none", laid_group).images()
        counts.append(ops.count)
    assert counts[0] == counts[1]


def test_the_tally_read_once_gives_the_bits_of_running_sums_kept_per_step():
    """The group's metrics from its per-step records, read once, equal the running device sums the executor
    kept before (five updates a step; the reference below), bit for bit: random float32 losses, short and
    empty batches, and two clients diverging (NaN, then inf) whose later losses are masked out. A diverging
    step is also found as ``torch.isfinite`` finds it."""
    generator = torch.Generator().manual_seed(0)
    k = 5
    tally, diverged = _Tally(torch.zeros(k, dtype=torch.bool)), torch.zeros(k, dtype=torch.bool)
    loss_sum, correct = torch.zeros(k, dtype=torch.float64), torch.zeros(k, dtype=torch.long)
    seen, steps = torch.zeros(k, dtype=torch.long), torch.zeros(k, dtype=torch.long)
    for s in range(40):
        loss = torch.rand(k, generator=generator) * 3
        loss[2] = float("nan") if s == 10 else loss[2]
        loss[4] = float("inf") if s == 20 else loss[4]
        counts = torch.randint(1, 51, (k,), generator=generator)
        counts[s % k] = 0 if s % 3 == 0 else counts[s % k]  # no batch for this client at this step
        hits = torch.minimum(torch.randint(0, 51, (k,), generator=generator), counts)
        active = counts > 0
        tally.diverged |= active & ((loss - loss) != 0)
        live = active & ~tally.diverged
        tally.steps.append((loss, live, hits, counts.tolist()))
        diverged |= active & ~torch.isfinite(loss)
        loss_sum += torch.where(live, loss.double() * counts, 0.0)
        correct += torch.where(live, hits, 0)
        seen += torch.where(live, counts, 0)
        steps += live.long()
    assert torch.equal(tally.diverged, diverged) and diverged.tolist() == [False, False, True, False, True]
    expected = [
        {"train_loss": total / max(n, 1) if not bad else float("nan"), "train_acc": hits / max(n, 1),
         "samples": float(n), "steps": float(taken), "diverged": float(bad)}
        for total, hits, n, taken, bad in zip(*(t.tolist() for t in (loss_sum, correct, seen, steps, diverged)))
    ]
    got = tally.metrics()
    assert [{key: v for key, v in m.items() if key != "train_loss"} for m in got] == [
        {key: v for key, v in m.items() if key != "train_loss"} for m in expected]
    assert [m["train_loss"].hex() for m in got] == [m["train_loss"].hex() for m in expected]


def test_a_hooks_pass_over_the_data_gathers_from_the_workers_device_pool(monkeypatch):
    """FedPAC-FedCR's class summaries pass over each client's data after training. In a group that pass takes
    its batches from the worker's device pool, as the exact path does: no batch is gathered and normalised on
    the host (on a GPU each then went over in a pageable copy, a wait for the GPU: ~260 a paper-scale
    round). The summaries themselves equal the exact path's (``test_each_client_follows_the_exact_path``)."""
    cfg, data, method, model, inputs, tensors = round_one(["method.name=fedpac_fedcr", "method.lam=0.5"])
    host_batches = []
    monkeypatch.setattr("fltune.engine.batches.to_float", lambda *args: host_batches.append(args) or to_float(*args))
    results = dict(train_group(grouped(method, model, data, cfg), [0, 1, 2], inputs, {}, tensors))
    assert all(result.upload["summaries"].any() for result in results.values())
    assert host_batches == []


@pytest.mark.parametrize("overrides, read", [
    (["method.name=fedcr", *VIB], lambda ctx: ctx.inputs["r"]["mu"]),
    (["method.name=fedpac_fedcr"], lambda ctx: ctx.inputs["centroids"]["c"]),
], ids=["fedcr", "fedpac_fedcr"])
def test_the_server_payload_is_copied_to_the_device_once_for_the_whole_group(overrides, read):
    """Every client of a group reads the round's server values (FedCR's class Gaussians, FedPAC-FedCR's
    centroids) from one device copy, not a copy of its own each (``RoundInput.server_on``)."""
    cfg, data, method, model, inputs, tensors = round_one(overrides)
    group = _group(grouped(method, model, data, cfg), [0, 1, 2], inputs, {}, tensors)
    first, *others = [read(ctx) for ctx in group.contexts]
    assert all(other is first for other in others)


def test_an_epochs_noise_is_freed_before_the_next_epoch_draws_its_own(monkeypatch):
    """A VIB group's ε of a whole epoch (22 MB a client at Table 2's settings) is held once: when the next
    epoch lays out its batches, no earlier epoch's tensors are alive."""
    cfg, data, method, model, inputs, tensors = round_one(["method.name=simfafl", *VIB, "training.local_epochs=3"])
    laid_out, alive = [], []
    lay_out = _GroupEpoch.__init__

    def watched(epoch: _GroupEpoch, *args, **kwargs) -> None:
        alive.append(sum(ref() is not None for ref in laid_out))
        lay_out(epoch, *args, **kwargs)
        laid_out.append(weakref.ref(epoch.noise["eps"]))

    monkeypatch.setattr(_GroupEpoch, "__init__", watched)
    for _ in train_group(grouped(method, model, data, cfg), [0, 1, 2], inputs, {}, tensors):
        pass
    assert alive == [0, 0, 0]


class Draws(OpCount):
    """The random normal draws made under it."""

    def counts(self, func: Any) -> bool:
        return func is torch.ops.aten.randn.generator


@pytest.mark.parametrize("name", ["simfafl", "fedsr"])
def test_an_epochs_noise_is_one_draw_cut_into_the_exact_paths_steps(name):
    """VIB's ε for an epoch of three full steps and a short one: step by step, the draws the exact path makes
    per step (``draw_noise``) from a generator seeded alike (S·n·dimZ a multiple of 16, where on a CPU one
    draw cuts into the same numbers), zero past each step's samples, and made in one draw (on a GPU a launch
    each, where the step's share used to be a draw per client and step)."""
    method = get_method(name)()
    shapes = method.noise(method.adapt_model(build_model("vib_mlp", (1, 4, 4), 3, dim_z=16, samples=4)))
    counts, size = [5, 5, 5, 3], 5
    with Draws() as draws:
        eps = client_noise(shapes, counts, size, torch.Generator().manual_seed(7), CPU)["eps"]
    assert draws.count == 1 and eps.shape == (4, size, method.vib_samples or 4, 16)
    generator = torch.Generator().manual_seed(7)
    for s, n in enumerate(counts):
        step = draw_noise(shapes, n, CPU, generator)["eps"]  # the exact path's, [n, S, dimZ]
        assert torch.equal(eps[s, :n], step) and not eps[s, n:].any()


def test_padding_stacks_full_batches_in_one_op_and_zero_pads_short_or_missing_ones():
    """Per-client epoch tensors (VIB's ε, steps first) stacked step-major, [S, K, ...]: all full, one stack
    whatever K (a copy per client was a launch each); a client's steps past its last and a client without
    any are zeros."""
    generator = torch.Generator().manual_seed(0)
    ops = []
    for k in (2, 6):
        rows = [torch.randn(3, 4, 5, generator=generator).transpose(0, 1) for _ in range(k)]  # [4, 3, 5] views
        with OpCount() as count:
            out = _padded(rows, 4)
        ops.append(count.count)
        assert torch.equal(out, torch.stack([row.contiguous() for row in rows], dim=1))
    assert ops[0] == ops[1] == 1
    short, full = torch.randn(2, 5, generator=generator), torch.randn(4, 5, generator=generator)
    out = _padded([short, None, full], 4)
    assert torch.equal(out[:2, 0], short) and not out[2:, 0].any() and not out[:, 1].any()
    assert torch.equal(out[:, 2], full)


@pytest.mark.parametrize("name", ["fedavg+man", "fedsol+man", "fedntd"])
def test_an_objective_reading_a_client_module_is_never_batched(name):
    """MAN's hooks (on a SAM base too) and FedNTD's frozen global copy are modules of a client (``Batch.module``):
    read off the objective's code, the method is trained client by client; forced into a group, its first step
    refuses rather than train on what is not the client's."""
    cfg, data, method, model, inputs, tensors = round_one([f"method.name={name}"])
    assert not batchable(type(method)) and "reads a client's modules" in unbatchable(cfg, method, model)
    with pytest.raises(ClientByClient, match="reads the client's modules"):
        next(train_group(grouped(method, model, data, cfg), [0, 1], inputs, {}, tensors))


def run_all(pools: SharedPools, cfgs: list[list[str]], workers: int) -> list[Federation]:
    """The runs one after another on the module's shared pool of ``workers`` actors."""
    feds = [build_federation(build_config(overrides=overrides), pool=pools[workers]) for overrides in cfgs]
    for fed in feds:
        try:
            fed.run()
        finally:
            fed.close()
    return feds


def fingerprint(fed: Federation) -> tuple:
    tuned = [(row.get("acc_personalized_ft"), row.get("loss_personalized_ft")) for row in fed.history]
    return ([row["acc_global"] for row in fed.history], [row["train_loss"] for row in fed.history],
            {k: v.tobytes() for k, v in fed.global_state.items()}, tuned)


@pytest.mark.extended
def test_a_batched_run_compiled_in_the_workers_is_deterministic_and_worker_count_free(pools):
    """Ditto's step compiled in the workers (``resources.compile``): the same run again on the same actors
    and on two workers. Uncompiled, every batched method (per-client noise, the final round's pass over
    every client in groups) is checked on one worker or two and resumed by
    ``tests/engine/test_federation.py``'s every-method test."""
    batched = [*FEDERATION, "method.name=ditto", "resources.compile=true", "resources.executor=batched"]
    one, again = run_all(pools, [batched, batched], workers=1)
    (two,) = run_all(pools, [batched], workers=2)
    assert one.status == "finished" and one.history[-1]["acc_global"] > 0.3
    assert fingerprint(one) == fingerprint(again) == fingerprint(two)


def test_unsupported_method_falls_back_and_says_so(pools, caplog):
    """FedNTD's objective reads its frozen global copy, a module of the client: it trains on the exact path, bit for
    bit, with one warning for the run (not one per round)."""
    ntd = [*FEDERATION, "method.name=fedntd"]
    with caplog.at_level(logging.WARNING, logger="fltune.assembly"):
        fallback, exact = run_all(pools, [[*ntd, "resources.executor=batched"], ntd], workers=1)
    notes = [r.getMessage() for r in caplog.records if r.name == "fltune.assembly"]
    assert notes == ["resources.executor: batched trains every client on the exact path: method fedntd's objective "
                     "reads a client's modules (Batch.module)"]
    assert fingerprint(fallback) == fingerprint(exact)


@needs_fmnist
@pytest.mark.parametrize("method, metric", [
    (["method.name=fedavg", "model.name=mlp"], "acc_global"),
    (["method.name=fedsam", "model.name=mlp"], "acc_global"),
    (["method.name=fedsol", "model.name=mlp", "method.scope=all"], "acc_global"),
    (["method.name=ditto", "model.name=mlp", "metrics.protocols=[global,personalized]",
      "partition.eval_fraction=0.3"], "acc_personalized"),
    (["method.name=simfafl", *VIB], "acc_global"),
], ids=lambda o: o[0].split("=")[-1] if isinstance(o, list) else o)
@pytest.mark.extended
def test_batched_accuracy_is_within_the_exact_paths_seed_spread(pools, method, metric):
    """Statistical equivalence on a tiny FMNIST federation (10 Dirichlet clients, 5 per round, 3 rounds),
    for FedAvg and one method of each kind with its own functional step (SAM; FedSOL's ascent on its
    proximal loss; Ditto's personal models,
    scored by their own accuracy; a VIB loss with its per-client ε): over seeds 0-3 the batched mean
    final accuracy lies within max(2·std, 0.01) of the exact path's mean, std the exact path's sample
    standard deviation over the same seeds."""
    base = [
        "data.dataset=fmnist", "data.subsample=0.05", "partition.kind=dirichlet",
        "federation.clients=10", "federation.fraction=0.5", "federation.rounds=3", "training.batch_size=50",
        "training.local_epochs=1", "metrics.protocols=[global]", "tracking.enabled=false",
        "resources.batch_clients=3", *method,
    ]
    runs = {executor: run_all(pools, [[*base, f"federation.seed={s}", f"resources.executor={executor}"]
                                      for s in range(4)], workers=2)
            for executor in ("exact", "batched")}
    acc = {executor: [fed.history[-1][metric] for fed in feds] for executor, feds in runs.items()}
    assert all(a > 0.3 for a in acc["exact"]), acc  # the federations learn (chance is 0.1)
    assert fingerprint(runs["batched"][0]) != fingerprint(runs["exact"][0])  # batched really ran
    spread = max(2 * statistics.stdev(acc["exact"]), 0.01)
    assert abs(statistics.mean(acc["batched"]) - statistics.mean(acc["exact"])) <= spread, acc


@pytest.mark.parametrize(("model", "options", "batches"), [
    ("fedavg_cnn", {}, True),
    ("resnet18", {}, False),  # running buffers
    ("resnet18", {"running_stats": False}, False),  # no buffers, yet BatchNorm's batch statistics
    ("sl_vit", {}, True),  # LayerNorm is per sample
])
def test_models_normalising_by_batch_statistics_train_per_client(model, options, batches):
    cfg = build_config({"method": {"name": "fedavg"}, "model": {"name": model, "options": options},
                        "resources": {"executor": "batched"}})
    torch.manual_seed(0)
    net = build_model(model, (1, 28, 28), 10, **options)
    reason = unbatchable(cfg, get_method("fedavg")(), net)
    assert (reason is None) == batches
    assert batches or "BatchNorm" in reason


def test_a_phase_capped_at_a_step_count_has_no_batched_form():
    """``Phase.steps`` (Per-FedAvg) cuts an epoch short per client, which the group's padded epochs don't: a
    method that caps a phase is told so, not trained past its cap."""
    class Capped(Method):
        name, stored_models, passes_per_step = "capped", 1.0, 1.0

        def phases(self, ctx):
            return [Phase(epochs=1, steps=3)]

    with pytest.raises(ValueError, match=r"capped: a phase capped at a step count \(Phase.steps\)"):
        _common_phases(Capped(), [None, None])
