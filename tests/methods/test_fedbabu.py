"""FedBABU: the body alone is trained (head frozen at its initialisation); nothing is personal."""

from fltune.methods import get_method
from tests.methods.helpers import make_ctx, tiny_model


def test_only_the_body_trains_and_the_unchanged_head_is_shared():
    model = tiny_model()
    method = get_method("fedbabu")()
    ctx = make_ctx(model, epochs=3)

    (phase,) = method.phases(ctx)
    trained = {name for name, _ in model.named_parameters() if name.startswith(phase.prefixes)}

    assert phase.epochs == 3
    assert trained == {f"body.{name}" for name, _ in model.body.named_parameters()}
    assert not any(name.startswith("head.") for name in trained)
    assert method.personal_keys(model) == set()
