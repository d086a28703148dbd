"""``effective_steps``: how far K momentum-SGD steps carry a constant gradient, the divisor of FedNova's a_k
and SCAFFOLD/FedDC's c_k⁺ (the FedSOL authors' ``Lee-Gihun/FedSOL:algorithms/scaffold/ClientTrainer.py``,
``__get_divisor``: new_K = (K − ρ(1 − ρ^K)/(1 − ρ))/(1 − ρ)); every batchable method's
``functional_step`` against its exact step, and an epoch's noise against the exact path's draws."""

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from fltune.methods import METHODS, get_method
from fltune.methods._vib import VIBMethod
from fltune.methods.base import (
    Forward, FunctionalBatch, batch_mean, effective_steps, masked_cross_entropy, to_numpy,
)
from fltune.models.registry import build_model
from tests.engine.helpers import OpCount
from tests.methods.helpers import make_ctx, tiny_batch, tiny_model
from tests.methods.local_helpers import assert_close, engine_grads, move_away, params_of
from tests.methods.vib_helpers import tiny_vib


@pytest.mark.parametrize(("steps", "momentum", "expected"),
                         [(5, 0.0, 5.0), (50, 0.0, 50.0), (1, 0.9, 1.0), (2, 0.5, 2.5)])
def test_by_hand(steps, momentum, expected):
    """ρ = 0.5, K = 2: g_1 moves w in steps 1 and 2 (1 + ρ), g_2 in step 2 (1): 2.5. ρ = 0 gives K."""
    assert effective_steps(steps, momentum) == pytest.approx(expected)


def test_fedsol_divisor_at_k50_rho09():
    """The issue's figure: K = 50, ρ = 0.9 → (50 − 0.9·(1 − 0.9^50)/0.1)/0.1 ≈ 410.46, not 50."""
    assert effective_steps(50, 0.9) == pytest.approx((50 - 0.9 * (1 - 0.9**50) / 0.1) / 0.1)
    assert effective_steps(50, 0.9) == pytest.approx(410.46, abs=0.01)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize(("steps", "momentum"), [(7, 0.9), (50, 0.9), (3, 0.5)])
def test_matches_torch_sgd(steps, momentum, nesterov):
    """With a constant gradient g, K steps of torch's (Nesterov) momentum SGD move w by lr·K_eff·g."""
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=0.1, momentum=momentum, nesterov=nesterov)
    for _ in range(steps):
        optimizer.zero_grad()
        (2.0 * w).sum().backward()
        optimizer.step()
    assert -w.item() / (0.1 * 2.0) == pytest.approx(effective_steps(steps, momentum, nesterov), rel=1e-9)


BATCHABLE = sorted(name for name, cls in METHODS.items() if cls.batches_clients())


@pytest.mark.parametrize("grad_clip", [None, 0.05])
@pytest.mark.parametrize("name", BATCHABLE)
def test_functional_step_is_the_exact_step(name, grad_clip):
    """The batched executor's contract, method by method: on one batch padded by two zero-weight samples,
    ``functional_step`` gives the loss and the gradient ``backward`` + ``after_backward`` leave in
    ``.grad``, and Ditto's carried personal model the one ``backward`` stepped (clipped alike when
    ``grad_clip`` is set: 0.05 clips it); ε is drawn alike (``epoch_noise`` of a one-step epoch, from a
    generator seeded as the exact path seeds torch's global RNG)."""
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
    noise = method.epoch_noise(ctx, [len(y)], len(y) + 2, torch.Generator().manual_seed(7))
    inputs = {**method.loss_inputs(ctx), "noise": {k: v[0] for k, v in noise.items()}}
    weight = pad(torch.ones(len(y)))
    batch = FunctionalBatch(Forward(model), names, {}, inputs, pad(x), pad(y), weight, global_state, ctx.lr, grad_clip)
    step = method.functional_step(params, batch)

    torch.manual_seed(7)
    loss, grads = engine_grads(method, ctx, x, y)
    assert step.loss.item() == pytest.approx(loss.item(), rel=1e-5)
    assert_close(step.grads, grads, rtol=1e-4, atol=1e-6)
    if name == "ditto":
        assert_close(step.carry["personal"], params_of(ctx.scratch["personal"]), rtol=1e-4, atol=1e-6)


class Draws(OpCount):
    """The random normal draws made under it."""

    def counts(self, func: Any) -> bool:
        return func is torch.ops.aten.randn.generator


