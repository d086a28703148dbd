"""The method plug-in interface: :class:`Method`, whose hooks default to FedAvg, and its contract types
(docs/adding-a-method.md §4). Per-client state is plain data in the engine's store, never in a worker, so any worker can
train any client and a checkpoint is just the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from fltune.errors import FLTuneError, UserCodeError, defined_at
from fltune.methods.objective import Batch, Forward, NoiseShapes, Tensors, draw_noise, scalar_loss
from fltune.methods.wire import State, to_numpy

if TYPE_CHECKING:  # the tuner's class; finetune.py imports this module
    from fltune.methods.finetune import FineTune

ModelT = TypeVar("ModelT", bound=nn.Module)


class Params(BaseModel):
    """A method's hyperparameters: frozen, validated, with the paper's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


@dataclass(frozen=True)
class Phase:
    """Local training over the parameters under ``prefixes`` (None: all; FedRep: head, then body); ``steps``
    ends it mid-epoch if need be (Per-FedAvg counts iterations)."""

    epochs: int
    prefixes: tuple[str, ...] | None = None
    lr: float | None = None
    steps: int | None = None


@dataclass
class ClientContext:

    client_id: int
    model: nn.Module
    global_state: dict[str, torch.Tensor]
    state: dict[str, Any]
    num_samples: int
    """Samples in an epoch of ``batches`` (less a dropped short batch): the weight n_k in the average."""
    epochs: int
    lr: float
    """This round's learning rate: ``training.lr`` after ``training.lr_decay``."""
    device: torch.device
    batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]
    steps: int = 0
    momentum: float = 0.0
    """The local optimiser's SGD momentum (0 for Adam): FedNova's a_k and SCAFFOLD's c_k depend on it."""
    nesterov: bool = False
    """Whether that momentum is Nesterov's (``training.nesterov``): it changes :func:`effective_steps`."""
    batch_size: int = 1
    """``training.batch_size`` (Per-FedAvg counts its steps in batches)."""
    step_lr: float | None = None
    """Set by ``backward`` to take this one step at another rate (Per-FedAvg's meta step at β); the engine
    reads and clears it. None: the phase's rate."""
    initial_lr: float | None = None
    """``training.lr`` before decay (None: ``lr``): FedDC's code divides its correction by it."""
    grad_clip: float | None = None
    """``training.grad_clip``; a method stepping a model of its own (Ditto's) clips that step too, as the
    authors' code does."""
    server_tensors: Mapping[str, Any] = field(default_factory=dict)
    """The server's payload (``Method.server_payload``) on ``device``, copied once a round per worker: shared, read
    only."""
    scratch: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Tensors] = field(default_factory=dict)
    """The client's tensors its objective reads (``Batch.inputs``: FedDyn's θ_g − h_k, Ditto's v), set by
    ``setup_client``."""

    @cached_property
    def forward(self) -> Forward:
        return Forward(self.model)


def effective_steps(steps: int, momentum: float, nesterov: bool = False) -> float:
    """How many lr·g a constant gradient g moves the weights over ``steps`` SGD steps: the ‖a‖₁ that turns θ_g − θ_k
    back into an average gradient (FedNova's a_k, SCAFFOLD's K in c_k⁺). Heavy-ball momentum ρ (b_t = ρ·b_{t−1} + g_t,
    step lr·b_t) gives Σ_{t≤K} (1 − ρ^t)/(1 − ρ) = [K − ρ(1 − ρ^K)/(1 − ρ)]/(1 − ρ), the FedSOL authors' divisor
    (``Lee-Gihun/FedSOL:algorithms/scaffold/ClientTrainer.py`` ``__get_divisor``); Nesterov (step lr·(g_t + ρ·b_t)) adds
    ρ times it. ρ = 0 gives K."""
    if momentum == 0:
        return float(steps)
    heavy_ball = (steps - momentum * (1 - momentum**steps) / (1 - momentum)) / (1 - momentum)
    return steps + momentum * heavy_ball if nesterov else heavy_ball


Upload = dict[str, np.ndarray]
"""Per-client statistics beside the summable update (FedCR's Gaussians, FedPAC's prototypes): read once by
``aggregate``, never stored."""


@dataclass
class ClientResult:
    """``update`` is summed with ``weight`` over clients, ``upload`` reaches ``aggregate`` per client, ``state`` is
    stored for the client's next round."""

    weight: float
    update: State
    state: dict[str, Any]
    upload: Upload = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Aggregate:
    """The weighted mean of the clients' updates, plus their per-client dicts in client-id order (so nothing
    depends on how clients were spread over workers)."""

    mean: State
    total_weight: float
    client_states: dict[int, dict[str, Any]]
    client_metrics: dict[int, dict[str, float]]
    uploads: dict[int, Upload] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerContext:
    """What ``Method.aggregate`` reads and must not modify; ``client_store`` already holds
    ``aggregate.client_states`` (clients never sampled are absent)."""

    round: int
    global_state: State
    aggregate: Aggregate
    server_state: dict[str, Any]
    client_store: Mapping[int, dict[str, Any]]
    num_clients: int


