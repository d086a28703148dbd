"""Config: YAML in/out, dotted overrides, method Params validation, one-line errors, a torch-free leaf."""

import re
import subprocess
import sys

import pytest
import yaml

from fltune.cli import main
from fltune.config import apply_overrides, build_config, flatten, read_yaml
from fltune.errors import FLTuneError


def test_defaults_round_trip_through_yaml():
    cfg = build_config()
    again = build_config(yaml.safe_load(cfg.to_yaml()))
    assert again == cfg
    assert cfg.method.name == "fedavg" and cfg.training.batch_size == 50 and cfg.training.momentum == 0.9


def test_method_params_are_validated_and_defaulted():
    cfg = build_config(overrides=["method.name=fedprox", "method.mu=0.5"])
    assert cfg.method.params.mu == 0.5
    assert build_config(overrides=["method.name=fedprox"]).method.params.mu == 1.0  # FedSOL App. B.5
    assert "mu: 1.0" in build_config(overrides=["method.name=fedprox"]).to_yaml()


def test_dumps_list_every_method_parameter_whether_given_or_not():
    """Defaults not given are filled in when dumped, so YAML round trips and MLflow params are complete."""
    bare = build_config(overrides=["method.name=fedprox"])
    given = build_config(overrides=["method.name=fedprox", "method.mu=1.0"])
    assert bare.model_dump()["method"] == given.model_dump()["method"] == {"name": "fedprox", "mu": 1.0}
    assert build_config(yaml.safe_load(bare.to_yaml())).to_yaml() == bare.to_yaml()
    assert flatten(bare.model_dump(mode="json"))["method.mu"] == 1.0


