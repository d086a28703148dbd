"""fltune/tune/search.py: Optuna as Tune's searcher."""

from __future__ import annotations

from pathlib import Path

from fltune.tune.search import make_searcher
from fltune.tune.command import StudyRequest
from fltune.tune.search import new_spec

SPACE = Path(__file__).parents[2] / "fltune" / "search_spaces" / "fedavg.yaml"


def test_a_trial_the_searcher_never_suggested_is_passed_over_and_the_others_still_reach_optuna(tmp_path: Path) -> None:
    """A driver killed between Tune saving a new trial and saving the searcher leaves, on resume, a trial the
    searcher has no Optuna trial for: its results and its end are passed over, not a KeyError that ends the
    study."""
    spec = new_spec(StudyRequest(space=str(SPACE), storage=str(tmp_path), name="s"))
    (tmp_path / "s").mkdir()
    searcher = make_searcher(spec)
    searcher.set_search_properties(metric=None, mode=None, config={})
    assert searcher.suggest("known") is not None

    searcher.on_trial_result("lost", {"objective": 0.5, "training_iteration": 1})
    searcher.on_trial_complete("lost", {"objective": 0.5, "training_iteration": 1})

    searcher.on_trial_result("known", {"objective": 0.5, "training_iteration": 1})
    searcher.on_trial_complete("known", {"objective": 0.7, "training_iteration": 2})
    [trial] = searcher._ot_study.trials
    assert (trial.state.name, trial.value, trial.intermediate_values) == ("COMPLETE", 0.7, {1: 0.5})


def test_a_trial_whose_end_the_journal_holds_is_passed_over_and_counted_complete(tmp_path: Path) -> None:
    """A driver killed after the journal recorded a trial's end but before Tune saved the searcher resumes with a
    searcher that thinks the trial runs: Tune replays its rounds, which Optuna would refuse for a finished trial."""
    spec = new_spec(StudyRequest(space=str(SPACE), storage=str(tmp_path), name="s"))
    (tmp_path / "s").mkdir()
    searcher = make_searcher(spec)
    searcher.set_search_properties(metric=None, mode=None, config={})
    assert searcher.suggest("ended") is not None
    [trial] = searcher._ot_study.trials
    searcher._ot_study.tell(trial.number, 0.6)  # the journal's write the killed driver made

    searcher.on_trial_result("ended", {"objective": 0.5, "training_iteration": 1})
    searcher.on_trial_complete("ended", {"objective": 0.7, "training_iteration": 2})
    [trial] = searcher._ot_study.trials
    assert (trial.state.name, trial.value, trial.intermediate_values) == ("COMPLETE", 0.6, {})
    assert "ended" in searcher._completed_trials