def server_step(old: State, new: State, step: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> State:
    """``step(θ_g, new)`` of each entry of ``new`` in float64, cast back to its dtype (a server update such as
    FedNova's or SCAFFOLD's); integer counters (BN's batch counts) take ``new`` as it is."""
    return {name: step(old[name].astype(np.float64), value.astype(np.float64)).astype(old[name].dtype)
            if old[name].dtype.kind == "f" else value for name, value in new.items()}


def client_model(shared: State, client_state: dict[str, Any]) -> State:
    """A client's weights: ``shared`` (the global model it starts from, or the update it trained, rebuilt for
    ``all_model`` and H_N/H_D at no transfer) overridden by its personal part. The workers check a rebuild bit for
    bit and ship the weights where it differs (FedNova's d_k, Ditto's v_k): a wrong rebuild costs transfer, never a
    figure."""
    return {**shared, **client_state.get("personal", {})}


def held(store: Mapping[int, dict[str, Any]], key: str) -> Iterator[tuple[int, Any]]:
    """(client, ``store[client][key]``) for every client holding ``key``, in client-id order; the engine's
    store streams them from disk, so a sum over every client keeps one value in memory."""
    stream = getattr(store, "held", None)
    if stream is not None:
        return stream(key)
    return ((cid, store[cid][key]) for cid in sorted(store) if key in store[cid])


def holders(store: Mapping[int, dict[str, Any]], key: str) -> int:
    """How many clients hold ``key``: the engine's store counts without reading a state."""
    count = getattr(store, "holders", None)
    return count(key) if count is not None else sum(key in state for state in store.values())


@dataclass(frozen=True)
class ServerUpdate:
    """``client_states`` are stored (FedPAC rewrites them with each client's combined head)."""

    global_state: State
    server_state: dict[str, Any]
    client_states: dict[int, dict[str, Any]]


class Method:
    """FedAvg (McMahan et al., 2017): CE locally, n_k-weighted average of the full state: every hook's default."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params
    default_model: ClassVar[str | None] = None
    """Model that ``model.name: auto`` resolves to for this method (VIB nets, ResNet-56); None = the dataset's."""
    stored_models: ClassVar[float]
    """Model-sized tensors a client holds while training (FedAlign Table 5): FedAvg 1, FedProx 2, MOON 3, …
    Optional and without a default: undeclared, ``cost_stored_params`` is left out, never a silent 1."""
    passes_per_step: ClassVar[float]
    """Forward+backward passes per local step: FedAvg 1, SAM-type 2, GradAug n + 1, … Optional, no default:
    undeclared, ``cost_cum_tflops`` is left out."""
    weighted_by_samples: ClassVar[bool] = True
    """Whether updates are weighted by n_k (FedAvg) or equally (FedDyn-family); also weights `all_model`."""
    final_round: ClassVar[Literal["tune", "own"]] = "tune"
    """The final personal round (``training.finetune_epochs``) before the personalised evaluation: ``tune``
    trains the personal part (else the head) on CE, the rest frozen (``methods/finetune.py``); ``own`` runs
    one more local update and evaluates its client model (Ditto, as FedCR's ``main_fed_ditto.py``)."""
    tuner: ClassVar[type[FineTune] | None] = None
    """The ``tune`` round's :class:`~fltune.methods.finetune.FineTune` (None: FineTune); its own where the
    model's training forward draws noise (VIB nets)."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params if params is not None else self.Params()

    @classmethod
    def model_for(cls, dataset: str) -> str | None:
        """``default_model`` refined per dataset (VIB methods: the MLP on EMNIST, the CNN elsewhere)."""
        return cls.default_model

    # ---------------------------------------------------------------- model
    def adapt_model(self, model: nn.Module) -> nn.Module:
        """Add method-owned modules (MOON's projector), so they are aggregated and checkpointed like any other."""
        return model

    def require_model(self, model: nn.Module, kind: type[ModelT], needs: str, allowed: str) -> ModelT:
        """``adapt_model`` for an objective needing one architecture: any other fails at construction, in one
        line naming ``model.name``, not deep inside a Ray worker."""
        if not isinstance(model, kind):
            raise FLTuneError(
                f"model.name: {self.name} needs {needs}; allowed: {allowed} (got a {type(model).__name__})"
            )
        return model

    # ---------------------------------------------------------------- client side
    def personal_keys(self, model: nn.Module) -> set[str]:
        """State-dict keys each client keeps for itself (never averaged); FedAvg: none."""
        return set()

    def setup_client(self, ctx: ClientContext) -> None:
        """Per-client extras before training (a frozen copy of the global model)."""

    def phases(self, ctx: ClientContext) -> list[Phase]:
        """Local training schedule; FedAvg trains every parameter for E epochs."""
        return [Phase(epochs=ctx.epochs)]

    @classmethod
    def epochs_trained(cls, epochs: int, local_epochs: int) -> float:
        """Passes over its data an update of ``epochs`` epochs makes (``local_epochs``: the run's E), for the
        run-time estimate; a method whose phases count steps converts them."""
        return float(epochs)

    def noise(self, model: nn.Module) -> NoiseShapes:
        """Standard normal draws :meth:`local_loss` reads as ``batch.noise`` (VIB's ε), from the client's own
        seeded stream, so they do not depend on its executor."""
        return {}

    def batch(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> Batch:
        """``(x, y)`` for :meth:`local_loss` on the client's own model, unpadded, noise from torch's global RNG
        (seeded per (seed, round, client))."""
        noise = draw_noise(self.noise(ctx.model), len(y), x.device)
        return Batch(ctx.forward, ctx.forward.own, x, y, None, ctx.inputs, noise, ctx.global_state, ctx)

    def local_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-batch objective → (loss, logits): the loss per sample (the engine averages it over the batch's
        real samples) or one number already averaged with ``batch.mean``/``batch.cross_entropy``. FedAvg: CE."""
        logits = batch.forward(batch.weights, batch.x)
        return batch.cross_entropy(logits), logits

    def record_step(self, ctx: ClientContext, y: torch.Tensor, record: Tensors) -> None:
        """What :meth:`local_loss` left in ``batch.record``, for real samples ``y`` (FedCR's μ, σ)."""

    def backward(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill ``.grad`` for one batch → (detached loss, detached logits), client by client. A larger step (SAM's two
        passes, Ditto's second model) overrides :meth:`step` instead, which every executor runs; overriding this
        (Proximal's projection, Per-FedAvg's restore) trains the method client by client."""
        batch = self.batch(ctx, x, y)
        loss, logits = self.local_loss(batch)
        loss = scalar_loss(batch, loss)
        if batch.record:
            self.record_step(ctx, y, batch.record)
        try:
            loss.backward()
        except RuntimeError as err:
            if loss.dim() == 0:
                raise
            raise UserCodeError(f"{defined_at(type(self).local_loss)}: {type(self).__name__}.local_loss returned a "
                                f"loss of shape {list(loss.shape)}, not one number ({err})") from None
        return loss.detach(), logits.detach()

    def step(self, batch: Batch) -> tuple[Tensors, torch.Tensor, torch.Tensor]:
        """One batch's step → (gradients of the weights ``batch.trainable`` names, loss, logits), which the engine clips
        and applies; default: the objective's gradient. Overridden by SAM (two passes) and Ditto (a second model)."""
        return batch.loss_gradient(self.local_loss, batch.trained)

    def gradient_correction(self, weights: Mapping[str, torch.Tensor], inputs: Mapping[str, Tensors]) -> Tensors:
        """A term added to each gradient after the step's passes (SCAFFOLD's c − c_k, FedSpeed's
        λ(θ − θ_g + h_k)), from the current ``weights`` and the client's ``inputs``."""
        return {}

    def client_result(self, ctx: ClientContext) -> ClientResult:
        """Upload the shared weights (weight n_k, or 1); keep personal ones in the client's state."""
        personal = self.personal_keys(ctx.model)
        state = ctx.model.state_dict()
        shared = to_numpy(state, set(state) - personal)
        new_state = dict(ctx.state)
        if personal:
            new_state["personal"] = to_numpy(state, personal)
        weight = float(ctx.num_samples) if self.weighted_by_samples else 1.0
        return ClientResult(weight=weight, update=shared, state=new_state)

    def personal_scorer(
        self, model: nn.Module, train_batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]],
    ) -> nn.Module:
        """What the personalised protocol scores a client with (eval-mode logits), from its final ``model`` and
        one epoch of its training batches (kNN-Per's datastore)."""
        return model

    # ---------------------------------------------------------------- server side
    def init_server_state(self, global_state: State) -> dict[str, Any]:
        """Server state kept across rounds (SCAFFOLD's c)."""
        return {}

    def server_payload(self, server_state: dict[str, Any]) -> dict[str, Any]:
        """What the clients receive of the server state (``ctx.server_tensors``): all of it."""
        return dict(server_state)

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        """The weighted mean for every uploaded key, the old value elsewhere. An override returns new objects
        (``dataclasses.replace``) and never modifies ``ctx``, so it can be tested as a function."""
        return ServerUpdate(
            global_state={**ctx.global_state, **ctx.aggregate.mean}, server_state=ctx.server_state,
            client_states=ctx.aggregate.client_states,
        )


def params_table(method_cls: type[Method]) -> list[tuple[str, str, Any, str]]:
    """(name, type, default, description) rows for ``fltune methods``."""
    rows = []
    for name, info in method_cls.Params.model_fields.items():
        kind = getattr(info.annotation, "__name__", str(info.annotation))
        rows.append((name, kind, info.default, info.description or ""))
    return rows