@pytest.mark.parametrize("overrides", [[], ["method.name=fedprox", "model.name=resnet56", "data.dataset=cifar100"]])
def test_building_a_config_without_method_parameters_imports_no_torch(overrides):
    """The config is a leaf: names are checked against ``fltune.catalog``, not the packages behind them."""
    code = (
        "import sys, fltune.config as c\n"
        f"c.build_config({{}}, {overrides!r})\n"
        "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('fltune.methods', 'fltune.models',"
        " 'fltune.data')))\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_overrides_parse_yaml_values_and_create_sections():
    tree = apply_overrides({}, ["federation.rounds=3", "metrics.protocols=[global]", "data.root=null"])
    assert tree == {"federation": {"rounds": 3}, "metrics": {"protocols": ["global"]}, "data": {"root": None}}
    assert flatten({"a": {"b": 1, "c": {"d": 2}}}) == {"a.b": 1, "a.c.d": 2}


@pytest.mark.parametrize(("overrides", "message"), [
    (["method.name=nope"], "method.name: unknown method 'nope'; allowed:"),
    (["method.name=fedprx"], "method.name: unknown method 'fedprx'; did you mean fedprox or"),
    (["training.lrr=0.1"], "training.lrr: unknown field; did you mean training.lr?"),
    (["trainin.lr=0.1"], "trainin: unknown field; did you mean training?"),
    (["method.name=fedprox", "method.muu=0.1"], "method.muu: fedprox has no parameter 'muu'; did you mean mu?"),
    (["data.dataset=cifar"], "data.dataset: unknown dataset 'cifar'; did you mean cifar10 or cifar100?"),
    (["method.name=fedprox", "method.mu=-1"], "method.mu: Input should be greater than or equal to 0"),
    (["method.mu=0.1"], "method.mu: fedavg has no parameter 'mu'; allowed: none"),
    (["federation.fraction=1.5"], "federation.fraction: Input should be less than or equal to 1"),
    (["federation.roundz=3"], "federation.roundz: unknown field"),
    (["federation.rounds=abc"], "federation.rounds: Input should be a valid integer"),
    (["data.dataset=nope"], "data.dataset: unknown dataset 'nope'; allowed: fmnist"),
    (["partition.kind=nope"], "partition.kind: Input should be 'iid'"),
    (["partition.kind=classes", "partition.classes_per_client=11"], "partition.classes_per_client: 11 > the 10"),
    (["model.name=nope"], "model.name: unknown model 'nope'"),
    (["resources.workers=0"], "resources.workers: Input should be greater than or equal to 1"),
    (["training.nesterov=true", "training.momentum=0"], "training.nesterov: true needs training.optimizer sgd "
     "with training.momentum > 0"),
    (["training.nesterov=true", "training.optimizer=adam"], "training.nesterov: true needs training.optimizer sgd"),
    (["resources.compile=true"], "resources.compile: true needs resources.executor batched (it compiles that "
     "executor's group step), not exact"),
    (["metrics.hessian.probe_data=mine"], "metrics.hessian.probe_data: Input should be 'shared' or 'own'"),
])
def test_bad_values_give_one_line_naming_the_field(overrides, message):
    with pytest.raises(FLTuneError) as err:
        build_config(overrides=overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_malformed_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("federation:\n  rounds: [1, 2\n")
    with pytest.raises(FLTuneError, match=r"bad.yaml: malformed YAML at line \d+"):
        read_yaml(bad)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(FLTuneError, match="expected a mapping"):
        read_yaml(tmp_path / "list.yaml")


def alias_bomb(levels: int = 19) -> str:
    """Issue 74's file: nine values, each further level nine aliases of the one before, used once as a field."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"method: {{name: fedavg, extra: *a{levels - 1}}}", ""])


def test_an_alias_bomb_is_refused_in_one_line_by_run_and_tune(tmp_path, capsys):
    """9^19 values once expanded: refused as loaded, given as a run's config or a tune space; a file of five
    levels (9^4 leaves under each of two keys) still loads."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    for command in (["run", "--config"], ["tune", "--space"]):
        assert main([*command, str(bomb)]) == 2
        err = capsys.readouterr().err
        assert err == f"fltune: {bomb}: its YAML aliases expand to over 100,000 values; allowed: at most 100,000 " \
                      "(an alias nested in aliases multiplies)\n"
    (tmp_path / "ok.yaml").write_text(alias_bomb(4))
    assert len(read_yaml(tmp_path / "ok.yaml")["method"]["extra"]) == 9


def test_model_options_reach_the_builder_and_bad_ones_are_one_line() -> None:
    from types import SimpleNamespace

    from fltune.engine.builders import build_model_for
    from fltune.errors import FLTuneError

    data = SimpleNamespace(input_shape=(3, 32, 32), num_classes=10)
    small = build_model_for(build_config(overrides=["method.name=fedalign", "model.options={blocks: 1}"]), data)
    full = build_model_for(build_config(overrides=["method.name=fedalign"]), data)
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in full.parameters()) / 3
    with pytest.raises(FLTuneError, match=r"model.options: 'resnet56' does not take \['depth'\]"):
        build_model_for(build_config(overrides=["method.name=fedalign", "model.options={depth: 3}"]), data)
    with pytest.raises(FLTuneError, match=r"model.options.blocks: 'two' is not a valid int"):
        build_model_for(build_config(overrides=["method.name=fedalign", "model.options={blocks: two}"]), data)
    plain = build_config(overrides=["model.name=resnet18", "model.options.running_stats=false"])
    assert next(build_model_for(plain, data).buffers(), None) is None  # the string 'false' is False
    with pytest.raises(FLTuneError, match=r"model.options.running_stats: 'maybe' is not a valid bool"):
        build_model_for(build_config(overrides=["model.name=resnet18", "model.options.running_stats=maybe"]), data)


@pytest.mark.parametrize("override", ["training.lr=.inf", "training.grad_clip=.inf", "partition.alpha=1e400",
                                      "method.name=fedprox\nmethod.mu=.inf"])
def test_an_infinite_number_is_refused_where_a_bound_alone_would_let_it_through(override):
    """``gt=0`` admits inf: an infinite lr used to train a round and end as 'diverged' (exit 1), not bad input."""
    *_, last = override.split("\n")
    with pytest.raises(FLTuneError, match=rf"{re.escape(last.split('=')[0])}: Input should be a finite number"):
        build_config(overrides=override.split("\n"))
