"""FedCR: L = mean_s CE(head_i(z_s), y) + β·KL(r(·|y) ‖ q(z|x)); class PoE on clients, PoE + N(0,1) + EMA on
the server."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fltune.methods import get_method
from fltune.methods.base import Aggregate, ServerContext
from fltune.methods.fedcr import ClassPoE
from fltune.models.vib import posterior
from tests.methods.helpers import loss_of, make_ctx, pure_aggregate, tiny_batch
from tests.methods.vib_helpers import numpy_state, tiny_vib

FedCR = get_method("fedcr")


def fedcr(**params):
    return FedCR(FedCR.Params(**params))


def client_ctx(method, model, r_mu=None, r_sigma=None, batches=None):
    server = method.init_server_state(numpy_state(model))
    if r_mu is not None:
        server = {"r_mu": r_mu, "r_sigma": r_sigma}
    ctx = make_ctx(model, server=method.server_payload(server), batches=batches)
    method.setup_client(ctx)
    return ctx


def test_loss_is_sampled_ce_plus_beta_kl_from_the_class_gaussian_to_q():
    model = tiny_vib()
    gen = torch.Generator().manual_seed(3)
    r_mu = torch.randn(3, 2, generator=gen).numpy()
    r_sigma = (torch.rand(3, 2, generator=gen) + 0.5).numpy()
    method = fedcr(beta=0.2)
    ctx = client_ctx(method, model, r_mu, r_sigma)
    x, y = tiny_batch()

    torch.manual_seed(5)
    loss, _ = loss_of(method, ctx, x, y)

    torch.manual_seed(5)
    out = model.vib(x)
    ce = F.cross_entropy(out.logits.flatten(0, 1), y.repeat(4))
    m_r, s_r = torch.tensor(r_mu)[y], torch.tensor(r_sigma)[y]
    s_q = out.sigma
    kl = 0.5 * (s_r**2 / s_q**2 + (out.mu - m_r) ** 2 / s_q**2 - 1 + 2 * torch.log(s_q) - 2 * torch.log(s_r))
    assert torch.allclose(loss, ce + 0.2 * kl.sum(1).mean(), rtol=1e-5)


def test_two_expert_poe_matches_fedcr_product_of_experts_two():
    """Hand case: N(1, 1²) · N(3, 2²) ∝ N(1.4, 0.8): precision 1 + 1/4, mean (1·4 + 3·1)/5."""
    poe = ClassPoE(torch.zeros(2, 1))

    poe.add(torch.tensor([1, 1]), torch.tensor([[1.0], [3.0]]), torch.tensor([[1.0], [2.0]]))

    out = poe.to_numpy()
    assert out["precision"][1, 0] == pytest.approx(1.25)
    assert out["weighted_mean"][1, 0] / out["precision"][1, 0] == pytest.approx(1.4)
    assert out["precision"][0, 0] == 0.0


def test_clients_fold_only_the_last_epochs_samples():
    model = tiny_vib()
    method = fedcr()
    batches = [tiny_batch(seed=1, n=4), tiny_batch(seed=2, n=2)]
    ctx = client_ctx(method, model, batches=batches)

    for _epoch in range(2):
        for x, y in ctx.batches():
            torch.manual_seed(len(y))
            method.backward(ctx, x, y)  # folds the batch (record_step)
    result = method.client_result(ctx)

    precision = np.zeros((3, 2))
    with torch.no_grad():
        for x, y in batches:  # one epoch's worth, not two
            _, sigma = posterior(model.body(x))
            np.add.at(precision, y.numpy(), (sigma.double() ** -2).numpy())
    assert np.allclose(result.upload["precision"], precision)
    assert set(result.state["personal"]) == {"head.weight", "head.bias"}
    assert set(result.update) == {k for k in model.state_dict() if k.startswith("body.")}
    assert result.weight == 1.0


def test_epochs_before_the_last_are_not_folded_and_a_client_stopped_before_it_uploads_nothing():
    """Only the last of E = 3 epochs' fold is kept, so the first two fold nothing (~7 ops a step saved); a
    client that a non-finite loss stops before its last epoch uploads empty class Gaussians."""
    model, method = tiny_vib(), fedcr()
    batches = [tiny_batch(seed=1, n=4), tiny_batch(seed=2, n=2)]
    ctx = client_ctx(method, model, batches=batches)
    ctx.epochs = 3
    method.setup_client(ctx)
    for epoch in range(3):
        for x, y in ctx.batches():
            method.backward(ctx, x, y)  # folds the batch (record_step)
        assert ("poe" in ctx.scratch) == (epoch == 2)
    precision = np.zeros((3, 2))
    with torch.no_grad():
        for x, y in batches:
            np.add.at(precision, y.numpy(), (posterior(model.body(x))[1].double() ** -2).numpy())
    assert np.allclose(method.client_result(ctx).upload["precision"], precision)

    stopped = client_ctx(method, model, batches=batches)
    stopped.epochs = 3
    method.setup_client(stopped)
    for x, y in stopped.batches():  # one epoch, then a non-finite loss
        method.backward(stopped, x, y)  # folds the batch (record_step)
    upload = method.client_result(stopped).upload
    assert not upload["precision"].any() and not upload["weighted_mean"].any()


def test_server_poe_with_standard_normal_expert_then_ema():
    """Hand case for class 0: precisions 1 + 1 (client A, mean 2) + 2 (client B, mean −1) = 4, mean
    (2 − 2)/4 = 0, std 4^-½ = 0.5; with β2 = 0.5: r_μ = 0, r_σ = ½·1 + ½·0.5 = 0.75. Class 1 was seen by
    no client and stays N(0, 1)."""
    method = fedcr(beta2=0.5)
    shape = (2, 1)
    server_state = {"r_mu": np.zeros(shape, np.float32), "r_sigma": np.ones(shape, np.float32)}
    uploads = {
        3: {"precision": np.array([[1.0], [0.0]]), "weighted_mean": np.array([[2.0], [0.0]])},
        1: {"precision": np.array([[2.0], [0.0]]), "weighted_mean": np.array([[-2.0], [0.0]])},
    }
    store = {cid: {"personal": {}} for cid in uploads}
    global_state = {"body.w": np.zeros(1, np.float32)}
    mean = {"body.w": np.ones(1, np.float32)}
    ctx = ServerContext(1, global_state, Aggregate(mean, 2.0, store, {}, uploads), server_state, store, 5)

    new = pure_aggregate(method, ctx)

    assert np.allclose(new.server_state["r_mu"], [[0.0], [0.0]])
    assert np.allclose(new.server_state["r_sigma"], [[0.75], [1.0]])
    assert new.global_state["body.w"] == 1.0 and new.client_states == store


def test_initial_class_gaussians_are_standard_normal():
    state = fedcr().init_server_state(numpy_state(tiny_vib()))

    assert np.array_equal(state["r_mu"], np.zeros((3, 2))) and np.array_equal(state["r_sigma"], np.ones((3, 2)))


def test_overall_centroid_aligns_and_folds_every_sample_into_one_gaussian():
    """SimFAFL's Pre-experiment I: r has one row; the KL of every sample is taken to it whatever its class,
    and the last epoch folds all samples into it (precisions add)."""
    model, method = tiny_vib(), fedcr(beta=0.2, centroids="overall")
    state = method.init_server_state(numpy_state(model))
    assert state["r_mu"].shape == state["r_sigma"].shape == (1, 2)
    r_mu, r_sigma = np.array([[0.5, -1.0]], np.float32), np.array([[0.8, 1.5]], np.float32)
    batches = [tiny_batch(seed=1, n=4), tiny_batch(seed=2, n=2)]
    ctx = client_ctx(method, model, r_mu, r_sigma, batches=batches)
    x, y = batches[0]

    torch.manual_seed(5)
    loss, _ = loss_of(method, ctx, x, y)
    torch.manual_seed(5)
    out = model.vib(x)
    ce = F.cross_entropy(out.logits.flatten(0, 1), y.repeat(4))
    m_r, s_r, s_q = torch.tensor(r_mu), torch.tensor(r_sigma), out.sigma
    kl = 0.5 * (s_r**2 / s_q**2 + (out.mu - m_r) ** 2 / s_q**2 - 1 + 2 * torch.log(s_q) - 2 * torch.log(s_r))
    assert torch.allclose(loss, ce + 0.2 * kl.sum(1).mean(), rtol=1e-5)

    method.setup_client(ctx)
    for x, y in ctx.batches():
        method.backward(ctx, x, y)  # folds the batch (record_step)
    upload = method.client_result(ctx).upload
    with torch.no_grad():
        precision = sum((posterior(model.body(x))[1].double() ** -2).sum(0) for x, _ in batches)
    assert upload["precision"].shape == (1, 2) and np.allclose(upload["precision"][0], precision.numpy())
