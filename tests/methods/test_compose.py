"""``<base>+<modifier>`` names: built on demand, cached, Params = union of both, clashes rejected."""

import pytest
from pydantic import Field, ValidationError

from fltune.config import build_config
from fltune.errors import FLTuneError
from fltune.methods import MODIFIERS, get_method
from fltune.methods.base import Params
from fltune.methods.compose import Modifier, compose
from fltune.methods.fedsam import FedSAM

BASES = ["fedavg", "feddyn", "feddc", "fedsam", "fedasam", "fedspeed", "fedsol", "fedntd", "scaffold", "fednova",
         "fedprox"]


@pytest.mark.parametrize("base", BASES)
def test_every_base_takes_man(base):
    cls = get_method(f"{base}+man")
    assert cls.name == f"{base}+man"
    assert issubclass(cls, get_method(base))
    fields = set(cls.Params.model_fields)
    assert fields == set(get_method(base).Params.model_fields) | set(MODIFIERS["man"].Params.model_fields)
    assert get_method(f"{base}+man") is cls  # cached: one class per name and process
    params = cls.Params()
    assert cls(params).modifier.params.zeta == params.zeta == 0.15


def test_composite_params_validate_both_parts():
    params = get_method("fedsam+man").Params(rho=0.1, zeta=0.3)
    assert (params.rho, params.zeta, params.halve) == (0.1, 0.3, True)
    with pytest.raises(ValidationError):
        get_method("fedsam+man").Params(zeta=-1.0)
    with pytest.raises(ValidationError):
        get_method("fedsam+man").Params(mu=1.0)


def test_config_accepts_a_composite_name():
    cfg = build_config(overrides=["method.name=feddc+man", "method.alpha=0.1", "method.zeta=0.1"])
    assert cfg.method.params.alpha == 0.1 and cfg.method.params.zeta == 0.1


class RadiusParams(Params):
    rho: float = Field(1.0)


class Radius(Modifier):
    """A modifier whose field clashes with FedSAM's ρ."""

    name = "radius"
    Params = RadiusParams


def test_clashing_fields_are_rejected():
    with pytest.raises(FLTuneError, match="both define rho"):
        compose(FedSAM, Radius)
    with pytest.raises(FLTuneError, match="both define"):
        get_method("fedsam+man+man")


def test_unknown_parts_name_what_is_allowed():
    with pytest.raises(FLTuneError, match="unknown modifier 'nope'.*allowed: man"):
        get_method("fedavg+nope")
    with pytest.raises(FLTuneError, match="unknown method 'nope'"):
        get_method("nope+man")


def test_man_alone_is_fedavg_with_man():
    cls = get_method("man")
    assert issubclass(cls, get_method("fedavg"))
    assert set(cls.Params.model_fields) == {"zeta", "halve"}
