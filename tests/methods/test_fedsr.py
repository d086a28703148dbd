"""FedSR: L = CE(head(z), y) + α_L2R·mean‖z‖₂ + α_CMI·KL(N(Cμ, (Cσ)²) ‖ N(r_μ[y], softplus(r_σ[y])²))."""

import math

import torch
import torch.nn.functional as F

from fltune.config import build_config
from fltune.methods import get_method
from fltune.reproduce.plan import cell_tree
from fltune.reproduce.registry import get_table
from tests.methods.helpers import loss_of, make_ctx, tiny_batch
from tests.methods.vib_helpers import tiny_vib

FedSR = get_method("fedsr")


def fedsr_model(method):
    return method.adapt_model(tiny_vib())


def loss_at_seed(method, model, x, y):
    torch.manual_seed(5)
    return loss_of(method, make_ctx(model), x, y)[0]


def test_reference_gaussians_live_in_the_head_and_stay_on_the_client():
    method = FedSR()
    model = fedsr_model(method)

    keys = set(model.state_dict())

    assert {"head.linear.weight", "head.r_mu", "head.r_sigma", "head.scale"} <= keys
    assert method.personal_keys(model) == {"head.r_mu", "head.r_sigma", "head.scale"}
    z = torch.randn(4, 2)
    assert torch.equal(model.head(z), model.head.linear(z))


def test_loss_pins_l2r_and_cmi_at_initialisation():
    """At init r_μ = 0, σ_r = softplus(1) = log(1 + e), C = 1: the CMI term is the closed-form KL to
    N(0, σ_r²); L2R is the mean Euclidean norm of the one sampled z."""
    method = FedSR(FedSR.Params(alpha_l2r=0.5, alpha_cmi=0.2))
    model = fedsr_model(method)
    x, y = tiny_batch()

    loss = loss_at_seed(method, model, x, y)

    torch.manual_seed(5)
    out = model.vib(x, samples=1)
    s_r = math.log(1 + math.e)
    mu, sigma = out.mu, out.sigma
    kl = (math.log(s_r) - torch.log(sigma) + (sigma**2 + mu**2) / (2 * s_r**2) - 0.5).sum(1).mean()
    expected = F.cross_entropy(out.logits[0], y) + 0.5 * out.z[0].norm(dim=1).mean() + 0.2 * kl
    assert torch.allclose(loss, expected, rtol=1e-5)


def test_zero_weights_leave_single_sample_cross_entropy():
    method = FedSR(FedSR.Params(alpha_l2r=0.0, alpha_cmi=0.0))
    model = fedsr_model(method)
    x, y = tiny_batch()

    loss = loss_at_seed(method, model, x, y)

    torch.manual_seed(5)
    assert torch.equal(loss, F.cross_entropy(model.vib(x, samples=1).logits[0], y))


def test_cmi_trains_the_reference_gaussians_and_upload_is_unweighted():
    method = FedSR()
    model = fedsr_model(method)
    x, y = tiny_batch()

    loss_at_seed(method, model, x, y).backward()
    result = method.client_result(make_ctx(model))

    assert model.head.r_mu.grad.abs().sum() > 0 and model.head.scale.grad is not None
    assert result.weight == 1.0 and "head.r_mu" not in result.update
    assert set(result.state["personal"]) == {"head.r_mu", "head.r_sigma", "head.scale"}


def test_defaults_are_fedcrs_fedsr_ft_run():
    """α_L2R = α_CMI = 0.001: the FedSR-FT command in ``haozzh/FedCR:README.md`` (``--CMI 0.001 --L2R 0.001``),
    the run behind SimFAFL Table 2's FedSR-FT row, which uses these defaults."""
    assert (FedSR.Params().alpha_l2r, FedSR.Params().alpha_cmi) == (0.001, 0.001)
    table = get_table("simfafl:table2")
    row = next(c for c in table.cells if c.row == "FedSR-FT")
    params = build_config(cell_tree(row, table.scales["paper"], row.dataset, [])).method.params
    assert (params.alpha_l2r, params.alpha_cmi) == (0.001, 0.001)
