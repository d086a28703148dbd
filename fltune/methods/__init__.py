"""Method registry: ``@register`` on a Method subclass makes it available by name. Adding a method = one file here +
``search_spaces/<name>.yaml`` + a test pinning its loss; or, without a fork, a ``Method`` subclass named by reference
(``my_pkg.mod:Mine``) or as a plug-in (``fltune.plugins``), checked as ``register`` checks. ``@register_modifier`` adds
a loss term (MAN) any method takes on as ``<method>+<modifier>``, built on first use by :func:`get_method`."""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
import re
import sys
from functools import cache
from types import FunctionType

from fltune.errors import FLTuneError
from fltune.text import allowed
from fltune.methods.base import Method
from fltune.methods.compose import Modifier, compose
from fltune.plugins import EXPECTED, FIELDS, resolve, unknown

METHODS: dict[str, type[Method]] = {}
MODIFIERS: dict[str, type[Modifier]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: add a method under ``cls.name``."""
    if not cls.name or cls.name in METHODS:
        raise ValueError(f"method name {cls.name!r} is empty or registered twice")
    METHODS[cls.name] = cls
    return cls


def is_personalised(cls: type[Method]) -> bool:
    """Whether each client keeps weights of its own (a personal part or model, or its own scorer): the
    method overrides one of the base class's personal hooks, or its final round is its own update (Ditto)."""
    hooks = ("personal_keys", "personal_scorer")
    return cls.final_round == "own" or any(getattr(cls, h) is not getattr(Method, h) for h in hooks)


def paper(cls: type[Method] | type[Modifier]) -> str:
    """The citation a method's file opens with: the first parenthesis of its module docstring, less the
    pointers into docs/methods.md (every method is written out there, §2). A built-in's file is its name's;
    ``<base>+<modifier>`` cites both."""
    if "+" in cls.name:
        base, modifier = cls.name.rsplit("+", 1)
        return f"{paper(get_method(base))} + {paper(MODIFIERS[modifier])}"
    builtin = METHODS.get(cls.name) is cls or MODIFIERS.get(cls.name) is cls
    module = f"{__name__}.{cls.name}" if builtin else cls.__module__
    doc = getattr(sys.modules.get(module), "__doc__", None) or ""
    found = re.search(r"\(([^()]*)\)", " ".join(doc.split("\n\n")[0].split()))
    parts = [p.strip() for p in (found.group(1) if found else "").split(";")]
    return next((p for p in parts if p and not p.startswith("docs/")), "").replace("``", "`").rstrip(",:")


def register_modifier(cls: type[Modifier]) -> type[Modifier]:
    """Class decorator: add a modifier under ``cls.name``, usable as ``<method>+<name>``."""
    if not cls.name or "+" in cls.name or cls.name in MODIFIERS:
        raise ValueError(f"modifier name {cls.name!r} is empty, contains '+' or is registered twice")
    MODIFIERS[cls.name] = cls
    return cls


def _load_all() -> None:
    """Import every module in this package, running their ``@register``."""
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")


def get_method(name: str) -> type[Method]:
    """The class for ``name``, registered or ``<base>+<modifier>`` (chains allowed); else a user error naming
    the allowed ones."""
    if "+" in name:
        return _composite(name)
    if name in METHODS:
        return METHODS[name]
    found = resolve("method", name)
    if found is None:
        raise unknown("method", name, sorted(METHODS))
    return _checked(found, name)


def _checked(found: object, name: str) -> type[Method]:
    """A user's class, its hooks held to the signatures :class:`Method` declares."""
    if not (isinstance(found, type) and issubclass(found, Method)):
        what = f"{'class' if isinstance(found, type) else type(found).__name__} {getattr(found, '__qualname__', '')}"
        raise FLTuneError(f"{FIELDS['method']}: {name!r} is the {what.strip()}; expected {EXPECTED['method']}")
    if missing := _misfit_hook(found):
        raise FLTuneError(f"{FIELDS['method']}: {name!r}: {missing}")
    if gone := [hook for hook in REMOVED_HOOKS if hasattr(found, hook)]:
        raise FLTuneError(f"{FIELDS['method']}: {name!r}: {found.__qualname__}.{gone[0]} is no longer a hook, so it "
                          "would never be called; a client's weights are the global ones overridden by its "
                          "state['personal']")
    if slip := _near_miss(found):
        raise FLTuneError(f"{FIELDS['method']}: {name!r}: {slip}")
    return found


REMOVED_HOOKS = ("client_model_state", "local_model")
"""Hooks an earlier contract had: a user's method overriding one is refused, not silently left uncalled."""


def _near_miss(cls: type[Method]) -> str:
    """A name of the user's classes one slip away from a hook or setting of :class:`Method` (``locl_loss``,
    ``stored_model``), which the engine would never read: the method would train as FedAvg. "" when none."""
    known = sorted(name for name in {*dir(Method), *inspect.get_annotations(Method)} if not name.startswith("_"))
    for owner in cls.__mro__[:cls.__mro__.index(Method)]:
        if owner.__module__.startswith("fltune."):
            continue
        for name in (name for name in vars(owner) if not name.startswith("_") and name not in known):
            if close := difflib.get_close_matches(name, known, n=1, cutoff=0.85):
                return (f"{owner.__qualname__}.{name} is no hook or setting of fltune.Method, so it would never be "
                        f"read; did you mean {close[0]}?")
    return ""


def _misfit_hook(cls: type[Method]) -> str:
    """The first hook ``cls`` overrides with a signature the engine's call cannot bind (its arguments as
    :class:`Method` declares them), as the problem to tell; "" when every hook fits."""
    for hook, base in vars(Method).items():
        hooked = isinstance(base, (FunctionType, classmethod, staticmethod)) and not hook.startswith("_")
        if not hooked or inspect.getattr_static(cls, hook) is base or not callable(getattr(cls, hook)):
            continue
        expected = inspect.signature(getattr(Method, hook))
        try:
            inspect.signature(getattr(cls, hook)).bind(*expected.parameters)
        except TypeError:
            return (f"{cls.__qualname__}.{hook}{inspect.signature(getattr(cls, hook))} does not take the hook's "
                    f"arguments; expected {hook}{str(expected).replace(chr(39), '')}")
    return ""


@cache
def _composite(name: str) -> type[Method]:
    """Build ``<base>+<modifier>`` once per process, so every lookup returns the same class."""
    base, modifier = name.rsplit("+", 1)
    if modifier not in MODIFIERS:
        raise FLTuneError(
            f"method.name: unknown modifier {modifier!r} in {name!r}; {allowed(modifier, sorted(MODIFIERS))}"
        )
    return compose(get_method(base), MODIFIERS[modifier])


_load_all()
