"""The evaluation protocols as round probes: when they measure."""

from __future__ import annotations

from fltune.config import build_config
from fltune.engine.federation import Federation
from fltune.metrics.evaluation import ACCURACY_KEYS
from tests.engine.test_federation import BASE, run


def test_every_protocol_measures_every_k_rounds_and_at_the_last(ray_session):
    """``metrics.every`` holds for the personalised protocol too (it scores every client, the dearest
    evaluation): at paper scale it ran after each of the 500 rounds instead of every 10th."""
    cfg = build_config(overrides=[*BASE, "federation.rounds=5", "metrics.every=2", "resources.workers=1",
                                  "metrics.protocols=[global,all_model,personalized]"])
    history = run(Federation(cfg)).history
    measured = {key: [row["round"] for row in history if key in row] for key in ACCURACY_KEYS[:3]}
    assert measured == dict.fromkeys(ACCURACY_KEYS[:3], [2, 4, 5])
    assert [row["round"] for row in history] == [1, 2, 3, 4, 5]  # training rounds all report
