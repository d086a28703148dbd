"""What an objective reads (``methods/objective.py``): the model as a function of its parameters, and the
padded cross-entropy."""

import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from fltune.methods import objective
from fltune.methods.objective import Batch, Forward
from tests.engine.helpers import OpCount
from tests.methods.helpers import tiny_batch, tiny_model


def test_forward_runs_the_module_itself_with_its_own_parameters_and_swaps_in_any_others(monkeypatch):
    """Called with the model's own parameters (``Forward.own``) the module runs as it is, no parameter
    swapped in and out; any other parameters go through ``functional_call``: the same logits at the same
    values."""
    model, (x, _) = tiny_model(), tiny_batch()
    forward = Forward(model)
    copies = {n: p.detach().clone() for n, p in forward.own.items()}
    swapped = forward(copies, x)
    h = torch.ones(len(x), model.head.in_features)
    head = forward.part("head", copies, h)
    monkeypatch.setattr(objective, "functional_call", None)  # the module's own parameters never reach it
    assert torch.equal(forward(forward.own, x), swapped) and torch.equal(forward.part("head", forward.own, h), head)
    assert torch.equal(head, model.head(h))


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
        return Batch(None, {}, z, labels, w).mean(F.cross_entropy(z, labels, reduction="none"))

    def fltunes(z, labels, w):
        return Batch(None, {}, z, labels, w).cross_entropy(z)

    results = {}
    for name, loss in (("torch", torchs), ("fltune", fltunes)):
        with OpCount() as ops:
            value, gradient = vmap(loss)(logits, y, weight), vmap(grad(loss))(logits, y, weight)
        results[name] = value, gradient, ops.count
        assert torch.equal(loss(logits[0], y[0], weight[0]), value[0])
    assert torch.equal(results["torch"][0], results["fltune"][0])
    assert torch.equal(results["torch"][1], results["fltune"][1])
    assert results["fltune"][2] <= results["torch"][2] - 14
