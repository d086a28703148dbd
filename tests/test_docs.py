"""The docs against the code: docs/adding-a-method.md shows FedProx's files as they ship, docs/methods.md
writes out every registered method, the generated regions (docs/generate.py) are current, every
command's --help ends with examples that parse, and every README command runs as written."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

from fltune.cli import EXAMPLES, build_parser
from fltune.methods import METHODS, get_method
from tests.plugin_helpers import SMOOTH

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "adding-a-method.md").read_text()


def block_after(caption: str, language: str) -> str:
    """The guide's first ``language`` code block after ``caption``."""
    found = re.search(re.escape(caption) + r".*?```" + language + r"\n(.*?)```", GUIDE, re.S)
    assert found, caption
    return found.group(1)


def test_the_guides_method_file_is_fedprox_as_shipped() -> None:
    assert block_after("`fltune/methods/fedprox.py`:", "python") == (ROOT / "fltune/methods/fedprox.py").read_text()


def test_the_guides_search_space_is_fedprox_as_shipped() -> None:
    assert block_after("`search_spaces/fedprox.yaml` says", "yaml") == (ROOT / "fltune/search_spaces/fedprox.yaml").read_text()


def test_the_guides_tests_are_in_fedprox_tests() -> None:
    """The guide shows two of the tests: each is in the test file, word for word."""
    shown = block_after("`tests/methods/test_fedprox.py` computes", "python")
    tests = re.findall(r"^def test_.*?(?=^def |\Z)", shown, re.S | re.M)
    shipped = (ROOT / "tests/methods/test_fedprox.py").read_text()
    assert len(tests) == 2 and all(test.strip() in shipped for test in tests)


def test_the_guides_method_of_your_own_is_the_one_the_tests_run() -> None:
    assert block_after("`smooth.py`, FedAvg with label smoothing:", "python") == SMOOTH


def test_every_registered_method_is_written_out_in_methods_md() -> None:
    """§2 of docs/methods.md gives each method's equation, defaults and [U] choices, under its `name`."""
    text = (ROOT / "docs" / "methods.md").read_text()
    methods = text[text.index("## 2. Methods"):text.index("## 3. ")]
    assert [name for name in sorted(METHODS) if f"`{name}`" not in methods] == []


# ---------------------------------------------------------------------------------------------- generated regions
def generator() -> ModuleType:
    """``docs/generate.py``, which lives outside the package (only the docs need it)."""
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_regions_match_the_code() -> None:
    """The methods table, the papers and tables lists and the configuration reference are the code's."""
    stale = generator().stale_regions(write=False)
    assert stale == [], f"stale generated regions {stale}: run `python docs/generate.py`"


def test_a_stale_region_is_found_and_rewritten() -> None:
    gen = generator()
    text = "intro\n<!-- generated:methods -->\n| old table |\n<!-- /generated:methods -->\nend\n"
    new, stale = gen.regenerate(text, "x.md", {})
    assert stale == ["methods"] and "| `fedprox` |" in new and new.startswith("intro\n") and new.endswith("end\n")
    assert gen.regenerate(new, "x.md", {})[1] == []


def test_every_region_the_generator_knows_is_in_the_docs() -> None:
    gen = generator()
    found = {m["name"] for path in gen.documents() for m in gen.REGION.finditer(path.read_text())}
    assert found == set(gen.GENERATORS)


def test_every_config_field_is_described() -> None:
    """docs/configuration.md is generated from the schema: a field without ``description=`` would be a blank."""
    from fltune.config import ExperimentConfig

    todo, blank = [("", ExperimentConfig)], []
    while todo:
        prefix, model = todo.pop()
        for name, info in model.model_fields.items():
            if hasattr(info.annotation, "model_fields"):
                todo.append((f"{prefix}{name}.", info.annotation))
            elif not info.description:
                blank.append(f"{prefix}{name}")
    assert blank == []


def test_readme_and_architecture_stay_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    assert len((ROOT / "docs" / "architecture.md").read_text().splitlines()) <= 300


# ---------------------------------------------------------------------------------------------- --help examples
def test_every_commands_help_ends_with_examples_that_parse() -> None:
    """Each command's epilog shows real commands: every one parses with the real parser."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(EXAMPLES) == set(commands)
    for name, sub in commands.items():
        assert sub.format_help().rstrip().endswith(EXAMPLES[name].rstrip())
        lines = commands_in(EXAMPLES[name])
        assert len(lines) >= 2 and all(line.startswith("fltune ") for line in lines), name
        for line in lines:
            parser.parse_args(shlex.split(line)[1:])  # SystemExit on a flag that does not exist


# ---------------------------------------------------------------------------------------------- README commands
def commands_in(text: str) -> list[str]:
    """The command lines of a shell snippet, ``\\`` continuations joined."""
    return [line.strip() for line in text.replace("\\\n", " ").splitlines() if line.strip()
            and not line.strip().endswith(":")]


def readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return [c for block in re.findall(r"```bash\n(.*?)```", readme, re.S) for c in commands_in(block)]


TEST_COMMANDS = ["python -m pytest -q", "python -m pytest -q -m extended"]
"""The README's suite and its extended tier, which CI runs in this order."""


