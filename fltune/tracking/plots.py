"""PNG figures logged as MLflow artifacts (drawn headless by :mod:`fltune.metrics.figures`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fltune.metrics.evaluation import ACCURACY_KEYS
from fltune.metrics.figures import new_figure, round_axis

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LOSSES = {"train_loss": "train: clients' local objective", "loss": "test: global model's cross-entropy"}
"""A run's loss curves and what each is (a method's local loss may add terms, e.g. FedProx's proximal term)."""


def warm_up() -> None:
    """Import matplotlib and its Agg canvas while the rounds train, so the final curves do not wait for it."""
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401


def curves_figure(history: list[dict[str, float]], title: str) -> Figure:
    """Accuracy (%) under each protocol and the train/test losses against the round."""
    fig = new_figure(figsize=(10, 4))
    acc_ax, loss_ax = fig.subplots(1, 2)
    curves = [(acc_ax, key, 100, key.removeprefix("acc_")) for key in ACCURACY_KEYS]
    for ax, key, scale, label in curves + [(loss_ax, key, 1, label) for key, label in LOSSES.items()]:
        points = [(row["round"], scale * row[key]) for row in history if key in row]
        if points:
            ax.plot(*zip(*points), marker=".", label=label)
    acc_ax.set(ylabel="accuracy (%)", title="accuracy by evaluation protocol")
    loss_ax.set(ylabel="loss", title="loss")
    for ax in (acc_ax, loss_ax):
        round_axis(ax)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig
