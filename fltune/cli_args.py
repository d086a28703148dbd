"""Command-line flags that several commands share: the experiment's config sources (``run``, ``compare``),
a Tune job's checkpoint cadence (``tune``, ``reproduce``, ``compare``), the flags ``--resume`` ignores, and the
flags read into a job's typed options (``options_from``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

Options = TypeVar("Options")

SHORTCUTS: dict[str, tuple[str, type]] = {
    "method": ("method.name", str), "dataset": ("data.dataset", str), "data_root": ("data.root", str),
    "partition": ("partition.kind", str), "alpha": ("partition.alpha", float),
    "clients": ("federation.clients", int), "fraction": ("federation.fraction", float),
    "rounds": ("federation.rounds", int), "seed": ("federation.seed", int),
    "local_epochs": ("training.local_epochs", int), "batch_size": ("training.batch_size", int),
    "lr": ("training.lr", float), "model": ("model.name", str), "workers": ("resources.workers", int),
    "address": ("resources.address", str), "experiment": ("tracking.experiment", str),
}
"""CLI flag → config field; flags are only shortcuts for ``--set field=value``."""


def add_experiment_args(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """The config sources shared by run and compare (``skip``: shortcuts a command sets itself)."""
    parser.add_argument("--config", help="experiment YAML (same fields as --print-config shows)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override any config field by dotted path, e.g. --set method.mu=0.01 (repeatable)")
    add_shortcuts(parser, [name for name in SHORTCUTS if name not in skip])


def add_shortcuts(parser: argparse.ArgumentParser, names: list[str]) -> None:
    """The ``SHORTCUTS`` flags named, each ``--set`` of its field (``experiment_overrides``)."""
    for name in names:
        field, kind = SHORTCUTS[name]
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=f"= --set {field}=…")


def options_from(args: argparse.Namespace, kind: type[Options], **given: Any) -> Options:
    """A command's typed options (``kind``, a dataclass whose fields are named as its flags) from ``args``, with
    ``given`` in place of the flags that need reading (``--set`` with its shortcuts, lists, ``--confirm``)."""
    names = {field.name for field in fields(kind)} - set(given)
    values = {name: getattr(args, name) for name in names if hasattr(args, name)}
    return kind(**values, **given, ignored=ignored_on_resume(args) if args.resume else ())


def experiment_overrides(args: argparse.Namespace) -> list[str]:
    """The shortcut flags as ``--set`` overrides, placed before the ``--set`` ones, which take precedence."""
    flags = [f"{field}={getattr(args, name)}" for name, (field, _) in SHORTCUTS.items()
             if getattr(args, name, None) is not None]
    return flags + list(args.overrides)


def add_checkpoint_args(p: argparse.ArgumentParser, rounds_default: str, seconds_default: str) -> None:
    """The checkpoint cadence of a Tune job's trials (``trainable.Cadence``): tune, reproduce and compare."""
    p.add_argument("--checkpoint-every", type=int, metavar="ROUNDS",
                   help=f"checkpoint each trial every ROUNDS rounds, always at the end (default: {rounds_default})")
    p.add_argument("--checkpoint-seconds", type=float, metavar="S",
                   help=f"also checkpoint once S seconds have passed since the last one (default: {seconds_default})")


def keep_on_resume(p: argparse.ArgumentParser, *dests: str) -> None:
    """Mark the job-shaping flags of ``p``, which a resumed job ignores for its saved settings; their
    defaults are recorded to tell a flag the user set from one left alone."""
    p.set_defaults(kept_on_resume={dest: p.get_default(dest) for dest in dests})


def run_job(args: argparse.Namespace, options: Options, job: Callable[[Options], Any],
            plan: Callable[[Options], Any]) -> int:
    """A job command from its options, as the Python API runs it: ``--plan`` prints the plan; else the job runs."""
    return plan(options).print() if args.plan else job(options).run()


def ignored_on_resume(args: argparse.Namespace) -> tuple[str, ...]:
    """The job-shaping flags given to ``--resume``, which change nothing (``jobs.scaffold.note_ignored``)."""
    return tuple("--set" if dest == "overrides" else f"--{dest.replace('_', '-')}"
                 for dest, default in args.kept_on_resume.items() if getattr(args, dest) != default)
