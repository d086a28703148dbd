"""MAN: L = L_base + (ζ/2)·Σ_l mean(a_l²) over hidden post-ReLU activations (MAN Eq. 15-18, docs/methods.md §2)."""

import pytest
import torch
import torch.nn.functional as F

from fltune.errors import FLTuneError
from fltune.methods import get_method
from fltune.methods.base import Method
from fltune.methods.compose import compose
from fltune.methods.man import MAN
from fltune.models import build_model
from tests.methods.helpers import loss_of, make_ctx, tiny_batch, tiny_model
from tests.methods.local_helpers import (
    assert_close, engine_grads, grad_of, mlp, move_away, norm, params_of, shifted,
)


def method(name: str, **params):
    cls = get_method(name)
    return cls(cls.Params(**params))


def man_objective(params, x, y, weight: float):
    """Eq. 15 with Eq. 17/18: CE + weight · Σ_l (1/(B·d_l)) Σ_i ‖a_l^i‖²."""
    logits, acts = mlp(params, x)
    return F.cross_entropy(logits, y) + weight * sum((a**2).sum() / a.numel() for a in acts)


def test_loss_adds_half_zeta_times_the_mean_squared_activations():
    model = tiny_model()
    x, y = tiny_batch()
    loss, _ = loss_of(method("man", zeta=0.4), make_ctx(model), x, y)
    torch.testing.assert_close(loss, man_objective(params_of(model), x, y, weight=0.2))


def test_halve_false_uses_zeta_as_in_eq_15():
    model = tiny_model()
    x, y = tiny_batch()
    loss, _ = loss_of(method("man", zeta=0.4, halve=False), make_ctx(model), x, y)
    torch.testing.assert_close(loss, man_objective(params_of(model), x, y, weight=0.4))


def test_zeta_zero_is_exactly_the_base_loss():
    model = tiny_model()
    x, y = tiny_batch()
    ctx = make_ctx(model)
    for base in ("fedavg", "fedprox"):
        composed = loss_of(method(f"{base}+man", zeta=0.0), ctx, x, y)[0]
        assert torch.equal(composed, loss_of(method(base), ctx, x, y)[0])


def test_hooks_do_not_outlive_the_loss_call():
    model = tiny_model()
    x, y = tiny_batch()
    loss_of(method("man"), make_ctx(model), x, y)
    assert not any(m._forward_hooks for m in model.modules())


def test_term_is_in_both_passes_of_a_sam_base():
    """fedsam+man: ε from ∇(CE + term) at w, gradient of (CE + term) at w + ε."""
    model = tiny_model()
    x, y = tiny_batch()
    w = params_of(model)
    objective = lambda p: man_objective(p, x, y, weight=0.1)  # noqa: E731
    g = grad_of(objective, w)
    expected = grad_of(objective, shifted(w, {n: 0.05 * v / norm(g) for n, v in g.items()}))
    _, grads = engine_grads(method("fedsam+man", rho=0.05, zeta=0.2), make_ctx(model), x, y)
    assert_close(grads, expected)


def test_term_adds_to_a_regularised_base():
    model = tiny_model()
    global_state = move_away(model)
    x, y = tiny_batch()
    ctx = make_ctx(model, global_state=global_state)
    composed = method("feddyn+man", alpha=0.1, zeta=0.2)
    composed.setup_client(ctx)
    loss, _ = loss_of(composed, ctx, x, y)
    drift = sum(((p - global_state[n]) ** 2).sum() for n, p in model.named_parameters())
    torch.testing.assert_close(loss, man_objective(params_of(model), x, y, weight=0.1) + 0.05 * drift)


class TwoPasses(Method):
    """A base whose loss runs the model twice (like a sub-network pass): MAN must see the first only."""

    name = "two_passes"

    def local_loss(self, batch):
        loss, logits = super().local_loss(batch)
        return loss + 0.0 * batch.forward.model(2 * batch.x).sum(), logits


def test_only_the_first_firing_of_each_point_is_regularised():
    model = tiny_model()
    x, y = tiny_batch()
    composed = compose(TwoPasses, MAN)(compose(TwoPasses, MAN).Params(zeta=0.4))
    loss, _ = loss_of(composed, make_ctx(model), x, y)
    torch.testing.assert_close(loss, man_objective(params_of(model), x, y, weight=0.2))


def convnet_objective(model, x, y, weight: float):
    """The authors' ``ConvNet.forward`` and loss (``vcl-iisc/fedMAN:code/utils_models.py``, ``utils_general.py``)
    written out on the model's own layers: var1, var2 of the first two conv blocks (the third's is overwritten),
    var3, var4 of the dense layers, var5 = ``torch.std(x, axis=[0])**2`` of the last; CE + weight · Σ mean(var)."""
    body = model.body
    terms = []
    h = x
    for i, block in enumerate((body.conv1, body.conv2, body.conv3)):
        h = block.relu(block.norm(block.conv(h)))
        if i < 2:
            terms.append(torch.mean(h**2, dim=(1, 2, 3)))
        h = block.pool(h)
    h = body.fc1.relu(body.fc1.linear(h.flatten(1)))
    terms.append(torch.mean(h**2, dim=1))
    h = body.fc2.relu(body.fc2.linear(h))
    terms += [torch.mean(h**2, dim=1), torch.std(h, dim=0) ** 2]
    return F.cross_entropy(model.head(h), y) + weight * sum(torch.mean(t) for t in terms)


def test_tinyimagenet_cnn_term_is_the_authors_convnet_code():
    torch.manual_seed(0)
    model = build_model("tinyimagenet_cnn", (3, 8, 8), 5, widths=(12, 10))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 3, 8, 8, generator=gen), torch.randint(0, 5, (6,), generator=gen)

    loss, _ = loss_of(method("man", zeta=0.2), make_ctx(model, batches=[(x, y)]), x, y)

    torch.testing.assert_close(loss, convnet_objective(model, x, y, weight=0.1))
    assert model.variance_points == [model.body.fc2.relu]
    assert model.body.conv3.relu not in model.activation_points


def test_a_one_sample_batch_adds_no_variance():
    torch.manual_seed(0)
    model = build_model("tinyimagenet_cnn", (3, 8, 8), 5, widths=(12, 10))
    x, y = torch.randn(1, 3, 8, 8), torch.tensor([2])

    loss, _ = loss_of(method("man", zeta=0.2), make_ctx(model, batches=[(x, y)]), x, y)

    assert torch.isfinite(loss)


def test_a_model_without_relus_is_refused_in_one_line():
    vit = build_model("sl_vit", (3, 8, 8), 5)
    with pytest.raises(FLTuneError, match="model.name: man needs a model with hidden ReLU layers"):
        method("feddyn+man").adapt_model(vit)
    assert method("feddyn+man", zeta=0.0).adapt_model(vit) is vit  # ζ = 0 adds nothing: nothing to refuse
