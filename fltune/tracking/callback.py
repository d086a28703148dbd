"""The engine → MLflow bridge of ``fltune run``: one MLflow run per federation, curves per round. Every MLflow call
runs in order on a writer thread (:class:`BackgroundWriter`), overlapping the training (MLflow's import and sqlite
writes cost seconds); ``on_end`` waits for all of it, so the run ends with its status before the command exits."""

from __future__ import annotations

import queue
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fltune.config import ExperimentConfig
from fltune.engine.callbacks import Callback
from fltune.metrics.evaluation import ACCURACY_KEYS
from fltune.metrics.figures import new_figure, round_axis, save_png

MODEL = "model"
"""The run's artifact folder of its final weights (``engine.builders.MODEL_FILES``)."""

if TYPE_CHECKING:
    from collections.abc import Callable

    from matplotlib.figure import Figure

    from fltune.engine.federation import Federation
    from fltune.tracking.mlflow_log import Tracker


_STOP = object()


class BackgroundWriter:
    """Runs submitted calls one after another on a daemon thread (a stuck store cannot keep the
    process alive once the main thread has gone)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="fltune-tracking", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> None:
        """Queue ``call(*args)``; raise the error of an earlier call instead, if one failed."""
        self.check()
        self._queue.put((call, args))

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Wait until every queued call has run, stop the thread, raise the first error."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self.check()

    def _serve(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            if self._error is None:
                call, args = item
                try:
                    call(*args)
                except BaseException as err:  # re-raised in the main thread by check / close
                    self._error = err


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


class MLflowCallback(Callback):
    """Params + tags at the start, metrics with ``step=round`` each round, the summary's own figures, the
    PNGs and the final weights (``model/``) at the end, or a failure's error."""

    def __init__(self, cfg: ExperimentConfig, tracker: Tracker | None = None) -> None:
        self.cfg = cfg
        self.tracker = tracker
        self.run_id: str | None = None
        self.costs: dict[str, float] = {}
        self.writer = BackgroundWriter()
        self.writer.submit(self._open)

    def _open(self) -> None:
        from fltune.tracking.mlflow_log import Tracker  # imports MLflow: on the writer thread

        if self.tracker is None:
            self.tracker = Tracker(self.cfg.tracking)

    def on_start(self, fed: Federation) -> None:
        self.writer.submit(self._start, fed.static_costs)  # on the writer: a worker counts the FLOPs
        self.writer.submit(warm_up)  # the end's curves then draw without importing matplotlib

    def _start(self, static_costs: Callable[[], dict[str, float]]) -> None:
        from fltune.tracking.mlflow_log import run_name, run_tags

        assert self.tracker is not None
        self.run_id = self.tracker.start(run_name(self.cfg), run_tags(self.cfg))
        self.tracker.log_config(self.run_id, self.cfg)
        self.costs = static_costs()

    def on_round(self, fed: Federation, metrics: dict[str, float]) -> None:
        self.writer.submit(lambda row: self.tracker.log_round(self.run_id, row), dict(metrics))

    def on_end(self, fed: Federation, summary: dict[str, Any]) -> None:
        """Queue the summary, curves and figures and the run's end, then wait for the writer."""
        try:
            self.writer.submit(self._end, fed, dict(summary), list(fed.history), list(fed.artifacts))
        finally:
            self.writer.close()
        if self.run_id is not None:
            summary["mlflow_run_id"] = self.run_id

    def _end(self, fed: Federation, summary: dict[str, Any], history: list[dict[str, float]],
             artifacts: list[Path]) -> None:
        """The run's end on the writer thread, while ``on_end`` waits: ``fed`` is still open."""
        from fltune.tracking.mlflow_log import run_name

        if self.run_id is None or self.tracker is None:
            return
        # the constants (step 0) last: MLflow's compare view plots the metric a run logged first, accuracy
        self.tracker.log_metrics(self.run_id, self.costs, step=0)
        logged = {key for row in history for key in row}  # a curve's final value is its last step in the runs table
        self.tracker.log_metrics(self.run_id, {k: v for k, v in summary.items() if k not in logged
                                               and k not in ("rounds", "status")}, step=summary["rounds"])
        with tempfile.TemporaryDirectory() as tmp:
            if history:
                figure = curves_figure(history, run_name(self.cfg))
                self.tracker.log_artifact(self.run_id, save_png(figure, Path(tmp) / "curves.png", dpi=100))
            if summary["status"] not in ("failed", "killed"):  # a killed run's Ctrl-C ends it now
                self.tracker.log_artifact(self.run_id, fed.save_model(Path(tmp) / MODEL))
        for figure in artifacts:
            self.tracker.log_artifact(self.run_id, figure)
        self.tracker.end(self.run_id, summary["status"], summary.get("error"))
