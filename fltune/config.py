"""The experiment configuration: one validated pydantic tree, YAML in, YAML out.

Every field has a dotted path (``method.mu``) for ``--set`` and search spaces. Unknown keys are rejected so a
misspelled field never goes unnoticed (cf. FL-bench's ``funetune_epoch``); method keys are validated by the
method's ``Params``. Names are checked against ``fltune.catalog``, so no torch is imported unless method
parameters or the user's own code (``fltune.plugins``) are named.
"""

from __future__ import annotations

import copy
import functools
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator, BaseModel, ConfigDict, Field, SerializationInfo, SerializerFunctionWrapHandler, ValidationError,
    field_validator, model_serializer, model_validator,
)

from fltune import catalog
from fltune.errors import FLTuneError
from fltune.text import allowed
from fltune.plugins import Kind, is_reference, normalised, plugins, resolve

Protocol = Literal["global", "all_model", "personalized"]
PROTOCOLS: tuple[str, ...] = typing.get_args(Protocol)


def one_of(value: str, names: Sequence[str], what: str) -> str:
    """``value`` if one of ``names``, else a ValueError with ``text.allowed``'s hint."""
    if value not in names:
        raise ValueError(f"unknown {what} {value!r}; {allowed(value, names)}")
    return value


def named(value: str, builtin: Sequence[str], kind: Kind) -> str:
    """A built-in name, a plug-in's, or a reference (imported now, path made absolute); else a ValueError."""
    if value in builtin:
        return value
    if is_reference(value) or value in plugins(kind):
        resolve(kind, value)
        return normalised(value)
    names = [*builtin, *sorted(plugins(kind)), f"package.module:Name or path/to/file.py:Name ({kind} of your own)"]
    return one_of(value, names, kind)


DatasetName = Annotated[str, AfterValidator(lambda value: named(value, tuple(catalog.NUM_CLASSES), "dataset"))]
ModelName = Annotated[str, AfterValidator(lambda value: named(value, ("auto", *sorted(catalog.MODELS)), "model"))]


class _Assigned(BaseModel):
    """A config part validated when a field is assigned (``cfg.federation.rounds = -5``): a bad value fails
    there, as the CLI's one line in an FLTuneError, not later inside a run, and leaves the part as it was."""

    def __setattr__(self, name: str, value: Any) -> None:
        before = dict(self.__dict__), copy.copy(self.__pydantic_extra__)  # a method's params change in place
        try:
            super().__setattr__(name, value)
        except ValidationError as err:
            object.__setattr__(self, "__dict__", before[0])
            object.__setattr__(self, "__pydantic_extra__", before[1])
            where = _section_paths().get(type(self), "")
            raise FLTuneError(f"config error: {describe_validation_error(err, where, type(self))}") from None


class _Section(_Assigned):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class DataConfig(_Section):
    """Which dataset, where its files are, and how to augment it."""

    dataset: DatasetName = Field("fmnist", description="dataset name (fltune.catalog); FMNIST loads offline from Debian's "
                         "dataset-fashion-mnist, synthetic needs no files")
    root: str | None = Field(None, description="folder of the dataset's files; None = Debian's FMNIST folder, "
                             "then ~/.cache/fltune/data (docs/methods.md §0)")
    download: bool = Field(False, description="fetch a missing dataset (needs internet); jobs fetch once, before "
                           "any trial starts")
    augment: Literal["auto", "none", "flip", "crop_flip", "crop_flip_cutout", "reflect_crop_flip",
                     "flip_crop_half"] = Field("auto", description="training augmentation; auto = the dataset's "
                                               "recipe (crop+flip for CIFAR, none for FMNIST; docs/methods.md §0)")
    subsample: float = Field(1.0, gt=0, le=1, description="keep this seeded, class-stratified share of the "
                             "train and test splits (quick reproduction scales); 1 = all")
    normalise: Literal["dataset", "train", "half"] = Field(
        "dataset", description="the inputs' per-channel mean and std: the dataset's published constants, the "
        "whole train split's own (before subsample), or 0.5 and 0.5 (Normalize((0.5,), (0.5,)))")