def as_run(command: str) -> str | None:
    """What the README test runs for one README command: short ones as written, long ones with ``--plan``
    (a job's whole check, then its plan: nothing trained), the fast loop collected only; None: checked
    otherwise (install lines and the test command: CI runs them; ``mlflow ui``: a server, so only that it
    is installed)."""
    if command.startswith(("apt-get", "pip ")) or command in TEST_COMMANDS:  # the test commands: .ci/run's, below
        return None
    if command.startswith("mlflow ui"):
        assert shutil.which("mlflow"), "mlflow is not on PATH"
        return None
    if command.startswith("ray job submit"):
        assert shutil.which("ray"), "ray is not on PATH"
        command = command.split(" -- ", 1)[1].strip()
    if "-m pytest" in command:
        return command + " --collect-only -q"
    long = re.match(r"(fltune|python cli\.py) (run|tune|reproduce|compare)\b", command)
    return command + " --plan" if long else command


def test_the_readmes_test_commands_are_the_ones_ci_runs() -> None:
    assert all(command in readme_commands() for command in TEST_COMMANDS)
    assert [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line] == TEST_COMMANDS


@pytest.mark.slow
def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    """Each fenced command of the README, run in a fresh folder holding what the README refers to (cli.py,
    its YAML example; ``search_spaces/…`` names the shipped spaces), exits 0. Two at a time, each with its own MLflow store and
    cache: a command is one mostly single-threaded process, and the machine has two cores."""
    assert shutil.which("fltune"), "fltune is not on PATH: pip install -e ."
    readme = (ROOT / "README.md").read_text()
    for name, body in re.findall(r"`([\w.]+\.yaml)`:\n\n```yaml\n(.*?)```", readme, re.S):
        (tmp_path / name).write_text(body)
    (tmp_path / "cli.py").symlink_to(ROOT / "cli.py")
    ran = [shell for shell in map(as_run, readme_commands()) if shell is not None]

    def outcome(numbered: tuple[int, str]) -> tuple[str, subprocess.CompletedProcess]:
        number, shell = numbered
        own = tmp_path / f"command{number}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "FLTUNE_CACHE": str(own / "cache"), "MLFLOW_TRACKING_URI": f"sqlite:///{own}/mlflow.db"}
        own.mkdir()
        where = {"cwd": ROOT} if "-m pytest" in shell else {"cwd": tmp_path, "executable": "/bin/bash"}
        return shell, subprocess.run(shell, shell=True, env=env, capture_output=True, text=True, timeout=600,
                                     **where)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for shell, done in pool.map(outcome, enumerate(ran)):
            assert done.returncode == 0, f"{shell}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert any(c.startswith("fltune run --method fedavg") for c in ran) and len(ran) >= 8, ran


@pytest.mark.parametrize("executor", ["exact", "batched"])
def test_the_guides_user_fedprox_and_ditto_step_as_the_built_ins(executor: str) -> None:
    """docs/examples' FedProx and Ditto, named by reference as a user would, take the built-ins' steps to the bit on
    the exact path (client by client; Ditto's personal model too) and within float rounding batched (padded)."""
    import torch

    from fltune.engine.functional import client_backward, functional_gradient, local_step
    from fltune.methods.objective import Batch, Forward
    from tests.methods.helpers import make_ctx, tiny_batch, tiny_model
    from tests.methods.local_helpers import move_away

    cases = [("fedprox.py:FedProx", "fedprox", {"mu": 0.3}), ("ditto.py:Ditto", "ditto", {"lam": 0.3})]
    for file, built_in, params in cases:
        steps = []
        for cls in (get_method(str(ROOT / "docs" / "examples" / file)), get_method(built_in)):
            model = tiny_model()
            global_state = move_away(model)
            method = cls(cls.Params(**params))
            ctx = make_ctx(model, global_state=global_state)
            method.setup_client(ctx)
            x, y = tiny_batch()
            if executor == "exact":
                client_backward(method)(ctx, x, y)
                grads = {n: p.grad for n, p in model.named_parameters()}
                steps.append((grads, {k: v.clone() for k, v in ctx.inputs.get("personal", {}).items()}))
                continue
            pad = [torch.cat([t, t.new_zeros(2, *t.shape[1:])]) for t in (x, y, torch.ones(len(y)))]
            weights = {n: p.detach() for n, p in model.named_parameters()}
            out = local_step(method, Batch(Forward(model), weights, *pad, ctx.inputs, global_weights=global_state,
                                           trainable=tuple(weights), lr=ctx.lr, gradient=functional_gradient))
            steps.append((out.grads, out.kept.get("personal", {})))
        (mine, my_v), (theirs, their_v) = steps
        same = torch.equal if executor == "exact" else lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-7)
        assert mine.keys() == theirs.keys() and all(same(mine[n], theirs[n]) for n in mine), file
        assert my_v.keys() == their_v.keys() and all(same(my_v[n], their_v[n]) for n in my_v), file
    assert len((ROOT / "docs/examples/fedprox.py").read_text().splitlines()) <= 15
    assert len((ROOT / "docs/examples/ditto.py").read_text().splitlines()) <= 60


@pytest.mark.parametrize("file", ["fedprox.py", "ditto.py"])
def test_the_guides_user_methods_are_the_examples_run_above(file: str) -> None:
    assert block_after(f"(`docs/examples/{file}`", "python") == (ROOT / "docs" / "examples" / file).read_text()