@pytest.mark.parametrize("name", ["simfafl", "fedsr"])
def test_an_epochs_noise_is_one_draw_cut_into_the_exact_paths_steps(name):
    """VIB's ε for an epoch of three full steps and a short one: step by step, the draws the exact path makes
    per step from a generator seeded alike (batch axis second; S·n·dimZ a multiple of 16, where on a CPU one
    draw cuts into the same numbers), zero past each step's samples, and made in one draw (on a GPU a launch
    each, where the step's share used to be a draw per client and step)."""
    method = get_method(name)()
    ctx = make_ctx(method.adapt_model(build_model("vib_mlp", (1, 4, 4), 3, dim_z=16, samples=4)))
    counts, size = [5, 5, 5, 3], 5
    with Draws() as draws:
        eps = method.epoch_noise(ctx, counts, size, torch.Generator().manual_seed(7))["eps"]
    assert draws.count == 1 and eps.shape == (4, size, method.vib_samples or 4, 16)
    generator = torch.Generator().manual_seed(7)
    for s, n in enumerate(counts):
        step = method.net(ctx).noise(n, method.vib_samples, generator=generator)  # the exact path's [S, n, dimZ]
        assert torch.equal(eps[s, :n], step.transpose(0, 1)) and not eps[s, n:].any()


def pad(t: torch.Tensor) -> torch.Tensor:
    """``t`` with two zero samples appended along its batch axis (the first)."""
    return torch.cat([t, t.new_zeros(2, *t.shape[1:])])


def test_forward_ties_weights_only_for_a_model_that_shares_a_tensor():
    """``Forward`` skips ``functional_call``'s search for tied weights (a walk over every submodule per call)
    where no tensor has two names, and keeps it where one has: a value given under one name of a shared
    layer is the value of both."""
    shared = torch.nn.Linear(3, 3)
    tied = torch.nn.Sequential(shared, torch.nn.Tanh(), shared)
    assert Forward(tied).tied and not Forward(tiny_model()).tied
    params = {n: torch.randn_like(p) for n, p in tied.named_parameters()}  # one name per shared tensor
    assert set(params) == {"0.weight", "0.bias"}
    x = torch.randn(4, 3)
    by_hand = torch.tanh(x @ params["0.weight"].T + params["0.bias"]) @ params["0.weight"].T + params["0.bias"]
    torch.testing.assert_close(Forward(tied)(params, x), by_hand)


def test_padded_cross_entropy_has_torchs_bits_inside_vmap_in_fewer_ops():
    """The padded cross-entropy writes out −log softmax at the label: its value and its gradient are those of
    ``F.cross_entropy(reduction="none")`` to the last bit, for K clients under vmap as for one, without the
    ignore_index mask that torch's decomposition under vmap adds (7 ops in the forward, 7 in the backward)."""
    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(4, 10, 7, generator=generator)
    y = torch.randint(0, 7, (4, 10), generator=generator)
    weight = (torch.rand(4, 10, generator=generator) > 0.3).float()

    def torchs(z, labels, w):
        return batch_mean(F.cross_entropy(z, labels, reduction="none"), w)

    results = {}
    for name, loss in (("torch", torchs), ("fltune", masked_cross_entropy)):
        with OpCount() as ops:
            value, gradient = vmap(loss)(logits, y, weight), vmap(grad(loss))(logits, y, weight)
        results[name] = value, gradient, ops.count
        assert torch.equal(loss(logits[0], y[0], weight[0]), value[0])
    assert torch.equal(results["torch"][0], results["fltune"][0])
    assert torch.equal(results["torch"][1], results["fltune"][1])
    assert results["fltune"][2] <= results["torch"][2] - 14


def test_to_numpy_copies_each_tensor_bit_for_bit_into_an_array_of_its_own():
    """One copy per dtype to the host, then each tensor's part as an array that owns its bytes: dtype, shape,
    bits and order as ``tensor.cpu().numpy()`` gives them, a transposed (non-contiguous) view and a scalar
    included; ``keys`` picks a sub-state."""
    torch.manual_seed(0)
    state = {"w": torch.randn(3, 4, requires_grad=True), "steps": torch.arange(5), "t": torch.randn(2, 3).t(),
             "s": torch.tensor(2.5), "h": torch.randn(3, dtype=torch.float64)}
    for keys in (None, {"steps", "t"}):
        arrays = to_numpy(state, keys)
        assert list(arrays) == [k for k in state if keys is None or k in keys]
        for name, array in arrays.items():
            want = state[name].detach().numpy()
            assert (array.dtype, array.shape, array.tobytes()) == (want.dtype, want.shape, want.tobytes()), name
            assert array.flags.owndata and array.flags.writeable, name