class PartitionConfig(_Section):
    """How the pool is split over clients (docs/methods.md §0, Partitions)."""

    kind: Literal["iid", "classes", "dirichlet_prior", "dirichlet", "shards", "class_shards"] = Field(
        "dirichlet_prior", description="how labels are spread over clients (docs/methods.md §0, Partitions)")
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (δ of non-IID2/MAN, α of LDA)")
    classes_per_client: int | None = Field(None, ge=1, description="k of `classes`; None = dataset default")
    shards_per_client: int = Field(2, ge=1, description="label-sorted shards per client of `shards`/`class_shards`")
    min_size: int = Field(10, ge=1, description="`dirichlet`: redraw until every client has this many")
    eval_fraction: float = Field(0.0, ge=0, lt=1, description="per-client held-out share (SimFAFL: 0.3)")
    val_fraction: float = Field(0.0, ge=0, lt=1, description="share of each client's training data held out "
                                "as a validation split (val_* metrics, tuning objectives); 0 = none")
    pool_test: bool = Field(False, description="pool train+test before partitioning (SimFAFL/FedCR)")
    test_per_client: int = Field(0, ge=0, description="each client's held-out split drawn from the test set, this "
                                 "many samples in the proportions of its labels (FedSOL's test_align: 1000); "
                                 "0 = none (eval_fraction holds out instead)")

    cache_dir: str | None = Field(None, description="where seeded partitions are cached on disk; None = "
                                  "$FLTUNE_CACHE/partitions, else ~/.cache/fltune/partitions")

    @model_validator(mode="after")
    def _one_held_out_split(self) -> PartitionConfig:
        """``test_per_client`` and ``eval_fraction``/``pool_test`` each define the clients' held-out splits."""
        if self.test_per_client and (self.eval_fraction or self.pool_test):
            raise ValueError(
                f"partition.test_per_client: {self.test_per_client} draws each client's held-out split from the test "
                "set, which partition.eval_fraction and partition.pool_test define otherwise; allowed: 0 with "
                f"those set (got eval_fraction {self.eval_fraction:g}, pool_test {self.pool_test})")
        return self


class ModelConfig(_Section):
    """Architecture by registry name; `auto` picks the dataset's default."""

    name: ModelName = Field("auto", description="model registry name; auto = the method's model if it needs one, else "
                      "the dataset's (docs/methods.md §1)")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the model's "
                                    "builder, e.g. {blocks: 1} for a 1-block-per-stage ResNet-56 in quick tests")


