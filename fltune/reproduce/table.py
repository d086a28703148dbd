"""Paper tables fltune can re-run: their cells, the paper's numbers, and how to run them at two scales. A table is data:
each cell names the paper's row, column and value, the metric compared, and the dotted config fields that make it; a
scale adds settings common to every cell (``paper``: the paper's; ``quick``: what fits a 2-core machine). Each
``fltune/reproduce/papers/`` module lists its ``TABLES``, keyed ``<paper>:<table>``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fltune.config import one_of

DATASET_NAMES = {
    "emnist_letters": "EMNIST", "fmnist": "FMNIST", "mnist": "MNIST", "cifar10": "CIFAR-10",
    "cifar100": "CIFAR-100", "svhn": "SVHN", "synthetic": "synthetic", "cinic10": "CINIC-10",
    "pathmnist": "PathMNIST", "tissuemnist": "TissueMNIST", "tinyimagenet": "Tiny-ImageNet",
}
"""fltune dataset → the name papers print."""
HESSIAN_AT_END = {"metrics.hessian.at_end": True, "metrics.hessian.top_k": 1, "metrics.hessian.landscape": False}
"""The top Hessian eigenvalue and trace of the final model, no loss landscape (FedAlign's and MAN's Hessian tables)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Cell(_Frozen):
    """One number of a paper table and the run that measures it."""

    row: str = Field(description="the paper's row label, e.g. 'FedAvg-FT'")
    dataset: str = Field(description="fltune dataset name")
    column: str = Field(description="the paper's column label under the dataset, e.g. 'non-IID1'")
    paper: float | None = Field(description="the paper's value as printed (None where it prints none)")
    metric: str = Field(description="the fltune metric compared with it, e.g. 'acc_personalized'")
    settings: dict[str, Any] = Field(default_factory=dict, description="dotted config fields of this cell")
    finetune: bool = Field(False, description="ends with the -FT phase (scale's finetune_epochs)")
    reduce: Literal["final", "mean", "at_target"] = Field(
        "final", description="the metric's last value, its mean over rounds (s/round), or its value at the "
        "round metrics.target was first reached (FedAlign Table 8)")
    factor: float | None = Field(
        None, description="measured × factor is what the paper prints (1e-6 for parameters in M); "
        "None: the table's (×100 for percent tables)")
    paper_text: str | None = Field(
        None, description="the paper's entry when it is no number, e.g. '500+' (target not reached in 500 rounds)")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        from fltune.tune.space import METRICS

        return one_of(value, METRICS, "metric")

    @property
    def key(self) -> str:
        """Unique within a table; the Tune trial's ``cell`` and the MLflow child's name."""
        return f"{self.row} | {DATASET_NAMES.get(self.dataset, self.dataset)} {self.column}"


class Scale(_Frozen):
    """Settings shared by every cell at one scale, plus per-dataset ones."""

    settings: dict[str, Any] = Field(default_factory=dict)
    per_dataset: dict[str, dict[str, Any]] = Field(default_factory=dict)
    per_column: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="settings of the cells of a column at this scale, over the cell's own "
        "(e.g. the quick size of FedAlign's 64-client column)")
    per_row: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="settings of the cells of a row at this scale, over the cell's own "
        "(e.g. the quick length of FedSOL's Local-only row, whose rounds are its epochs)")
    finetune_epochs: int = Field(0, ge=0, description="training.finetune_epochs of cells marked finetune")
    substitute: str | None = Field(None, description="dataset run instead of a missing one (said in the output)")
    note: str = ""

    def plus(self, settings: dict[str, Any], note: str = "") -> Scale:
        """This scale with ``settings`` over its own and ``note`` appended."""
        return self.model_copy(update={"settings": {**self.settings, **settings}, "note": self.note + note})


class PaperTable(_Frozen):
    """A paper table: where it is printed, what its numbers are, its cells and its scales."""

    key: str = Field(description="'<paper>:<table>', e.g. 'simfafl:table2'")
    title: str
    source: str = Field(description="where the numbers are printed, e.g. 'FedSOL, Lee et al. 2024: Table 5'")
    value: str = Field(description="what a number is, e.g. 'final personalised test accuracy (%)'")
    percent: bool = Field(True, description="paper values are percentages of fltune's [0, 1] metrics")
    cells: tuple[Cell, ...]
    scales: dict[str, Scale]
    unknowns: tuple[str, ...] = Field((), description="[U] settings the paper does not give, and our choice")
    row_settings: dict[str, str] = Field(
        default_factory=dict, description="each row's own settings and their source, [U] marked (job header, table.md)")

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(c.dataset for c in self.cells))

    def factor(self, cell: Cell) -> float:
        """What a cell's measured metric is multiplied by to read as the paper prints it."""
        if cell.factor is not None:
            return cell.factor
        return 100.0 if self.percent else 1.0

    def cell(self, key: str) -> Cell:
        return next(cell for cell in self.cells if cell.key == key)


class Paper(_Frozen):
    """What every registered table of one paper shares: its name and citation, scales and [U] readings."""

    name: str = Field(description="as titles print it, e.g. 'FedSOL'; lower-cased, the tables' key prefix")
    cite: str = Field(description="after the name in a table's source, e.g. 'Lee et al. 2024'")
    scales: dict[str, Scale]
    unknowns: tuple[str, ...] = ()
    value: str = Field("", description="what a number is, for the tables that do not say their own")

    def table(self, number: int, title: str, cells: list[Cell], *, supplementary: bool = False,
              source: str | None = None, value: str | None = None, scales: dict[str, Scale] | None = None,
              unknowns: tuple[str, ...] = (), **extra: Any) -> PaperTable:
        """Table ``number`` (of the supplement), at the paper's scales unless ``scales``, its own [U] readings
        after the paper's; ``source`` where the numbers are printed, when not just under that table's name."""
        printed = f"{'supplementary ' if supplementary else ''}Table {number}"
        return PaperTable(
            key=f"{self.name.lower()}:{'supp' if supplementary else 'table'}{number}",
            title=f"{self.name} {printed}: {title}", source=f"{self.name}, {self.cite}: {source or printed}",
            value=value or self.value, cells=tuple(cells), scales=scales or self.scales,
            unknowns=(*self.unknowns, *unknowns), **extra,
        )
