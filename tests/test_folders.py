"""A folder a command will write to is made, or refused in one line naming the flag, before any work."""

from __future__ import annotations

import pytest

from fltune.errors import FLTuneError
from fltune.folders import make_out


def test_a_missing_folder_is_made_with_its_parents(tmp_path):
    make_out(str(tmp_path / "a" / "b"), "--out")
    assert (tmp_path / "a" / "b").is_dir()


@pytest.mark.parametrize("where", ["file", "file/below"])
def test_a_folder_that_cannot_be_written_is_one_line_naming_the_flag(tmp_path, where):
    (tmp_path / "file").write_text("")
    with pytest.raises(FLTuneError) as err:
        make_out(str(tmp_path / where), "--json-out")
    assert str(err.value) == (f"--json-out {tmp_path / where}: Not a directory; allowed: a folder this user can "
                              "create and write")
