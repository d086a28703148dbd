"""A command's flags are the fields of its typed options: each field declared with ``flag`` is a flag (its help,
type, default and spelling), a keyword of the command's Python function (``fltune.api``) and a setting that
``--resume`` ignores unless ``honoured``. ``add_flags`` builds a command's parser from its options, ``options_from``
reads them back; ``ExperimentOptions`` are the experiment's config sources that ``run`` and ``compare`` share."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, get_args, get_type_hints

from fltune.errors import FLTuneError

if TYPE_CHECKING:
    from fltune.compare.command import Comparison
    from fltune.estimate import Plan
    from fltune.jobs.scaffold import TuneJob

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

RAY_ADDRESS = "join a running Ray cluster ('auto', host:port; default: $RAY_ADDRESS or local)"
JOB_STORAGE = "job folder root, local or a URI (default: ./studies)"


def flag(help: str, default: Any = None, *, metavar: str | None = None, read: Callable[[Any], Any] | None = None,
         honoured: bool = False) -> Any:
    """A field of a command's options that is its flag ``--NAME`` (a positional argument when it has no default)
    and its function's keyword. ``read``: what turns the flag's text or the keyword's value into the field's
    (``JobOptions``); ``honoured``: a flag that finds or places the job, which ``--resume`` honours."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "read": read, "honoured": honoured})


def set_flag(help: str) -> Any:
    """``--set FIELD=VALUE`` (repeatable), the field ``overrides``: the keyword ``set``, a mapping or texts."""
    return flag(help, (), read=set_texts)


def every_flag(default: str) -> Any:
    """``--checkpoint-every``, a Tune job's checkpoint cadence in rounds (``trainable.Cadence``)."""
    return flag(f"checkpoint each trial every ROUNDS rounds, always at the end (default: {default})", metavar="ROUNDS")


def seconds_flag(default: str) -> Any:
    """``--checkpoint-seconds``, a Tune job's checkpoint cadence in seconds (``trainable.Cadence``)."""
    return flag(f"also checkpoint once S seconds have passed since the last one (default: {default})", metavar="S")


def set_texts(sets: Mapping[str, Any] | Sequence[str] | None) -> tuple[str, ...]:
    """``--set``'s texts, or ``set=`` given as a mapping ``{"federation.rounds": 2}`` or ``field=value`` texts."""
    if sets is None:
        return ()
    if isinstance(sets, str):
        raise FLTuneError(f"set: {sets!r} is one text; allowed: a mapping {{'field': value}} or a list of "
                          "'field=value' texts")
    return tuple(f"{key}={value}" for key, value in sets.items()) if isinstance(sets, Mapping) else tuple(sets)


def path_text(path: str | Path | None) -> str | None:
    """A path given as text or as a ``Path``, as text."""
    return None if path is None else str(path)


@dataclass(frozen=True, kw_only=True)
class ExperimentOptions:
    """The experiment's config sources, as ``run`` and ``compare`` take them: ``--config`` YAML < shortcut flags
    (``shortcuts``, each ``--set`` of its field) < ``--set``."""

    shortcuts: ClassVar[tuple[str, ...]] = tuple(SHORTCUTS)
    config: str | None = flag("experiment YAML (same fields as --print-config shows)", read=path_text)
    overrides: tuple[str, ...] = set_flag("override any config field by dotted path, e.g. --set method.mu=0.01 "
                                          "(repeatable)")

    def tree(self) -> dict[str, Any]:
        """The experiment these sources say, not yet validated."""
        from fltune.config import apply_overrides, read_yaml

        return apply_overrides(read_yaml(self.config) if self.config else {}, list(self.overrides))


def check_data_here(tree: dict[str, Any]) -> None:
    """A dataset that is nowhere is one line before torch or Ray load (``locations.check_here``); data settings
    that do not validate are said where the job validates its experiment."""
    from fltune.config import DataConfig
    from fltune.data.locations import check_here

    try:
        data = DataConfig.model_validate(tree.get("data", {}))
    except ValueError:
        return
    check_here(data.dataset, data.root, data.download)


