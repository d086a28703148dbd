"""A resolved study: the search-space file after ``--set`` and the CLI flags, frozen at creation. Every trial receives
it and ``--resume`` reloads it, so a resumed study runs the settings it started with."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from functools import cached_property
from typing import Any, Self

import pyarrow.fs
from pydantic import BaseModel, ConfigDict, ValidationError

from fltune.config import ExperimentConfig, TrackingConfig, build_config
from fltune.errors import FLTuneError
from fltune.jobs.storage import holds, write_whole
from fltune.tune.space import SearchSpace

SPEC_FILE = "fltune_study.json"


class SavedSpec(BaseModel):
    """A Tune job's settings in its folder (``<storage>/<name>/fltune_study.json``) for --resume."""

    model_config = ConfigDict(frozen=True, ignored_types=(cached_property,))

    name: str
    storage: str

    @property
    def path(self) -> str:
        """The job's folder (Tune's experiment path): ``<storage>/<name>``."""
        return f"{self.storage.rstrip('/')}/{self.name}"

    def save(self) -> None:
        """Written whole or not at all (``storage.write_whole``): ``--resume`` reads it back."""
        fs, folder = pyarrow.fs.FileSystem.from_uri(self.path)
        fs.create_dir(folder)
        write_whole(f"{self.path}/{SPEC_FILE}", self.model_dump_json(indent=2).encode())

    @classmethod
    def load(cls, path: str) -> Self:
        fs, folder = pyarrow.fs.FileSystem.from_uri(path)
        try:
            with fs.open_input_stream(f"{folder}/{SPEC_FILE}") as stream:
                text = stream.readall()
        except FileNotFoundError:
            raise FLTuneError(f"--resume: no fltune job at {path} (no {SPEC_FILE})") from None
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            if any(error["type"] == "json_invalid" for error in err.errors()):
                raise CutSpec(f"--resume: {path}/{SPEC_FILE} is empty or cut short (a stop as an older fltune "
                              "wrote it), so the job cannot resume; start it again under another --name") from None
            raise FLTuneError(f"--resume: {path} holds a different kind of fltune job") from None

    @classmethod
    def resumed(cls, storage: str, name: str | None, what: str, keep: Callable[[Self], bool] = lambda _: True) -> Self:
        """The job ``--resume`` continues: ``--name``'s, else the newest of this kind under ``storage`` that
        ``keep`` accepts (``what`` names it in errors)."""
        if name:
            return cls.load(f"{storage.rstrip('/')}/{name}")
        fs, folder = pyarrow.fs.FileSystem.from_uri(storage)
        found: list[tuple[Any, Self]] = []
        for info in fs.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True)):
            saved = fs.get_file_info(f"{info.path}/{SPEC_FILE}")
            if saved.type != pyarrow.fs.FileType.File:
                continue
            try:
                spec = cls.load(f"{storage.rstrip('/')}/{info.base_name}")
            except FLTuneError:  # another kind of job
                continue
            if keep(spec):
                found.append((saved.mtime, spec))
        if not found:
            raise FLTuneError(f"--resume: no {what} under {storage}; pass --name")
        return max(found, key=lambda pair: pair[0])[1]


def exists(path: str) -> bool:
    """Whether ``path`` holds an fltune job (its saved spec), on any pyarrow filesystem."""
    return holds(path, SPEC_FILE)


class CutSpec(FLTuneError):
    """A saved spec that is not JSON at all: empty or cut short by a stop as an older fltune wrote it."""


class JobSpec(SavedSpec):
    """A kind of Tune job's spec as ``TuneJob`` reads it: its setting, and ``max_concurrent`` (trials at once; None:
    all that fit)."""

    @property
    @abstractmethod
    def config(self) -> ExperimentConfig:
        """The job's setting, whose tracking and resources every trial shares."""

    @property
    def tracking(self) -> TrackingConfig:
        return self.config.tracking


class StudySpec(JobSpec):
    """Everything a study needs, as plain data (picklable for Ray, JSON for the study folder)."""

    method: str
    space_file: str
    space_text: str
    space: SearchSpace
    base: dict[str, Any]
    """The base experiment tree: file base + overrides + --set, with the method named."""
    workers: int
    """Client actors per trial (``resources.workers``, default 1 so ``max_concurrent`` trials fit)."""
    gpus_per_worker: float | None
    """Resolved once against the cluster (then kept): a trial must not claim every GPU as a run would."""
    warm_start: str | None = None
    """The finished study whose evaluated configurations the searcher starts from (``--warm-start``)."""

    @cached_property
    def config(self) -> ExperimentConfig:
        return build_config(self.base)

    @property
    def rounds(self) -> int:
        return self.config.federation.rounds

    @property
    def max_concurrent(self) -> int:
        return self.space.max_concurrent
