"""The method plug-in interface.

A method is one small class with optional hooks; FedAvg behaviour is the default for every hook, so a
method file contains only what differs from FedAvg. The engine owns the one local training loop and
calls, per client and round::

    setup_client(ctx)                      # once, before training (frozen copies, control variates ...)
    for phase in phases(ctx):              # default: one phase training every parameter
        for batch:  backward(ctx, x, y)    # default: local_loss(...).backward()
                    after_backward(ctx)    # e.g. SCAFFOLD's gradient correction
                    (clip, optimiser step by the engine)
    client_result(ctx)                     # a ClientResult: weight, summable update, upload, new state

and on the server, once per round: ``aggregate(ServerContext) -> ServerUpdate`` over the order-independent
weighted sum of all sampled clients' updates and their uploads. ``aggregate`` is a pure function of its
inputs: it returns the new global weights, server state and round's client states, and the engine stores
what it returned. Per-client state is plain data held by the engine's store (keyed by client id), never
inside a worker, so any worker can train any client and a checkpoint is just the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import nn
from torch.func import functional_call, grad

from fltune.errors import FLTuneError

if TYPE_CHECKING:  # the tuner's class; finetune.py imports this module
    from fltune.methods.finetune import FineTune

State = dict[str, np.ndarray]
"""Model weights on the wire: state_dict names → numpy arrays (what one ``ray.put`` ships)."""

ModelT = TypeVar("ModelT", bound=nn.Module)


class Params(BaseModel):
    """A method's hyperparameters: frozen, validated, with the paper's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


@dataclass(frozen=True)
class Phase:
    """A stretch of local training over a subset of parameters (FedRep: head epochs, then body epochs).

    ``prefixes`` selects trainable parameters by state-dict prefix (``("head.",)``); None trains all.
    ``steps`` ends the phase after that many steps, mid-epoch if need be (Per-FedAvg's code counts its
    iterations, not epochs); None: every batch of its ``epochs``.
    """

    epochs: int
    prefixes: tuple[str, ...] | None = None
    lr: float | None = None
    steps: int | None = None


@dataclass
class ClientContext:
    """Everything a client-side hook may read or write during one client's local update."""

    client_id: int
    round: int
    model: nn.Module
    global_state: dict[str, torch.Tensor]
    state: dict[str, Any]
    server: dict[str, Any]
    num_samples: int
    """The samples an epoch of ``batches`` holds: the client's training split, less the short last batch's
    with ``training.drop_last``. Its weight n_k in the server's average."""
    epochs: int
    lr: float
    """This round's learning rate: ``training.lr`` after ``training.lr_decay``."""
    device: torch.device
    batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]
    """One epoch of this client's (augmented, shuffled, seeded) training batches, on ``device``."""
    steps: int = 0
    momentum: float = 0.0
    """The local optimiser's SGD momentum (0 for Adam): FedNova's a_k and SCAFFOLD's c_k depend on it."""
    nesterov: bool = False
    """Whether that momentum is Nesterov's (``training.nesterov``): it changes :func:`effective_steps`."""
    batch_size: int = 1
    """``training.batch_size``: with ``num_samples`` it gives an epoch's batches (Per-FedAvg counts its steps by
    them)."""
    step_lr: float | None = None
    """Set by ``backward`` to take this one step at another learning rate (Per-FedAvg's meta step at β); the
    engine reads it before the optimiser step and clears it. None: the phase's rate."""
    initial_lr: float | None = None
    """``training.lr``, the first round's learning rate (None: ``lr``): FedDC's code divides its gradient correction
    by it whatever the round's decay."""
    grad_clip: float | None = None
    """``training.grad_clip``: the engine clips the step's ``.grad`` with it; a method that steps a model of
    its own (Ditto's personal model) clips that step too, as the authors' code does."""
    server_tensors: Mapping[str, Any] = field(default_factory=dict)
    """``server``'s arrays as tensors on ``device`` (a dict of arrays: a dict of tensors), copied once a round
    for all the clients a worker trains, not once a client. Shared by those clients: read only."""
    scratch: dict[str, Any] = field(default_factory=dict)

    def global_param(self, name: str) -> torch.Tensor:
        """The round's global value of a parameter, on the training device."""
        return self.global_state[name]


