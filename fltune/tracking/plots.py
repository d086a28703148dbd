"""PNG figures logged as MLflow artifacts (drawn headless by :mod:`fltune.metrics.figures`)."""

from __future__ import annotations

from pathlib import Path

from fltune.metrics.evaluation import ACCURACY_KEYS
from fltune.metrics.figures import new_figure, save_png


def curves_png(history: list[dict[str, float]], path: str | Path, title: str) -> Path:
    """Accuracy under each protocol and train/test loss against the round."""
    fig = new_figure(figsize=(10, 4))
    acc_ax, loss_ax = fig.subplots(1, 2)
    for key in ACCURACY_KEYS:
        points = [(row["round"], row[key]) for row in history if key in row]
        if points:
            acc_ax.plot(*zip(*points), marker=".", label=key.removeprefix("acc_"))
    for key in ("train_loss", "loss"):
        points = [(row["round"], row[key]) for row in history if key in row]
        if points:
            loss_ax.plot(*zip(*points), marker=".", label=key)
    acc_ax.set(xlabel="round", ylabel="accuracy", title="accuracy")
    loss_ax.set(xlabel="round", ylabel="loss", title="loss")
    for ax in (acc_ax, loss_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, path, dpi=100)
