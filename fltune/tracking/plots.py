"""PNG figures logged as MLflow artifacts (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fltune.metrics.evaluation import ACCURACY_KEYS  # noqa: E402


def curves_png(history: list[dict[str, float]], path: str | Path, title: str) -> Path:
    """Accuracy under each protocol and train/test loss against the round."""
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 4))
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
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
