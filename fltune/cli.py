"""Command line: ``python cli.py run | methods | tune | tables | reproduce | compare | sync``.

Precedence: ``--config`` YAML < shortcut flags (``--rounds 3``) < ``--set a.b=c``. Exit status, each with one
line on stderr: user error 2, diverged run 1, a Tune job with a failed trial or cell 1 (the line names them), an
error in the user's own code 1 (the line names their file:line), Ctrl-C 130, SIGTERM 143, failed write 74
(``errors.WriteFailed``), results written but tracking calls the server did not take kept on disk 75 (``fltune
sync`` sends them).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.table import Table

from fltune.cli_args import ExperimentOptions, add_flags, experiment_overrides, options_from
from fltune.compare.command import CompareOptions
from fltune.errors import FLTuneError, WriteFailed
from fltune.folders import failed_write, make_out, said
from fltune.plugins import origin, plugins, user_fault
from fltune.process import (
    exit_now, forget_stops, handle_stop_signals, interrupted, quiet_libraries, stop_status,
)
from fltune.reproduce.command import ReproduceOptions, cmd_tables
from fltune.text import invoked_as
from fltune.tracking import backlog
from fltune.tune.command import StudyRequest


# ---------------------------------------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    from fltune.config import build_config

    no_mlflow = ["tracking.enabled=false"] if args.no_mlflow else []  # a --set of the user's still wins
    sources = ExperimentOptions(config=args.config, overrides=(*no_mlflow, *experiment_overrides(args)))
    cfg = build_config(sources.tree())
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    from fltune.api import run

    if args.plan:
        return run(cfg, plan=True).print()
    if args.json_out:  # written once the run ends: its folder made now, and no folder at the path itself
        if Path(args.json_out).is_dir():
            raise FLTuneError(f"--json-out {args.json_out}: is a folder; allowed: a file path")
        make_out(str(Path(args.json_out).resolve().parent), "--json-out")
    summary = run(cfg).metrics
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")
    if summary["status"] == "diverged":
        print(f"fltune: diverged at round {summary['diverged_round']} (loss or weights became NaN/inf)",
              file=sys.stderr)
        return 1
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    """A job command (tune, reproduce, compare) or its plan, its flags run as its Python function runs them."""
    options = options_from(args).checked()
    return options.planned().print() if options.plan else options.job().run()


# ---------------------------------------------------------------------------------------------- methods
def cmd_methods(args: argparse.Namespace) -> int:
    from fltune.methods import METHODS, get_method
    from fltune.methods.base import params_table
    from fltune.tracking.progress import listing

    if args.method:
        listing.print(method_card(get_method(args.method)), highlight=False)
        return 0
    table = Table(title="registered methods", show_lines=True)
    for column in ("method", "from", "summary", "parameters (default)"):
        table.add_column(column)
    found = {**{name: (cls, "fltune") for name, cls in METHODS.items()},
             **{name: (get_method(name), origin("method", name)) for name in plugins("method") if name not in METHODS}}
    for name, (cls, where) in sorted(found.items()):
        params = "\n".join(f"{p} = {d!r}  {desc}" for p, _, d, desc in params_table(cls)) or "—"
        table.add_row(name, where, (cls.__doc__ or "").strip().splitlines()[0], params)
    listing.print(table)
    return 0


def method_card(cls: type) -> str:
    """One method as ``fltune methods NAME`` shows it: what it is, its paper, its parameters with their defaults,
    what it costs (FedAlign Table 5's models held and passes per step) and how it runs."""
    from fltune.methods import is_personalised, paper
    from fltune.methods.base import params_table

    params = [f"  {name} = {default!r} ({kind})  {about}" for name, kind, default, about in params_table(cls)]
    method = cls()  # at its default parameters: a method may derive its costs from them (GradAug's passes)
    declared = hasattr(method, "stored_models") and hasattr(method, "passes_per_step")
    about = " ".join((cls.__doc__ or "").split())  # a user's class may have no docstring: no empty paragraph
    return "\n".join([
        f"{cls.name} — {paper(cls) or 'no paper named'}", "", *([about, ""] if about else []),
        "parameters (default):", *(params or ["  none"]),
        f"cost: {method.stored_models:g} model-sized tensor(s) held by a training client, "
        f"{method.passes_per_step:g} forward+backward pass(es) per local step" if declared else
        "cost: not declared (stored_models, passes_per_step); the figures resting on them are left out",
        f"personalised: {'yes' if is_personalised(cls) else 'no'}; batched executor: {_batched(cls)}",
    ])


def _batched(cls: type) -> str:
    """Whether the batched executor batches the method on its default model (built at CIFAR's shape to look)."""
    from fltune.engine.batched import batch_statistics
    from fltune.engine.functional import batchable
    from fltune.models.registry import build_model

    if not batchable(cls):
        return "client by client"
    if cls.default_model is None:
        return "yes (on a model without BatchNorm)"
    if batch_statistics(build_model(cls.default_model, (3, 32, 32), 10)):
        return f"client by client on its {cls.default_model} (BatchNorm); yes on a model without"
    return f"yes (its {cls.default_model} has no BatchNorm)"


# ---------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=invoked_as(), description="fltune: run, tune and compare FL methods.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = command(sub, "run", cmd_run, "one federated run, tracked in MLflow")
    add_flags(run, ExperimentOptions)
    run.add_argument("--json-out", help="write the final metrics as JSON here")
    run.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    run.add_argument("--plan", action="store_true",
                     help="print the run, its client-samples and an estimated wall time; run nothing")
    run.add_argument("--no-mlflow", action="store_true", help="= --set tracking.enabled=false")
    methods = command(sub, "methods", cmd_methods, "registered methods with their parameters and paper defaults")
    methods.add_argument("method", nargs="?", help="show this method's card: its paper, parameters and costs")
    add_flags(command(sub, "tune", cmd_job, "hyperparameter study of one method (Ray Tune + Optuna, tracked in "
                                            "MLflow)"), StudyRequest)
    command(sub, "tables", cmd_tables, "paper tables that `reproduce` can re-run, with their sources and data")
    add_flags(command(sub, "reproduce", cmd_job, "re-run a paper table (Ray Tune trials) beside the paper's numbers"),
              ReproduceOptions)
    add_flags(command(sub, "compare", cmd_job, "compare methods on one setting: same split and sampling, seeds, "
                                               "optional tuning on a validation split (Ray Tune trials)"),
              CompareOptions)
    sync = command(sub, "sync", lambda args: backlog.sync(args.path, args.uri),
                   "send the tracking a command kept on disk while its server was away")
    sync.add_argument("path", help="a job's folder, a tracking-backlog folder or one backlog file")
    sync.add_argument("--uri", help="send to this tracking store instead of the one each backlog was kept for")
    return parser


EXAMPLES: dict[str, str] = {
    "run": """examples:
  fltune run --method fedavg --dataset fmnist --partition dirichlet_prior --alpha 0.5 --clients 100 \\
      --fraction 0.1 --rounds 10 --local-epochs 5 --seed 0 --json-out out.json
  fltune run --method fedprox --set method.mu=0.01 --rounds 20 --plan
  fltune run --method ditto --set partition.eval_fraction=0.3 --no-mlflow
""",
    "methods": """examples:
  fltune methods
  fltune methods fedprox
  fltune run --method scaffold --print-config
""",
    "tune": """examples:
  fltune tune --space search_spaces/fedprox.yaml
  fltune tune --space search_spaces/fedprox.yaml --num-samples 8 --seeds 2 --set federation.rounds=20
  fltune tune --space search_spaces/fedprox.yaml --resume
""",
    "tables": """examples:
  fltune tables
  fltune reproduce table2 --datasets fmnist --scale quick --plan
""",
    "reproduce": """examples:
  fltune reproduce table2 --datasets fmnist --scale quick
  fltune reproduce table2 --scale paper --seeds 3 --plan
  fltune reproduce table2 --resume
""",
    "compare": """examples:
  fltune compare --methods fedavg,fedprox,scaffold --dataset fmnist --rounds 50 --seeds 3
  fltune compare --methods fedavg,fedprox --tune-budget 12 --seeds 3 --plan
  fltune compare --methods fedavg,fedprox --resume
""",
    "sync": """examples:
  fltune sync mlruns/tracking-backlog
  fltune sync studies/fedprox-mu
  fltune sync studies/fedprox-mu --uri http://mlflow.internal:5000
""",
}
"""Command name → the text after its ``--help`` (used with ``argparse.RawDescriptionHelpFormatter``)."""


def command(sub: argparse._SubParsersAction, name: str, runs: Callable[[argparse.Namespace], int],
            summary: str) -> argparse.ArgumentParser:
    """The parser of the command ``name``, which ``runs`` runs, its ``--help`` ending with its ``EXAMPLES``."""
    parser = sub.add_parser(name, help=summary, epilog=EXAMPLES[name],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(runs=runs, parser=parser)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; an unknown flag is refused with its command's usage, not the top-level one."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command to its exit status (the module's docstring lists them), each error one line on stderr."""
    args = parse(build_parser(), argv)
    quiet_libraries()
    forget_stops()
    handle_stop_signals()
    try:
        code = backlog.outcome(args.runs(args))
    except FLTuneError as err:
        print(f"fltune: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # a write that failed (a full disk): a job's line says how to continue it
        if (failed := failed_write(err)) is not None:
            print(f"fltune: {said(failed)}", file=sys.stderr, flush=True)
            return WriteFailed.STATUS
        if (fault := user_fault(err)) is None:  # the user's own code: their file:line, no traceback
            raise
        print(f"fltune: {fault}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"fltune: {interrupted()}", file=sys.stderr)  # nothing to continue (a job says its resume line)
        return stop_status()
    return stop_status() if code == 130 else code  # a stopped Tune job said its resume line, returned 130


def entry() -> int:
    """The ``fltune`` command: :func:`main`, then end at once where it started a local Ray
    (``process.exit_now``); elsewhere ``gc.freeze`` spares the exit collection (atexit handlers still run).
    Not in :func:`main`, which tests call in-process."""
    code = main()
    exit_now(code)
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(entry())
