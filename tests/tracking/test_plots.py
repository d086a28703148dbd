"""A run's curves figure, read from the figure object: whole rounds, accuracy in percent, losses named."""

from __future__ import annotations

from fltune.tracking.callback import LOSSES, curves_figure

HISTORY = [{"round": 1.0, "acc_global": 0.5, "train_loss": 1.2, "loss": 1.4},
           {"round": 2.0, "train_loss": 0.9},  # not an evaluation round
           {"round": 3.0, "acc_global": 0.625, "acc_personalized": 0.7, "train_loss": 0.8, "loss": 1.1}]


def test_curves_are_drawn_on_whole_rounds_with_accuracy_in_percent_and_each_loss_named() -> None:
    acc_ax, loss_ax = curves_figure(HISTORY, "fedavg · synthetic · dirichlet · seed 0").axes
    for ax in (acc_ax, loss_ax):
        assert ax.get_xlabel() == "round"
        assert all(tick == round(tick) for tick in ax.get_xticks())  # 1, 2, 3, never 1.5
    assert acc_ax.get_ylabel() == "accuracy (%)"
    curves = {line.get_label(): list(zip(*line.get_data())) for line in acc_ax.lines}
    assert curves == {"global": [(1.0, 50.0), (3.0, 62.5)], "personalized": [(3.0, 70.0)]}
    assert [line.get_label() for line in loss_ax.lines] == list(LOSSES.values())
    assert "cross-entropy" in LOSSES["loss"]
