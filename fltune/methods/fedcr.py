"""FedCR (Zhang et al., 2023; docs/methods.md §2): VIB nets aligned to server-side class Gaussians.

Client i, with z_s = μ(x) + σ(x)⊙ε_s from the VIB body and r(·|y) = N(r_μ[y], r_σ[y]²) from the server:

    L = mean_s CE(head_i(z_s), y) + β·mean_x KL(r(·|y) ‖ q(z|x))

(``haozzh/FedCR:code_FedCR/models/distributed_training_utils.py``: ``KL_between_normals(prior, encoder)``.)
In its last local epoch a client folds each class's (μ, σ) into one Gaussian by product of experts as
precision sums (the closed form of the code's ``product_of_experts_two``, independent of order); the server
takes the PoE of those and N(0, 1) and moves r by β2 (``global_POE``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch
from pydantic import Field
from torch import Tensor, nn

from fltune.methods import register
from fltune.methods.base import ClientContext, ClientResult, Method, Params, ServerContext, ServerUpdate, State
from fltune.methods.fedper import FedPer
from fltune.methods.finetune import FineTune
from fltune.methods.objective import Batch, NoiseShapes, Tensors
from fltune.models.vib import SIGMA_FLOOR, VIBNet, VIBOutput, gaussian_kl, posterior


VIB_MODELS = ("vib_cnn", "vib_mlp")
_MLP_DATASETS = frozenset({"emnist_letters", "mnist"})
"""Datasets FedCR/SimFAFL train with the fully connected net (EMNIST-L; MNIST by analogy **[U]**)."""


class VIBFineTune(FineTune):
    """The ``tune`` round on a VIB net: CE of the head on the mean of S sampled z."""

    vib_samples: ClassVar[int | None] = None

    def noise(self, model: nn.Module) -> NoiseShapes:
        """ε: ``vib_samples`` (None: the net's S) draws of z per input, from the client's own seeded stream."""
        net = cast(VIBNet, model)
        return {"eps": (net.samples if self.vib_samples is None else self.vib_samples, net.feature_dim)}

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        _, _, z = functional_z(batch)
        logits = batch.forward.part("head", batch.weights, z.mean(0))
        return batch.cross_entropy(logits), logits


class VIBMethod(Method):
    """A method whose objective needs a VIB net's q(z|x) (FedCR, SimFAFL, FedSR, all from ``haozzh/FedCR``); updates
    weigh 1 each (FedCR's ``average``)."""

    default_model: ClassVar[str | None] = "vib_cnn"
    weighted_by_samples: ClassVar[bool] = False
    vib_samples: ClassVar[int | None] = None
    """z samples per input in training (``noise``); None: the net's S (FedSR: 1)."""
    tuner: ClassVar[type[FineTune] | None] = VIBFineTune

    @classmethod
    def model_for(cls, dataset: str) -> str | None:
        return "vib_mlp" if dataset in _MLP_DATASETS else "vib_cnn"

    def adapt_model(self, model: nn.Module) -> nn.Module:
        return self.require_model(model, VIBNet, "a VIB model", f"auto, {', '.join(VIB_MODELS)}")

    noise = VIBFineTune.noise


def functional_vib(batch: Batch) -> VIBOutput:
    """``VIBNet.vib`` as a function of the batch's parameters, with its ε."""
    mu, sigma, z = functional_z(batch)
    return VIBOutput(mu, sigma, z, batch.forward.part("head", batch.weights, z))


def functional_z(batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
    """μ, σ of q(z|x) and z ``[S, B, dimZ]`` from ε ``[B, S, dimZ]``."""
    mu, sigma = posterior(batch.forward.part("body", batch.weights, batch.x))
    return mu, sigma, mu + sigma * batch.noise["eps"].transpose(0, 1)


class FedCRParams(Params):
    beta: float = Field(1e-4, ge=0, description="weight β of KL(r(z|y) ‖ q(z|x)) (FedCR runs: 1e-4)")
    beta2: float = Field(1.0, ge=0, le=1, description="EMA rate β2 of the server's class Gaussians (runs: 1)")
    centroids: Literal["class", "overall"] = Field(
        "class", description="one Gaussian r per class (FedCR) or one for all samples (SimFAFL's Pre-exp I) [U]"
    )


class ClassPoE:
    """Per-class product of experts of diagonal Gaussians as float64 precision sums, shaped as ``like`` (r's means)."""

    def __init__(self, like: Tensor) -> None:
        self.precision = torch.zeros_like(like, dtype=torch.float64)
        self.weighted_mean = torch.zeros_like(self.precision)

    def add(self, y: Tensor, mu: Tensor, sigma: Tensor) -> None:
        precision = sigma.detach().double().clamp_min(SIGMA_FLOOR) ** -2
        self.precision.index_add_(0, y, precision)
        self.weighted_mean.index_add_(0, y, precision * mu.detach().double())

    def to_numpy(self) -> dict[str, np.ndarray]:
        return {"precision": self.precision.cpu().numpy(), "weighted_mean": self.weighted_mean.cpu().numpy()}


def server_poe(uploads: list[dict[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, std, seen) of the PoE of every client's class Gaussians and an N(0, 1) expert, per class."""
    precision = sum(u["precision"] for u in uploads)
    weighted_mean = sum(u["weighted_mean"] for u in uploads)
    seen = (precision > 0).any(axis=1)
    total = 1.0 + precision
    return weighted_mean / total, total**-0.5, seen


@register
class FedCR(VIBMethod, FedPer):
    """FedCR: L = CE(head_i(z), y) + β·KL(r(·|y) ‖ q(z|x)); server PoE + EMA of the class Gaussians r."""

    name = "fedcr"
    Params = FedCRParams
    stored_models = 1.0  # the VIB net only (class Gaussians are small)
    passes_per_step = 1.0  # the z samples share one body pass

    def init_server_state(self, global_state: State) -> dict[str, Any]:
        classes, dim = global_state["head.weight"].shape
        shape = (classes if self.params.centroids == "class" else 1, dim)
        return {"r_mu": np.zeros(shape, np.float32), "r_sigma": np.ones(shape, np.float32)}

    def setup_client(self, ctx: ClientContext) -> None:
        ctx.inputs["r"] = {"mu": ctx.server_tensors["r_mu"], "sigma": ctx.server_tensors["r_sigma"]}  # read only
        ctx.scratch["seen"] = 0
        ctx.scratch["fold_from"] = (sum(phase.epochs for phase in self.phases(ctx)) - 1) * ctx.num_samples

    def centre(self, y: Tensor) -> Tensor:
        """The row of r each sample is aligned to and folded into."""
        return y if self.params.centroids == "class" else torch.zeros_like(y)

    def local_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        out, y = functional_vib(batch), batch.y
        batch.record.update(mu=out.mu, sigma=out.sigma)
        loss = batch.cross_entropy(out.logits)
        if self.params.beta:
            r, c = batch.inputs["r"], self.centre(y)
            loss = loss + self.params.beta * batch.mean(gaussian_kl(r["mu"][c], r["sigma"][c], out.mu, out.sigma))
        return loss, out.logits.mean(0)

    def record_step(self, ctx: ClientContext, y: Tensor, record: Tensors) -> None:
        """PoE of the last epoch's samples, as FedCR's code restarts the fold each epoch."""
        seen = ctx.scratch["seen"]
        ctx.scratch["seen"] += len(y)
        if seen < ctx.scratch["fold_from"]:
            return
        if seen % ctx.num_samples == 0:
            ctx.scratch["poe"] = ClassPoE(ctx.inputs["r"]["mu"])
        ctx.scratch["poe"].add(self.centre(y), record["mu"], record["sigma"])

    def client_result(self, ctx: ClientContext) -> ClientResult:
        """The last epoch's class Gaussians (none if a non-finite loss stopped it: the run diverged)."""
        result = super().client_result(ctx)
        poe = ctx.scratch["poe"] if "poe" in ctx.scratch else ClassPoE(ctx.inputs["r"]["mu"])
        result.upload = poe.to_numpy()
        return result

    def aggregate(self, ctx: ServerContext) -> ServerUpdate:
        out = super().aggregate(ctx)
        mean, std, seen = server_poe(list(ctx.aggregate.uploads.values()))
        beta2, state = self.params.beta2, dict(out.server_state)
        for key, new in (("r_mu", mean), ("r_sigma", std)):
            old = state[key]
            state[key] = np.where(seen[:, None], (1 - beta2) * old + beta2 * new, old).astype(np.float32)
        return replace(out, server_state=state)