class MethodConfig(_Assigned):
    """The method's registry name plus its hyperparameters, validated by the method's own Params.

    Params live beside the method's torch code, so they are consulted only for given values or a dump (paper
    defaults filled in); a plain name is checked against ``fltune.catalog`` alone."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    name: str = Field("fedavg", description="registered method (`fltune methods`), package.module:Class or "
                      "path/to/file.py:Class of your own, or <method>+<modifier>; its "
                      "parameters are method.<name> fields")

    @field_validator("name")
    @classmethod
    def _known_method(cls, value: str) -> str:
        """The base of ``<method>+<modifier>`` must be a method file, a plug-in or a ``Method`` subclass of
        the user's; modifiers are checked by building."""
        base, plus, modifiers = value.partition("+")
        base = named(base, catalog.method_names(), "method")
        if base not in catalog.method_names():
            from fltune.methods import get_method

            get_method(base)  # a Method subclass declaring its costs, before any work starts
        return f"{base}{plus}{modifiers}"

    @model_validator(mode="after")
    def _validate_params(self) -> MethodConfig:
        given = self.model_extra or {}
        if not given and "+" not in self.name:
            return self
        from fltune.methods import get_method

        method_cls = get_method(self.name)
        fields = method_cls.Params.model_fields
        unknown = sorted(set(given) - set(fields))
        if unknown:
            raise ValueError(f"method.{unknown[0]}: {self.name} has no parameter {unknown[0]!r}; "
                             f"{allowed(unknown[0], fields)}")
        try:
            params = method_cls.Params(**given)
        except ValidationError as err:
            raise ValueError(describe_validation_error(err, prefix="method")) from None
        self.__pydantic_extra__ = params.model_dump()
        return self

    @model_serializer(mode="wrap")
    def _dump_with_defaults(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        """Every parameter of the method, paper defaults included (what YAML and MLflow show)."""
        return {**handler(self), **self.params.model_dump(mode=info.mode)}

    @property
    def params(self) -> BaseModel:
        """The method's validated Params (paper defaults filled in)."""
        from fltune.methods import get_method

        return get_method(self.name).Params(**(self.model_extra or {}))


class TrainingConfig(_Section):
    """Local training, identical for every method (the engine owns the loop)."""

    local_epochs: int = Field(5, ge=1, description="E, local epochs per round")
    batch_size: int = Field(50, ge=1, description="B, local mini-batch size")
    optimizer: Literal["sgd", "adam"] = Field("sgd", description="local optimiser, fresh for every client")
    lr: float = Field(0.01, gt=0, description="local learning rate (round 1; see lr_decay)")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum")
    nesterov: bool = Field(False, description="Nesterov momentum (SGD with momentum > 0 only); FedAlign's code "
                           "uses it in every method")
    weight_decay: float = Field(0.0, ge=0, description="L2 weight decay of the local optimiser")
    lr_decay: float = Field(1.0, gt=0, le=1, description="lr at round r = lr · lr_decay^r (MAN 0.998, FedSOL 0.99)")
    grad_clip: float | None = Field(None, gt=0, description="max global grad norm; None = no clipping")
    finetune_epochs: int = Field(0, ge=0, description="-FT: after the last round every client trains this many "
                                 "epochs before personalised evaluation: its personal part, else its head, with "
                                 "the rest frozen; Ditto: one more of its own rounds (the method's final_round)")
    finetune_params: Literal["personal", "all"] = Field(
        "personal", description="what a `tune` final round trains: the personal part (else the head), or every "
        "parameter (FedSOL's code fine-tunes whole models)")
    finetune_lr: float | None = Field(None, gt=0, description="fine-tuning lr; None = the lr a round after the "
                                      "last would train at, training.lr · lr_decay^rounds")
    drop_last: bool = Field(False, description="drop each epoch's short last batch, as a DataLoader with drop_last "
                            "(FedAlign's code): a client trains, and weighs in the server's average with, "
                            "floor(n_k/B)·B samples an epoch")

    def lr_at(self, round_: int) -> float:
        """Round ``round_``'s learning rate, lr · lr_decay^(round − 1); the final personal round is round R + 1."""
        return self.lr * self.lr_decay ** (round_ - 1)

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> TrainingConfig:
        """torch's SGD rejects Nesterov without momentum deep inside a worker; say it once, here."""
        if self.nesterov and (self.optimizer != "sgd" or self.momentum == 0):
            raise ValueError(
                f"training.nesterov: true needs training.optimizer sgd with training.momentum > 0; allowed: false "
                f"here (got optimizer {self.optimizer}, momentum {self.momentum})"
            )
        return self


class FederationConfig(_Section):
    """Who takes part: N clients, a fraction per round, for R rounds, all from one seed."""

    clients: int = Field(100, ge=1, description="N, clients in the federation")
    fraction: float = Field(0.1, gt=0, le=1, description="share of clients sampled each round")
    rounds: int = Field(10, ge=1, description="R, communication rounds")
    seed: int = Field(0, ge=0, description="the seed every random number derives from, with the round and client id")
    sampling: Literal["fixed", "bernoulli"] = Field(
        "fixed", description="fixed: round(N·fraction) clients a round, drawn without replacement; bernoulli: each "
        "client with probability fraction, so their number varies (FedDyn's, FedDC's and MAN's code)")

    @property
    def clients_per_round(self) -> int:
        return max(1, round(self.clients * self.fraction))


class HessianConfig(_Section):
    """When and how to measure the loss curvature (docs/methods.md §4); every = 0 turns it off."""

    every: int = Field(0, ge=0, description="probe every k rounds; 0 = off")
    at_end: bool = Field(False, description="probe after the last round too")
    batches: int = Field(10, ge=1, description="seeded training batches the Hessian is taken on")
    batch_size: int = Field(50, ge=1, description="samples per probe batch")
    clients: int = Field(0, ge=0, description="local models for H_N/H_D (FedAlign Eq. 3–4); 0 = skip")
    top_k: int = Field(5, ge=1, description="leading eigenvalues logged (hessian_lambda_1…k)")
    max_iter: int = Field(100, ge=1, description="power iterations per eigenvalue; Hutchinson samples at most")
    tol: float = Field(1e-3, gt=0, description="power iteration stops when λ changes by less than this, relatively")
    trace_tol: float = Field(1e-2, gt=0, description="Hutchinson (tr H, H_N/H_D) stops once its standard error "
                             "is below this share of the estimate, after 10 samples")
    probe_data: Literal["shared", "own"] = Field(
        "shared", description="H_N/H_D: every client model on the same training batches (the FedAlign authors' "
        "code) or each on its own client's data")
    landscape: bool = Field(True, description="loss-surface PNG along the top-2 eigenvectors at the end")

    @field_validator("clients")
    @classmethod
    def _pairs(cls, value: int) -> int:
        if value == 1:
            raise ValueError("H_N/H_D compare clients: allowed 0 (off) or at least 2")
        return value


class MetricsConfig(_Section):
    """Evaluation protocols (docs/methods.md §0) and rounds-to-target."""

    protocols: list[Protocol] = Field(default_factory=lambda: list(PROTOCOLS), description="evaluation protocols "
                                      "scored (docs/methods.md §0); `run` names those it can't measure")
    every: int = Field(1, ge=1, description="evaluate every k rounds (and always at the last round)")
    target: float | None = Field(None, gt=0, le=1, description="accuracy for rounds_to_target")
    target_metric: Literal["acc_global", "acc_all_model", "acc_personalized", "acc_personalized_ft"] = Field(
        "acc_global", description="the accuracy rounds_to_target watches; must be one the run measures")
    test: bool = Field(True, description="evaluate on the test data; false: the run holds no test data and "
                       "evaluates only the validation split (compare's tuning studies)")
    hessian: HessianConfig = Field(default_factory=HessianConfig, description="the Hessian probe (docs/methods.md §4)")


class ResourcesConfig(_Section):
    """Ray actors that train clients: how many and what each reserves."""

    workers: int | None = Field(None, ge=1, description="client actors; None = as many as CPUs allow")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs each worker reserves (its torch threads)")
    gpus_per_worker: float | None = Field(None, ge=0, le=1, description="None = share the GPUs when CUDA exists")
    deterministic: bool = Field(
        True, description="reproducible CUDA kernels (same numbers with 1 or many workers); false = faster on GPU")
    address: str | None = Field(None, description="Ray cluster address; None = start a local Ray")
    driver_worker: bool | None = Field(
        None, description="train one worker's share in the driver's process instead of one more actor (same "
        "numbers, one torch process less); None = when `run` starts its own Ray and plans ≥ 2 CPU "
        "workers; a Tune trial's process reserves no CPU, so tune/reproduce/compare refuse true")
    executor: Literal["exact", "reference", "batched"] = Field(
        "exact", description="how workers train clients: exact = data on the worker's device, metrics read once "
        "per client (bit-identical to reference); reference = per-step host batches and reads; batched = K "
        "clients at once with torch.func (deterministic, statistically equivalent, not bit-identical)")
    batch_clients: int = Field(
        10, ge=1, description="K, clients per vmapped group of the batched executor (groups: sorted ids chunked)")
    compile: bool = Field(
        False, description="batched executor only: torch.compile each group step (fused kernels, fewer launches and "
        "Python calls; numbers move by rounding, still deterministic and worker-count free; the first rounds pay "
        "the compile time)")


class TrackingConfig(_Section):
    """Where MLflow writes (the driver only)."""

    enabled: bool = Field(True, description="log the run to MLflow; false = MLflow is not even imported")
    uri: str | None = Field(None, description="default: $MLFLOW_TRACKING_URI or sqlite:///<repo>/mlruns/mlflow.db")
    experiment: str = Field("fltune", min_length=1, description="MLflow experiment name")
    run_name: str | None = Field(None, description="MLflow run name; None = method · dataset · partition · seed")


class ExperimentConfig(_Section):
    """A whole federated experiment."""

    data: DataConfig = Field(default_factory=DataConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    method: MethodConfig = Field(default_factory=MethodConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    federation: FederationConfig = Field(default_factory=FederationConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        if self.partition.kind == "classes" and self.partition.classes_per_client is not None:
            classes = catalog.NUM_CLASSES.get(self.data.dataset)
            if classes is not None and self.partition.classes_per_client > classes:
                raise ValueError(
                    f"partition.classes_per_client: {self.partition.classes_per_client} > the "
                    f"{classes} classes of {self.data.dataset}; allowed: 1..{classes}"
                )
        if not self.metrics.test and self.partition.val_fraction == 0:
            raise ValueError("metrics.test: false leaves nothing to evaluate; allowed with partition.val_fraction > 0")
        if self.resources.compile and self.resources.executor != "batched":
            raise ValueError(f"resources.compile: true needs resources.executor batched (it compiles that "
                             f"executor's group step), not {self.resources.executor}")
        return self

    def __init__(self, /, **fields: Any) -> None:
        """``Config(method="fedprox", **{"federation.rounds": 2, "method.mu": 0.1})``: sections, dotted fields
        and a method's name; a bad value raises FLTuneError with the line the CLI prints."""
        try:
            super().__init__(**set_fields({}, fields))
        except ValidationError as err:
            raise FLTuneError(f"config error: {describe_validation_error(err, model=ExperimentConfig)}") from None

    @classmethod
    def from_yaml(cls, path: str | Path, **fields: Any) -> ExperimentConfig:
        """The config file ``path`` with ``fields`` set on top (as ``__init__`` takes them)."""
        return cls(**set_fields(read_yaml(path), fields))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


@functools.cache
def _section_paths() -> dict[type[BaseModel], str]:
    """Each config part's class → its dotted place in ``ExperimentConfig`` (``HessianConfig`` → metrics.hessian)."""
    paths: dict[type[BaseModel], str] = {ExperimentConfig: ""}
    todo = [(ExperimentConfig, "")]
    while todo:
        model, where = todo.pop()
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                paths[field.annotation] = f"{where}{name}"
                todo.append((field.annotation, f"{where}{name}."))
    return paths


def describe_validation_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """One line per problem: the dotted field, what is wrong/allowed, and the value given; an unknown field
    of ``model`` (the tree validated) with the field it was likely meant to be (``text.allowed``)."""
    lines = []
    for item in err.errors():
        loc = ".".join(str(p) for p in (prefix, *item["loc"]) if p != "")
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] in ("extra_forbidden", "no_such_attribute"):
            loc, msg = unknown_field(item["loc"], prefix, model)
        given = item.get("input")
        shown = "" if isinstance(given, dict) or item["type"] == "value_error" else f" (got {given!r})"
        nested = msg.startswith(f"{loc}.")  # a sub-model already named the full field path
        lines.append(f"{loc}: {msg}{shown}" if loc and not nested else f"{msg}{shown}")
    return "; ".join(lines)


def unknown_field(loc: tuple[int | str, ...], prefix: str, model: type[BaseModel] | None) -> tuple[str, str]:
    """An unknown key's dotted path and "unknown field; did you mean …?" (with ``model``, the tree validated)."""
    path, fields = section_of(model, loc) if model else ([str(part) for part in loc[:-1]], [])
    section = "".join(f"{part}." for part in ([prefix] if prefix else []) + path)
    key = str(loc[-1])
    return f"{section}{key}", "unknown field" + (f"; {allowed(key, fields, section=section)}" if fields else "")


def section_of(model: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[list[str], list[str]]:
    """The dotted path of the section of ``model`` holding ``loc``, as the user writes it, and its fields. In
    a section of several kinds (``scheduler``) pydantic's ``loc`` holds the kind's tag, no part of the path."""
    path: list[str] = []
    kinds: dict[str, type[BaseModel]] = {}
    for part in map(str, loc[:-1]):
        if part in kinds:
            model, kinds = kinds[part], {}
            continue
        path.append(part)
        field = model.model_fields.get(part)
        options = [a for a in typing.get_args(field.annotation) if isinstance(a, type)] if field else []
        sections = [a for a in (field.annotation if field else None, *options)
                    if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(sections) != 1:
            kinds = {tag: kind for kind in sections for tag in _tags(kind)}
            if not kinds:
                return path, []
            continue
        model = sections[0]
    return path, [] if kinds else list(model.model_fields)


def _tags(kind: type[BaseModel]) -> tuple[str, ...]:
    """The values that tag ``kind`` in a union of sections: its ``Literal`` fields' (``name: Literal["asha"]``)."""
    return tuple(value for field in kind.model_fields.values()
                 if typing.get_origin(field.annotation) is Literal for value in typing.get_args(field.annotation))


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=c`` → (['a', 'b'], c) with c parsed as YAML (numbers, bools, lists, null)."""
    if "=" not in text:
        raise FLTuneError(f"--set {text!r}: expected key.path=value, e.g. federation.rounds=3")
    key, raw = text.split("=", 1)
    try:
        value = load_yaml(raw, f"--set {text!r}") if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(tree: dict[str, Any], overrides: list[str], fresh: Sequence[str] = ()) -> dict[str, Any]:
    """Set dotted keys in a nested dict (creating sections), unvalidated. A ``fresh`` section restarts empty
    when its ``name`` is set (``scheduler.name=none`` drops ASHA's grace period)."""
    for text in overrides:
        path, value = parse_override(text)
        if len(path) == 2 and path[0] in fresh and path[1] == "name" and isinstance(tree.get(path[0]), dict):
            tree[path[0]] = {}
        set_path(tree, path, value, f"--set {text!r}")
    return tree


def set_fields(tree: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``tree`` (copied) with each ``fields`` key set: a section, a dotted field, or ``method`` as a name."""
    tree = copy.deepcopy(tree)
    for key, value in fields.items():
        if key == "method" and isinstance(value, str):
            key = "method.name"
        set_path(tree, key.split("."), copy.deepcopy(value), key)
    return tree


def set_path(tree: dict[str, Any], path: list[str], value: Any, shown: str) -> None:
    """``tree[a][b] = value`` for ``path`` [a, b], creating sections and merging a section into one there."""
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise FLTuneError(f"{shown}: {part} is a value, not a section")
        node = child
    if isinstance(value, dict) and isinstance(node.get(path[-1]), dict):
        node[path[-1]] = set_fields(node[path[-1]], value)
    else:
        node[path[-1]] = value


MAX_YAML_VALUES = 100_000
"""The most values a config or space file may expand to, aliases expanded: far above any real one, far below an
alias bomb's (``a: &a [x, …]``, ``b: &b [*a, …]``, … grows ninefold a level), which validation would expand until
memory runs out."""


def _expanded(node: yaml.Node, sizes: dict[int, int]) -> int:
    """The values under ``node`` with every alias expanded, counted on YAML's node graph, where an alias is the
    node it names: memoised (``sizes``), so a bomb costs its own size; a node inside itself counts as unbounded."""
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = MAX_YAML_VALUES + 1  # until counted: a cycle is unbounded
    children = [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else (
        node.value if isinstance(node, yaml.SequenceNode) else [])
    sizes[id(node)] = 1 + sum(min(_expanded(child, sizes), MAX_YAML_VALUES + 1) for child in children)
    return sizes[id(node)]


def load_yaml(text: str, shown: str) -> Any:
    """``yaml.safe_load``, refusing a document whose expanded tree exceeds ``MAX_YAML_VALUES`` before it is built."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and _expanded(node, {}) > MAX_YAML_VALUES:
            raise FLTuneError(f"{shown}: its YAML aliases expand to over {MAX_YAML_VALUES:,} values; allowed: at "
                              f"most {MAX_YAML_VALUES:,} (an alias nested in aliases multiplies)")
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Load a YAML mapping, turning every failure into one line naming the file."""
    file = Path(path)
    if not file.is_file():
        raise FLTuneError(f"{path}: no such file")
    try:
        tree = load_yaml(file.read_text(), str(path))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise FLTuneError(f"{path}: malformed YAML{where}: {getattr(err, 'problem', err)}") from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise FLTuneError(f"{path}: expected a mapping of config sections, got {type(tree).__name__}")
    return tree


def build_config(tree: dict[str, Any] | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Validate a (possibly partial) config tree plus ``--set`` overrides into an ExperimentConfig."""
    return ExperimentConfig(**apply_overrides(dict(tree or {}), list(overrides or [])))


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} → {'a.b': 1}: MLflow params and Tune search keys use dotted paths."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat
