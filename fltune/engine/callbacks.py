"""Round callbacks: how ``Federation.run`` hands each round to tracking (MLflow) and progress (rich). They consume
rounds and never step them; a Tune trial consumes its seeds' rounds through ``lockstep``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fltune.engine.federation import Federation


class Callback:
    """No-op base; override what you need. ``on_end`` runs on success, divergence, failure and Ctrl-C."""

    def on_start(self, fed: Federation) -> None:
        """Before the first remaining round."""

    def on_probe(self, fed: Federation, round_: int, probe: str) -> None:
        """As probe ``probe`` starts after round ``round_``: a slow one (a Hessian) is named, not a stuck bar."""

    def on_round(self, fed: Federation, metrics: dict[str, float]) -> None:
        """After each round, with that round's metrics."""

    def on_end(self, fed: Federation, summary: dict[str, Any]) -> None:
        """Once, with the final summary (``summary['status']``: finished, diverged, failed, killed)."""
