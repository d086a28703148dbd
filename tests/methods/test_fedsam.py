"""FedSAM: step with ∇L(w + ε), ε = ρ·∇L(w)/‖∇L(w)‖ (docs/methods.md §2); the SAM step its family shares."""

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from fltune.methods import get_method
from fltune.models import SplitModel
from tests.methods.helpers import make_ctx, tiny_batch, tiny_model
from tests.methods.local_helpers import (
    assert_close, ce, engine_grads, grad_of, norm, params_of, shifted,
)


def fedsam(rho: float):
    return get_method("fedsam")(get_method("fedsam").Params(rho=rho))


def test_gradient_is_taken_at_the_sam_perturbed_weights():
    model = tiny_model()
    x, y = tiny_batch()
    w = params_of(model)
    g = grad_of(lambda p: ce(p, x, y), w)
    eps = {n: 0.05 * v / norm(g) for n, v in g.items()}
    expected = grad_of(lambda p: ce(p, x, y), shifted(w, eps))

    loss, grads = engine_grads(fedsam(0.05), make_ctx(model), x, y)

    assert_close(grads, expected)
    torch.testing.assert_close(loss, ce(w, x, y))  # the reported loss is the one at w
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), w[n]), f"{n} not restored exactly"


def test_rho_zero_gives_fedavg_gradients_exactly():
    model = tiny_model()
    x, y = tiny_batch()
    ctx = make_ctx(model)
    _, sam = engine_grads(fedsam(0.0), ctx, x, y)
    _, avg = engine_grads(get_method("fedavg")(), ctx, x, y)
    for name in avg:
        assert torch.equal(sam[name], avg[name])


def bn_net() -> SplitModel:
    return SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU()), nn.Linear(8, 3), 8)


def test_batchnorm_running_statistics_move_once_per_step():
    """The perturbed pass runs with BN momentum 0: running stats are those of one plain forward pass."""
    model, reference = bn_net(), bn_net()
    reference.load_state_dict(model.state_dict())
    x, y = tiny_batch()
    model.train(), reference.train()
    engine_grads(fedsam(0.5), make_ctx(model), x, y)
    reference(x)
    bn, ref_bn = model.body[2], reference.body[2]
    assert torch.equal(bn.running_mean, ref_bn.running_mean)
    assert torch.equal(bn.running_var, ref_bn.running_var)
    assert bn.momentum == ref_bn.momentum == 0.1


def test_negative_rho_is_rejected():
    with pytest.raises(ValidationError):
        get_method("fedsam").Params(rho=-0.1)