class JobCommand(Protocol):
    """A job command's options as ``fltune.api`` and ``cli.cmd_job`` run them: ``checked`` before Ray or torch load
    (a bad file or a missing dataset is one line), then the plan ``--plan`` prints, or the job, run to its exit
    status."""

    shortcuts: ClassVar[tuple[str, ...]]
    """The config shortcut flags (``SHORTCUTS``) the command takes after ``--set``."""
    plan: bool

    def checked(self) -> JobCommand: ...

    def planned(self) -> Plan: ...

    def job(self) -> TuneJob | Comparison: ...


def spelling(option: Field) -> str:
    """The field's flag and keyword: its name, ``set`` for ``overrides``."""
    return "set" if option.name == "overrides" else option.name


def flag_fields(kind: type) -> list[Field]:
    """The fields of ``kind`` declared with ``flag``, in the order its classes declare them, the most derived class
    first: its flags' order in ``--help``."""
    every = {option.name: option for option in fields(kind)}
    names = dict.fromkeys(name for cls in kind.__mro__ for name in vars(cls).get("__annotations__", {}))
    return [every[name] for name in names if name in every and "help" in every[name].metadata]


def add_flags(parser: argparse.ArgumentParser, kind: type) -> None:
    """``kind``'s flags on ``parser``, its ``shortcuts`` after ``--set``; the settings ``--resume`` ignores kept with
    their defaults (``options_from``) and ``kind`` as the options the command reads (``options_from``). A
    shortcut that fills a field of ``kind`` (``compare --address``) is honoured by ``--resume``, as the field is."""
    hints, names, kept = get_type_hints(kind), {option.name for option in fields(kind)}, {}
    for option in flag_fields(kind):
        meta, flag_name = option.metadata, f"--{spelling(option).replace('_', '-')}"
        if option.default is MISSING:
            action = parser.add_argument(option.name, help=meta["help"])
        elif hints[option.name] is bool:
            action = parser.add_argument(flag_name, dest=option.name, action="store_true", help=meta["help"])
        elif option.name == "overrides":
            action = parser.add_argument(flag_name, dest="overrides", action="append", default=[],
                                         metavar="FIELD=VALUE", help=meta["help"])
        else:
            kinds = [k for k in get_args(hints[option.name]) or (hints[option.name],) if k in (int, float)]
            action = parser.add_argument(flag_name, dest=option.name, default=option.default, metavar=meta["metavar"],
                                         help=meta["help"], **({"type": kinds[0]} if kinds else {}))
        if not meta["honoured"]:
            kept[option.name] = (flag_name, action.default)
        for name in kind.shortcuts if option.name == "overrides" else ():
            config_field, shortcut_type = SHORTCUTS[name]
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=shortcut_type,
                                help=f"= --set {config_field}=…")
            if name not in names:
                kept[name] = (f"--{name.replace('_', '-')}", None)
    parser.set_defaults(options=kind, kept_on_resume=kept)


def options_from(args: argparse.Namespace) -> JobCommand:
    """The command's typed options (``add_flags``) from ``args``: the shortcut flags then ``--set`` as its
    ``overrides``; with ``--resume``, the job-shaping flags given, which change nothing (``JobOptions.ignored``)."""
    names = {option.name for option in fields(args.options)}
    given = {name: value for name, value in vars(args).items() if name in names}
    ignored = tuple(flag_name for dest, (flag_name, default) in args.kept_on_resume.items()
                    if getattr(args, dest) != default)
    return args.options(**{**given, "overrides": experiment_overrides(args), "ignored": ignored if args.resume else ()})


def experiment_overrides(args: argparse.Namespace) -> list[str]:
    """The shortcut flags as ``--set`` overrides, placed before the ``--set`` ones, which take precedence."""
    flags = [f"{SHORTCUTS[name][0]}={getattr(args, name)}" for name in args.options.shortcuts
             if getattr(args, name) is not None]
    return flags + list(args.overrides)