def effective_steps(steps: int, momentum: float, nesterov: bool = False) -> float:
    """How many lr·g a constant gradient g moves the weights over ``steps`` SGD steps: the ‖a‖₁ that turns
    θ_g − θ_k back into an average gradient (FedNova's a_k, SCAFFOLD's K in c_k⁺).

    Heavy-ball momentum ρ (PyTorch's buffer b_t = ρ·b_{t−1} + g_t, step lr·b_t) moves the weights by
    Σ_{t≤K} (1 − ρ^t)/(1 − ρ) = [K − ρ(1 − ρ^K)/(1 − ρ)]/(1 − ρ), the FedSOL authors' divisor
    (``Lee-Gihun/FedSOL:algorithms/scaffold/ClientTrainer.py`` ``__get_divisor``, and its FedNova server):
    K = 50, ρ = 0.9 gives 410.5, not 50. Nesterov's step lr·(g_t + ρ·b_t) adds ρ times that sum, i.e.
    [K − ρ²(1 − ρ^K)/(1 − ρ)]/(1 − ρ). ρ = 0 gives K either way.
    """
    if momentum == 0:
        return float(steps)
    heavy_ball = (steps - momentum * (1 - momentum**steps) / (1 - momentum)) / (1 - momentum)
    return steps + momentum * heavy_ball if nesterov else heavy_ball


Upload = dict[str, np.ndarray]
"""Statistics a client sends the server beside its summable update (FedCR's class Gaussians, FedPAC's
prototypes): read once by ``aggregate``, never kept in the client store."""


@dataclass
class ClientResult:
    """What one client returns: ``update`` is summed with ``weight`` across clients by the engine (on the
    workers, order-independently), ``upload`` reaches ``aggregate`` per client, ``state`` is what the
    client store keeps for this client's next round."""

    weight: float
    update: State
    state: dict[str, Any]
    upload: Upload = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Aggregate:
    """The weighted mean of the sampled clients' updates, plus what they returned individually (every
    per-client dict in client-id order, so nothing can depend on how clients were spread over workers)."""

    mean: State
    total_weight: float
    client_states: dict[int, dict[str, Any]]
    client_metrics: dict[int, dict[str, float]]
    uploads: dict[int, Upload] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerContext:
    """What ``Method.aggregate`` reads (and must not modify): the round's global weights, its clients'
    aggregate, the server state, and every client's state after this round (``client_store``: the
    engine's store with ``aggregate.client_states`` already in, so clients never sampled are absent)."""

    round: int
    global_state: State
    aggregate: Aggregate
    server_state: dict[str, Any]
    client_store: dict[int, dict[str, Any]]
    num_clients: int


@dataclass(frozen=True)
class ServerUpdate:
    """What ``Method.aggregate`` returns; the engine keeps it as the next round's starting point.

    ``client_states`` are the round's clients' states to store (``aggregate.client_states`` unless the
    server rewrites them, as FedPAC does with each client's combined head).
    """

    global_state: State
    server_state: dict[str, Any]
    client_states: dict[int, dict[str, Any]]


class Forward:
    """The model as a function of its parameters (``torch.func.functional_call``): ``forward(params, x)``
    gives the logits; :meth:`part` runs one part (``body``/``head``) alone."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.tied = _ties_tensors(model)

    def __call__(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.model, params, (x,), tie_weights=self.tied)

    def part(self, name: str, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Submodule ``name`` on ``x`` with the entries of ``params`` under ``name.``: a VIB loss needs the
        body's (μ, σ) and the head on sampled z, which the model's ``forward`` does not expose."""
        prefix = f"{name}."
        own = {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}
        return functional_call(self.model.get_submodule(name), own, (x,), tie_weights=self.tied)


