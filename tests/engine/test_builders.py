"""fltune/engine/builders.py: what the data built from a config must serve before Ray starts."""

from __future__ import annotations

import pytest

from fltune.cli import main
from fltune.config import build_config
from fltune.engine.builders import load_data
from fltune.errors import FLTuneError

SMALL = ["data.dataset=synthetic", "partition.kind=iid", "federation.clients=10", "tracking.enabled=false"]


def test_drop_last_refuses_a_client_smaller_than_a_batch_and_names_it() -> None:
    data = load_data(build_config(overrides=SMALL))
    n = min(len(train) for train in data.client_train)
    assert load_data(build_config(overrides=[*SMALL, "training.drop_last=true", f"training.batch_size={n}"]))
    with pytest.raises(FLTuneError, match=rf"^training.drop_last: client \d+ has {n} training samples, fewer than "
                                          rf"training.batch_size {n + 1}, so it would train no step; allowed: "
                                          rf"training.batch_size ≤ {n}"):
        load_data(build_config(overrides=[*SMALL, "training.drop_last=true", f"training.batch_size={n + 1}"]))


def test_a_run_so_refused_is_one_line_before_ray(capsys) -> None:
    args = ["run", *[a for o in SMALL for a in ("--set", o)], "--set", "training.drop_last=true", "--set",
            "training.batch_size=100000"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fltune: training.drop_last: client "), err
