"""A method's step as a pure function (``engine/functional.py``): for every method the batched executor can run, the
loss and gradient the client-by-client path leaves in ``.grad`` (and Ditto's personal model); a method whose objective
reads a client's modules says so as it runs (``ClientByClient``)."""

import pytest
import torch

from fltune.engine.batched import client_noise
from fltune.methods import METHODS, get_method
from fltune.methods.fedcr import VIBMethod
from fltune.engine.functional import batchable, functional_gradient, local_step, own_backward, reads_modules
from fltune.methods.objective import Batch, Forward
from fltune.methods.wire import to_numpy
from tests.methods.helpers import make_ctx, tiny_batch, tiny_model
from tests.methods.local_helpers import assert_close, engine_grads, move_away, params_of
from tests.methods.vib_helpers import tiny_vib

FUNCTIONAL = sorted(name for name, cls in METHODS.items() if batchable(cls) and cls.default_model != "resnet56")
"""Every method with no backward of its own, but those needing ResNet-56 (BatchNorm: never batched)."""


@pytest.mark.parametrize("grad_clip", [None, 0.05])
@pytest.mark.parametrize("name", FUNCTIONAL)
def test_the_functional_step_is_the_exact_step(name, grad_clip):
    """Method by method, on one batch padded by two zero-weight samples: ``local_step`` gives the loss and
    the gradient ``backward`` and the gradient correction leave in ``.grad``, and Ditto's
    carried personal model the one ``backward`` stepped (clipped alike when ``grad_clip`` is set: 0.05
    clips it); ε is drawn alike (``client_noise`` of a one-step epoch, from a generator seeded as the exact
    path seeds torch's global RNG)."""
    method = get_method(name)()
    vib = isinstance(method, VIBMethod)
    model = method.adapt_model(tiny_vib() if vib else tiny_model())
    global_state = move_away(model)  # FedProx's and Ditto's proximal terms are not zero
    server = method.server_payload(method.init_server_state(to_numpy(global_state)))
    ctx = make_ctx(model, global_state=global_state, server=server, grad_clip=grad_clip)
    method.setup_client(ctx)
    x, y = tiny_batch()
    names = tuple(n for n, _ in model.named_parameters())
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    noise = client_noise(method.noise(model), [len(y)], len(y) + 2, torch.Generator().manual_seed(7), ctx.device)
    inputs = {key: dict(values) for key, values in ctx.inputs.items()}  # the exact step below moves Ditto's v
    weight = pad(torch.ones(len(y)))
    batch = Batch(Forward(model), params, pad(x), pad(y), weight, inputs, {k: v[0] for k, v in noise.items()},
                  global_state, trainable=names, lr=ctx.lr, grad_clip=grad_clip, gradient=functional_gradient)
    step = local_step(method, batch)

    torch.manual_seed(7)
    loss, grads = engine_grads(method, ctx, x, y)
    assert step.loss.item() == pytest.approx(loss.item(), rel=1e-5)
    assert_close(step.grads, grads, rtol=1e-4, atol=1e-6)
    if name == "ditto":
        assert_close(step.kept["personal"], params_of(ctx.scratch["personal"].model), rtol=1e-4, atol=1e-6)


def test_the_methods_trained_client_by_client_are_read_off_their_code():
    """Nothing declares it: a ``backward`` of its own (Proximal, Per-FedAvg), or an objective calling ``Batch.module``
    (hooks, sub-networks, frozen copies, draws from torch's global RNG), directly, through a helper or a modifier."""
    assert {name for name, cls in METHODS.items() if own_backward(cls)} == {"perfedavg", "proximal"}
    assert {name for name, cls in METHODS.items() if reads_modules(cls)} == {
        "fedalign", "fedntd", "fedpac", "gradaug", "man", "mixup", "moon", "proximal"}
    assert reads_modules(get_method("fedsol+man")) and not reads_modules(get_method("fedsol"))


def pad(t: torch.Tensor) -> torch.Tensor:
    """``t`` with two zero samples appended along its batch axis (the first)."""
    return torch.cat([t, t.new_zeros(2, *t.shape[1:])])