def _ties_tensors(model: nn.Module) -> bool:
    """Whether one tensor sits under two names in ``model``. Only then must ``functional_call`` look for
    ties (``tie_weights``), which walks every submodule on every call: in the batched executor's step that
    walk was ~330 of its ~3,800 Python calls (FedAvg CNN, K = 10): host time a GPU waits on."""
    def count(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[int, int]:
        pairs = list(named)
        return len(pairs), len({id(t) for _, t in pairs})

    return any(n != unique for n, unique in (count(model.named_parameters(remove_duplicate=False)),
                                            count(model.named_buffers(remove_duplicate=False))))


def squared_distance(params: Iterable[tuple[str, torch.Tensor]], anchor: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Σ_n ‖p_n − anchor_n‖² over (name, tensor) pairs: FedProx's and FedDyn's penalties, for a module's
    ``named_parameters()`` (exact path) or a parameter dict's items (batched executor) alike."""
    return sum(((p - anchor[n]) ** 2).sum() for n, p in params)


def batch_mean(values: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of per-sample ``values`` over the samples with weight 1: a batched group pads every client's
    batch to one shape, and a client's short last batch must still average over its real samples only.
    ``weight`` None (the exact path's unpadded batch) is ``values.mean()`` itself, so a loss written once
    for both paths keeps the exact path's bits."""
    if weight is None:
        return values.mean()
    return (values * weight).sum() / weight.sum().clamp(min=1.0)


def masked_cross_entropy(logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over the real samples (:func:`batch_mean`); ``F.cross_entropy`` when unpadded.

    Padded, each sample's −log softmax at its label is written out: inside the batched executor's vmap
    ``F.cross_entropy(reduction="none")`` decomposes into the same gather and negation plus an
    ``ignore_index`` mask (7 more ops in the forward and 7 in the backward, each a GPU launch) that no
    label here needs; the values and gradients are the same floats."""
    if weight is None:
        return F.cross_entropy(logits, y)
    return batch_mean(-logits.log_softmax(-1).gather(-1, y.unsqueeze(-1)).squeeze(-1), weight)


def gradient_term(term: torch.Tensor) -> torch.Tensor:
    """A zero-valued loss term whose gradient is ``term``'s: SCAFFOLD's correction ⟨θ, c − c_k⟩ added to a
    functional loss changes the gradient as ``after_backward`` does, and the reported loss not at all."""
    return term - term.detach()


Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class FunctionalBatch:
    """One client's step as :meth:`Method.functional_step` sees it inside the batched executor's vmap:
    its padded batch (``weight`` marks the real samples), its ``loss_inputs`` (plus ``inputs["noise"]``,
    the step's share of :meth:`Method.epoch_noise`), the parameters its phase keeps fixed, and what all clients of
    the round share: the global weights and the round's learning rate (``ctx.lr``)."""

    forward: Forward
    names: tuple[str, ...]
    frozen: Tensors
    inputs: dict[str, Tensors]
    x: torch.Tensor
    y: torch.Tensor
    weight: torch.Tensor
    global_params: Tensors
    lr: float
    grad_clip: float | None = None
    """``training.grad_clip`` (:attr:`ClientContext.grad_clip`)."""

    def full(self, trainable: Mapping[str, torch.Tensor]) -> Tensors:
        """Every parameter, in the model's order: ``trainable`` where given, the frozen value elsewhere."""
        return {n: trainable[n] if n in trainable else self.frozen[n] for n in self.names}

    def loss(self, method: Method, trainable: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``method.functional_loss`` on this batch at ``trainable``: (loss, logits)."""
        return method.functional_loss(self.forward, self.full(trainable), self.inputs, self.x, self.y, self.weight)


class FunctionalStep(NamedTuple):
    """What one client's functional step gives the batched executor (a pytree, so vmap stacks it).

    ``grads``: the trainable parameters' gradient, which the engine clips and steps with SGD, as the exact
    path's ``.grad``. ``loss``/``logits``: at the weights stepped from, for the train metrics. ``carry``:
    new values of ``loss_inputs`` entries that evolve step by step (Ditto's personal model); the engine
    keeps them for the client's next step and finally copies them into the tensors ``loss_inputs`` gave.
    ``record``: per-sample tensors (batch axis first) handed to :meth:`Method.record_step` (FedCR's μ, σ).
    """

    grads: Tensors
    loss: torch.Tensor
    logits: torch.Tensor
    carry: dict[str, Tensors] = {}
    record: Tensors = {}

    def replaced(self, grads: Tensors | None = None, carry: dict[str, Tensors] | None = None) -> FunctionalStep:
        """This step with other gradients or carried inputs. ``_replace`` would do, but under
        ``resources.compile`` this runs inside the traced group step, and torch 2.11's dynamo failed an
        assertion on a NamedTuple built by ``_replace`` there (an H100 run); the constructor it traces."""
        return FunctionalStep(self.grads if grads is None else grads, self.loss, self.logits,
                              self.carry if carry is None else carry, self.record)


def gradient(
    objective: Callable[[Tensors], tuple[torch.Tensor, Any]], params: Tensors,
) -> tuple[Tensors, torch.Tensor, Any]:
    """(∇objective at ``params``, its value, its auxiliary output), the last two detached: ``objective``
    returns (loss, aux). ``torch.func.grad`` gives zeros for a parameter the loss does not use."""

    def value(p: Tensors) -> tuple[torch.Tensor, tuple[torch.Tensor, Any]]:
        loss, aux = objective(p)
        return loss, (loss.detach(), aux)

    grads, (loss, aux) = grad(value, has_aux=True)(params)
    return grads, loss, aux


def clip_scale(tensors: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_``'s factor min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ the norm over all of
    ``tensors`` (the norm of their norms, as torch takes it), without ``.grad`` or in-place writes, so it
    also runs inside the batched executor's vmap."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors]))
    return (max_norm / (total + 1e-6)).clamp(max=1.0)


def dtype_groups(dtypes: Iterable[Any]) -> list[list[int]]:
    """Positions of equal dtypes, in order of first appearance: what one copy between host and device can
    carry at once (``to_numpy``, ``to_device``)."""
    groups: dict[Any, list[int]] = {}
    for i, dtype in enumerate(dtypes):
        groups.setdefault(dtype, []).append(i)
    return list(groups.values())


def to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """``arrays`` as tensors on ``device`` (views of one buffer per dtype), in one copy per dtype.

    A copy from pageable host memory to a GPU first waits for everything the device has queued, so loading
    a state tensor by tensor is a host sync per tensor; where Tune trials share one GPU each waits for the
    GPU's turn. Copies change no bits."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(arrays)
    for rows in dtype_groups(array.dtype for array in arrays):
        flat = torch.from_numpy(np.concatenate([arrays[i].reshape(-1) for i in rows])).to(device)
        for i, part in zip(rows, flat.split([arrays[i].size for i in rows])):
            out[i] = part.view(arrays[i].shape)
    return out


def to_numpy(state: dict[str, torch.Tensor], keys: set[str] | None = None) -> State:
    """Detach a (sub)state_dict to CPU numpy for the wire or the client store, in one copy per dtype.

    A copy from a GPU to the host waits for the device, so a state copied tensor by tensor is a host sync
    per tensor; where Tune trials share one GPU each waits for its turn. Each array is its own (a copy of
    its part of the buffer), so a client store keeps no other tensor's bytes alive."""
    tensors = [(k, v.detach()) for k, v in state.items() if keys is None or k in keys]
    out: State = {}
    for rows in dtype_groups(v.dtype for _, v in tensors):
        flat = torch.cat([tensors[i][1].reshape(-1) for i in rows]).cpu().numpy()
        for i, part in zip(rows, np.split(flat, np.cumsum([tensors[i][1].numel() for i in rows])[:-1])):
            out[tensors[i][0]] = part.reshape(tensors[i][1].shape).copy()
    return {k: out[k] for k, _ in tensors}


class Method:
    """FedAvg (McMahan et al., 2017): CE locally, n_k-weighted average of the full state on the server.

    Subclasses override hooks; a hook left alone behaves as FedAvg.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params
    default_model: ClassVar[str | None] = None
    """Model that ``model.name: auto`` resolves to for this method (VIB nets, ResNet-56); None = the dataset's."""
    stored_models: ClassVar[float]
    """Model-sized tensors a client holds while training (FedAlign Table 5): FedAvg 1, FedProx 2, MOON 3, …
    No default: every method states it (checked by ``register``), so a cost column is never a silent 1."""
    passes_per_step: ClassVar[float]
    """Forward+backward passes per local step, for compute cost: FedAvg 1, SAM-type 2, GradAug n + 1, …
    No default, as ``stored_models``."""
    weighted_by_samples: ClassVar[bool] = True
    """Whether updates are weighted by n_k (FedAvg) or equally (FedDyn-family); also weights `all_model`."""
    batchable: ClassVar[bool] = False
    """Whether the batched executor (``resources.executor: batched``, engine/batched.py) may train this
    method's clients K at a time: its local step is plain gradient descent on :meth:`functional_loss`, and
    its other client hooks work on one client's context as usual. Checked through :meth:`batches_clients`."""
    final_round: ClassVar[Literal["tune", "own"]] = "tune"
    """What the final personal round (``training.finetune_epochs``, after the last round) trains on every
    client before the personalised evaluation: ``tune``, the personal part (else the head) on plain CE with
    the rest frozen (``methods/finetune.py``, FedCR's last round); ``own``, one more of the method's own
    local updates, after which its client model is evaluated (Ditto, as FedCR's ``main_fed_ditto.py``)."""
    tuner: ClassVar[type[FineTune] | None] = None
    """The ``tune`` round's method (a :class:`~fltune.methods.finetune.FineTune`); None: FineTune itself. A
    subclass names its own where the batched executor needs more of the tuning step than plain CE gives
    (VIB nets: the train-mode forward's ε, drawn outside the vmap)."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params if params is not None else self.Params()

    @classmethod
    def model_for(cls, dataset: str) -> str | None:
        """``default_model`` refined per dataset (VIB methods: the MLP on EMNIST, the CNN elsewhere)."""
        return cls.default_model

    # ---------------------------------------------------------------- model
    def adapt_model(self, model: nn.Module) -> nn.Module:
        """Extend the dataset's model with method-owned modules (e.g. MOON's projector); default: as is.

        Called wherever the run builds a model (driver and workers), so extra parameters are aggregated
        and checkpointed like any other.
        """
        return model

    def require_model(self, model: nn.Module, kind: type[ModelT], needs: str, allowed: str) -> ModelT:
        """``adapt_model`` of a method whose local objective needs one architecture: any other model fails
        once, at model construction, in one line naming ``model.name`` — not deep inside a Ray worker."""
        if not isinstance(model, kind):
            raise FLTuneError(
                f"model.name: {self.name} needs {needs}; allowed: {allowed} (got a {type(model).__name__})"
            )
        return model

    def require_linear_head(self, model: nn.Module) -> nn.Module:
        """``adapt_model`` of a method that reads the head as one classes × features linear map (FedPAC's
        classifier combination): any other head fails once, at model construction, in one line."""
        head = getattr(model, "head", None)
        if not isinstance(head, nn.Linear):
            raise FLTuneError(f"model.name: {self.name} needs a model whose head is one linear layer; this "
                              f"model's head is a {type(head).__name__}")
        return model

    # ---------------------------------------------------------------- client side
    def personal_keys(self, model: nn.Module) -> set[str]:
        """State-dict keys each client keeps for itself (never averaged); FedAvg: none."""
        return set()

    def client_model_state(self, global_state: State, client_state: dict[str, Any]) -> State:
        """The weights a client starts from: global weights overridden by its personal part."""
        return {**global_state, **client_state.get("personal", {})}

    def setup_client(self, ctx: ClientContext) -> None:
        """Prepare per-client extras before training (e.g. a frozen copy of the global model)."""

    def phases(self, ctx: ClientContext) -> list[Phase]:
        """Local training schedule; FedAvg trains every parameter for E epochs."""
        return [Phase(epochs=ctx.epochs)]

    @classmethod
    def epochs_trained(cls, epochs: int, local_epochs: int) -> float:
        """Passes over its data a client update of ``epochs`` epochs makes (``local_epochs``: the run's E), for
        the run-time estimate (``estimate.client_samples``): ``epochs``. A method whose phases count steps
        rather than epochs says how many passes those steps make."""
        return float(epochs)

    def local_loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-batch objective → (loss, logits). FedAvg: cross-entropy."""
        logits = ctx.model(x)
        return F.cross_entropy(logits, y), logits

    def backward(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill ``.grad`` for one batch → (detached loss, detached logits). SAM-type methods override."""
        loss, logits = self.local_loss(ctx, x, y)
        loss.backward()
        return loss.detach(), logits.detach()

    def after_backward(self, ctx: ClientContext) -> None:
        """Adjust gradients before clipping and the optimiser step (SCAFFOLD, FedDC)."""

    # ---------------------------------------------------------------- functional step (batched executor)
    @classmethod
    def batches_clients(cls) -> bool:
        """``batchable``, unless a subclass changed the per-batch step (``local_loss``, ``backward``,
        ``after_backward``) below the class that gave its functional form (:meth:`functional_loss` or
        :meth:`functional_step`): a ``<method>+<modifier>`` composite inherits ``batchable`` but its extra
        loss term has no functional form, so it is trained per client."""

        def owner(hook: str) -> int:
            return next(i for i, klass in enumerate(cls.__mro__) if hook in vars(klass))

        step = min(owner(hook) for hook in ("local_loss", "backward", "after_backward"))
        return cls.batchable and min(owner(hook) for hook in ("functional_loss", "functional_step")) <= step

    def loss_inputs(self, ctx: ClientContext) -> dict[str, dict[str, torch.Tensor]]:
        """Per-client tensors :meth:`functional_loss` reads besides the batch, read after ``setup_client``
        (the batched executor stacks them over a group); FedAvg: none. Overrides extend ``super()``'s."""
        return {}

    def functional_loss(
        self, forward: Forward, params: dict[str, torch.Tensor], inputs: dict[str, dict[str, torch.Tensor]],
        x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`local_loss` (plus what ``after_backward`` adds to the gradient) as a pure function of one
        client's ``params``, for ``torch.func``: (loss, logits). ``weight`` marks the real samples of a
        padded batch (:func:`masked_cross_entropy`). FedAvg: cross-entropy."""
        logits = forward(params, x)
        return masked_cross_entropy(logits, y, weight), logits

    def epoch_noise(self, ctx: ClientContext, counts: list[int], size: int, generator: torch.Generator) -> Tensors:
        """Random tensors that the steps of one epoch of :meth:`functional_loss` read as ``inputs["noise"]``,
        each ``[steps, size, ...]``: step s's draws for its ``counts[s]`` real samples, batch axis second, zero
        past them (the engine pads them as it pads x). Drawn outside the vmap from ``generator``, the client's
        own, seeded by (seed, round, client id) as the exact path seeds torch's global RNG, so a client's
        draws do not depend on its group (VIB's ε); once per epoch, not per step, since on a GPU every draw is
        a launch. FedAvg: none."""
        return {}

    def functional_step(self, params: Tensors, batch: FunctionalBatch) -> FunctionalStep:
        """One client's step as a pure function of its trainable ``params``: :meth:`backward` plus
        :meth:`after_backward` for ``torch.func``. Default: the gradient of :meth:`functional_loss`.
        Override where the step is more than one loss's gradient (SAM's two evaluations, Ditto's second
        model) and call ``super()`` for the gradient of the loss itself."""
        grads, loss, logits = gradient(lambda p: batch.loss(self, p), params)
        return FunctionalStep(grads, loss, logits)

    def record_step(self, ctx: ClientContext, y: torch.Tensor, record: Tensors) -> None:
        """Take one batched step's ``FunctionalStep.record`` for this client's real samples ``y`` (what
        the exact path's ``local_loss`` observes on the side, e.g. FedCR's class PoE); default: nothing."""

    def client_result(self, ctx: ClientContext) -> ClientResult:
        """Upload the shared weights (weight n_k, or 1 unless ``weighted_by_samples``); keep personal ones in
        the client's state."""
        personal = self.personal_keys(ctx.model)
        state = ctx.model.state_dict()
        shared = to_numpy(state, set(state) - personal)
        new_state = dict(ctx.state)
        if personal:
            new_state["personal"] = to_numpy(state, personal)
        weight = float(ctx.num_samples) if self.weighted_by_samples else 1.0
        return ClientResult(weight=weight, update=shared, state=new_state)

    def local_model(self, update: State, state: dict[str, Any], upload: Upload) -> State | None:
        """The client's trained weights rebuilt from what its :class:`ClientResult` carries (``update``,
        new ``state``, ``upload``), or None when they cannot be; read by the ``all_model`` protocol and the
        H_N/H_D probe (docs/methods.md §0, §4), which need every client's local model on the server.

        Why: a rebuilt model costs no transfer beyond the update, where shipping it doubles the round's.
        FedAvg: the update holds the shared weights, ``state["personal"]`` the rest (:meth:`client_result`).
        The workers compare the rebuild with the trained weights bit for bit and ship those instead when
        they differ (an update that is not the weights, as FedNova's d_k; a personal model that is not
        the trained one, as Ditto's v_k), so a wrong rebuild costs transfer, never a figure.
        """
        return {**update, **state.get("personal", {})}

    def personal_scorer(
        self, model: nn.Module, train_batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]],
    ) -> nn.Module:
        """What the personalised protocol scores a client with, given ``model`` holding its (final) client model:
        a module whose eval-mode output is read as logits (argmax for accuracy, CE for the loss).

        ``train_batches`` gives one epoch of the client's training batches as its local training sees them
        (augmented, shuffled, seeded by (seed, round, client id)): kNN-Per builds its datastore from them.
        Default: the model itself."""
        return model

    # ---------------------------------------------------------------- server side
    def init_server_state(self, global_state: State) -> dict[str, Any]:
        """Server-side state kept across rounds (SCAFFOLD's c, FedDyn's h); FedAvg: none."""
        return {}

    def server_payload(self, server_state: dict[str, Any]) -> dict[str, Any]:
        """Extra data broadcast to the round's clients beside the weights."""
        return {}

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        """New global weights: the weighted mean for every key clients uploaded, the old value elsewhere;
        server state and client states as they are. An override returns new objects (``dataclasses.replace``
        on ``super().aggregate(ctx)``) and never modifies ``ctx``, so it can be tested as a function."""
        return ServerUpdate(
            global_state={**ctx.global_state, **ctx.aggregate.mean}, server_state=ctx.server_state,
            client_states=ctx.aggregate.client_states,
        )


def params_table(method_cls: type[Method]) -> list[tuple[str, str, Any, str]]:
    """(name, type, default, description) rows for ``cli.py methods``."""
    rows = []
    for name, info in method_cls.Params.model_fields.items():
        kind = getattr(info.annotation, "__name__", str(info.annotation))
        rows.append((name, kind, info.default, info.description or ""))
    return rows
