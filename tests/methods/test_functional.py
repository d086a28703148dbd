"""A method's step as a pure function (``methods/functional.py``): for every method that has one, the
loss and gradient the client-by-client path leaves in ``.grad`` (and Ditto's personal model)."""

import pytest
import torch

from fltune.engine.batched import client_noise
from fltune.methods import METHODS, get_method
from fltune.methods._vib import VIBMethod
from fltune.methods.functional import FunctionalBatch, has_functional_step, local_step
from fltune.methods.objective import Forward
from fltune.methods.wire import to_numpy
from tests.methods.helpers import make_ctx, tiny_batch, tiny_model
from tests.methods.local_helpers import assert_close, engine_grads, move_away, params_of
from tests.methods.vib_helpers import tiny_vib

FUNCTIONAL = sorted(name for name, cls in METHODS.items() if has_functional_step(cls))


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
    batch = FunctionalBatch(Forward(model), names, {}, inputs, {k: v[0] for k, v in noise.items()}, pad(x), pad(y),
                            weight, global_state, ctx.lr, grad_clip)
    step = local_step(method, params, batch)

    torch.manual_seed(7)
    loss, grads = engine_grads(method, ctx, x, y)
    assert step.loss.item() == pytest.approx(loss.item(), rel=1e-5)
    assert_close(step.grads, grads, rtol=1e-4, atol=1e-6)
    if name == "ditto":
        assert_close(step.carry["personal"], params_of(ctx.scratch["personal"].model), rtol=1e-4, atol=1e-6)


def pad(t: torch.Tensor) -> torch.Tensor:
    """``t`` with two zero samples appended along its batch axis (the first)."""
    return torch.cat([t, t.new_zeros(2, *t.shape[1:])])
