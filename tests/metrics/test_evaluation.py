"""The evaluation protocols as round probes: when they measure."""

from __future__ import annotations

import pytest

from fltune.assembly import build_federation
from fltune.config import build_config
from fltune.engine.builders import load_data
from fltune.errors import FLTuneError
from fltune.metrics.evaluation import ACCURACY_KEYS
from tests.engine.test_federation import BASE, run


def test_every_protocol_measures_every_k_rounds_and_at_the_last(ray_session):
    """``metrics.every`` holds for the personalised protocol too (it scores every client, the dearest
    evaluation): at paper scale it ran after each of the 500 rounds instead of every 10th."""
    cfg = build_config(overrides=[*BASE, "federation.rounds=3", "metrics.every=2", "resources.workers=1",
                                  "metrics.protocols=[global,all_model,personalized]"])
    history = run(build_federation(cfg)).history
    measured = {key: [row["round"] for row in history if key in row] for key in ACCURACY_KEYS[:3]}
    assert measured == dict.fromkeys(ACCURACY_KEYS[:3], [2, 3])
    assert [row["round"] for row in history] == [1, 2, 3]  # training rounds all report


SKEWED = ["data.dataset=synthetic", "data.subsample=0.25", "federation.clients=10", "tracking.enabled=false",
          "partition.kind=dirichlet", "partition.alpha=0.1"]  # clients of 27 to 257 samples


@pytest.mark.parametrize("field", ["eval_fraction", "val_fraction"])
def test_a_split_that_leaves_some_client_nothing_to_score_is_refused_where_the_personalized_protocol_runs(field):
    """``acc_personalized`` is a mean over every client: a fraction that holds out a sample of the large
    clients but none of the small ones was skipped silently (held-out) or failed after round 1 (validation).
    The federation now refuses it as it is built, naming the field and the fraction that would serve all;
    without the protocol the same split is fine (the global protocols score the union)."""
    cfg = build_config(overrides=[*SKEWED, f"partition.{field}=0.015"])
    held_out, sizes = load_data(cfg).held_out("test" if field == "eval_fraction" else "val")
    assert 0 < sum(len(idx) == 0 for idx in held_out) < len(held_out)  # some clients have none, not all
    smallest = min(n for idx, n in zip(held_out, sizes) if len(idx) == 0)
    with pytest.raises(FLTuneError, match=rf"^partition\.{field}: 0\.015 holds out no sample of \d of 10 clients, "
                                          r"and the personalized protocol scores every client on its own; "
                                          rf"allowed: above 0\.5/{smallest} = "):
        build_federation(cfg)
    build_federation(build_config(overrides=[*SKEWED, f"partition.{field}=0.015", "metrics.protocols=[global]"]))
