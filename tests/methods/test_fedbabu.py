"""FedBABU: the body alone is trained (head frozen at its initialisation); nothing is personal."""

from fltune.engine.local import _trainable
from fltune.methods import get_method
from tests.methods.helpers import make_ctx, tiny_model


def test_only_the_body_trains_and_the_unchanged_head_is_shared():
    model = tiny_model()
    method = get_method("fedbabu")()
    ctx = make_ctx(model, epochs=3)

    (phase,) = method.phases(ctx)
    trained = {id(p) for p in _trainable(model, phase)}

    assert phase.epochs == 3
    assert trained == {id(p) for p in model.body.parameters()}
    assert not any(id(p) in trained for p in model.head.parameters())
    assert method.personal_keys(model) == set()
