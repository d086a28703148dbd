"""Headless PNG figures: a bare matplotlib ``Figure`` draws without a display, backend or ``plt.close`` (unlike
``pyplot``), imported at the first figure since workers and trials import the drawing modules but never draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def new_figure(**kwargs: Any) -> Figure:
    """``matplotlib.figure.Figure(**kwargs)``, importing matplotlib on first use."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def save_png(fig: Figure, path: str | Path, dpi: int) -> Path:
    """Write ``fig`` to ``path`` (parent folders made) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def is_accuracy(metric: str) -> bool:
    """Whether ``metric`` is an accuracy (``acc_*``, ``val_acc_*``, ``best_acc``): plotted in percent, as
    the papers print them."""
    return "acc" in metric.split("_")


def percent(metric: str, value: float) -> float:
    """``value`` of ``metric`` as plotted: an accuracy in [0, 1] as percent, anything else as is."""
    return 100 * value if is_accuracy(metric) else value


def axis_label(metric: str) -> str:
    return f"{metric} (%)" if is_accuracy(metric) else metric


def round_axis(ax: Any) -> None:
    """An x axis of federated rounds: labelled so, ticks on whole rounds only."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
