"""A job's saved spec: which one ``--resume`` without ``--name`` continues."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fltune.errors import FLTuneError
from fltune.tune.spec import StudySpec
from tests.tune.test_job import study


def test_resume_without_name_takes_the_newest_job_of_its_kind(tmp_path):
    storage = str(tmp_path / "studies")
    old, new = study(tmp_path, "zz-old"), study(tmp_path, "aa-new")  # names do not sort by time
    for age, spec in ((100, old), (0, new)):
        spec.save()
        saved = Path(spec.path) / "fltune_study.json"
        os.utime(saved, (saved.stat().st_atime - age, saved.stat().st_mtime - age))
    other = tmp_path / "studies" / "other-kind"
    other.mkdir()
    (other / "fltune_study.json").write_text('{"name": "other-kind", "storage": "x", "table": "t"}')
    assert StudySpec.resumed(storage, None, "study").name == "aa-new"
    assert StudySpec.resumed(storage, None, "study", lambda s: s.name.startswith("zz")).name == "zz-old"
    with pytest.raises(FLTuneError, match="--resume: no study of x.yaml under .*; pass --name"):
        StudySpec.resumed(storage, None, "study of x.yaml", lambda s: False)
