"""Flags several commands share: what a resumed job says about the flags it ignores."""

from __future__ import annotations

import pytest

from fltune.cli import build_parser
from fltune.cli_args import options_from
from fltune.jobs.scaffold import JobOptions, note_ignored


@pytest.mark.parametrize("argv, ignored", [
    (["tune", "--resume", "--name", "s", "--storage", "x"], None),
    (["tune", "--resume", "--set", "federation.rounds=9", "--seeds", "2"], "--set, --seeds"),
    (["reproduce", "table2", "--resume", "--out", "o", "--address", "auto"], None),
    (["reproduce", "table2", "--resume", "--scale", "paper", "--rows", "FedAvg"], "--rows, --scale"),
    (["reproduce", "table2", "--resume", "--scale", "quick"], None),  # the default: not given
    (["compare", "--resume", "--name", "c", "--out", "o", "--address", "auto"], None),  # a shortcut that places it
    (["tune", "--resume", "--rounds", "3", "--method", "fedprox", "--space", "s.yaml"], "--method, --rounds"),
    (["compare", "--resume", "--methods", "fedavg,fedprox", "--rounds", "3", "--checkpoint-every", "2"],
     "--methods, --checkpoint-every, --rounds"),
])
def test_a_resumed_job_names_the_setting_flags_it_ignores(argv, ignored, capsys):
    """A resumed job runs its saved settings: flags that would change them are named once; flags that find
    the job (--name, --storage) or place its output (--out, --address) are honoured and not named."""
    note_ignored(JobOptions(ignored=options_from(build_parser().parse_args(argv)).ignored), "job")
    said = " ".join(capsys.readouterr().err.split())
    if ignored is None:
        assert said == ""
    else:
        assert said == f"note: a resumed job keeps the settings it started with; ignored: {ignored}"
