"""A comparison in MLflow: a parent run (settings, then the compare files and ``configs/``) and a child per cell;
tuning studies are parents of their own (``StudyLog``)."""

from __future__ import annotations

from typing import Any

from fltune.compare.report import MethodRow, results, write_outputs
from fltune.compare.spec import CompareSpec, parse_cell
from fltune.compare.stats import ALPHA
from fltune.config import ExperimentConfig, build_config
from fltune.tune.mlflow_runs import RunTree
from fltune.tune.results import TrialRow


def headline(res: list[MethodRow]) -> dict[str, float]:
    """Sortable ``final_<acc>.<method>`` means and ``welch_p.<method>``. A dot, not a slash: MLflow's chart view
    would put slash sections before the runs' own curves."""
    out = {}
    for r in res:
        out |= {f"{column.replace(' ', '_')}.{r.method}": r.stat(column)[0]
                for column in r.figures if column.startswith("final ")}
        if r.p_value is not None:
            out[f"welch_p.{r.method}"] = r.p_value
    return out


class CompareLog(RunTree):
    kind = "compare"
    spec: CompareSpec

    def expected_trials(self) -> int:
        return len(self.spec.cells)

    def parent_tags(self) -> dict[str, Any]:
        """The methods compared and the shared setting (one method's tags would misname the job)."""
        cfg = self.spec.config
        return {"methods": ",".join(self.spec.methods), "dataset": cfg.data.dataset, "partition": cfg.partition.kind,
                "seeds": self.spec.seeds}

    def describe_parent(self) -> None:
        spec, parent = self.spec, self.parent
        self.tracker.log_params(parent, {
            "methods": ",".join(spec.methods), "seeds": spec.seeds, "tune_budget": spec.tune_budget or 0,
            "ranked_by": spec.primary, "test": "welch_t_two_sided", "alpha": ALPHA, "workers_per_trial": spec.workers,
        })
        self.tracker.log_text(parent, build_config(spec.base | {"method": {"name": spec.methods[0]}}).to_yaml(),
                              "base_config.yaml")

    def child(self, trial_id: str, params: dict[str, Any]) -> tuple[str, ExperimentConfig, dict[str, Any]]:
        key = params["cell"]
        extra = {"cell": key, "seed_index": parse_cell(key)[1]}
        return f"{self.spec.name}/{key}", build_config(self.spec.cell_tree(key)), extra

    def finish(self, rows: list[TrialRow], interrupted: bool) -> None:
        res = results(self.spec, rows)
        self.tracker.set_tags(self.parent, {"fltune.best": next((r.method for r in res if r.best), "")})
        self.tracker.log_metrics(self.parent, headline(res))
        self.end_cells([r.status for r in rows], lambda folder: write_outputs(self.spec, res, folder), interrupted)
