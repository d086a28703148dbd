"""FedRep: max(E − body_epochs, 1) head-only epochs, then body_epochs body-only epochs; personal head."""

import pytest

from fltune.methods import get_method
from fltune.methods.base import Phase
from tests.methods.helpers import make_ctx, tiny_model

FedRep = get_method("fedrep")


@pytest.mark.parametrize(
    ("epochs", "body_epochs", "expected"),
    [
        (10, 1, [Phase(9, ("head.",)), Phase(1, ("body.",))]),  # FedCR's runs: local_ep 10, local_rep_ep 1
        (5, 2, [Phase(3, ("head.",)), Phase(2, ("body.",))]),
        (1, 1, [Phase(1, ("head.",)), Phase(1, ("body.",))]),  # degenerate: the head still gets an epoch
    ],
)
def test_head_epochs_then_body_epochs(epochs, body_epochs, expected):
    method = FedRep(FedRep.Params(body_epochs=body_epochs))

    assert method.phases(make_ctx(tiny_model(), epochs=epochs)) == expected


def test_head_is_personal():
    assert FedRep().personal_keys(tiny_model()) == {"head.weight", "head.bias"}
