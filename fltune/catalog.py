"""What fltune offers, by name, known without importing torch: the config validates against this.

The config sits at the bottom of the data flow, so checking a name must not load its implementation. A
method's name is its file's, read without importing it; ``tests/test_catalog.py`` checks every registry agrees.
"""

from __future__ import annotations

from pathlib import Path

NUM_CLASSES: dict[str, int] = {
    "fmnist": 10, "mnist": 10, "emnist_letters": 10, "cifar10": 10, "cifar100": 100, "svhn": 10,
    "pathmnist": 9, "tissuemnist": 8, "cinic10": 10, "tinyimagenet": 200, "synthetic": 10,
}
"""Dataset name → number of classes: every dataset ``fltune.data.datasets`` loads."""

MODELS: tuple[str, ...] = (
    "mlp", "fedavg_cnn", "feddyn_cnn", "tinyimagenet_cnn", "resnet18", "resnet56", "vgg11", "sl_vit",
    "vib_cnn", "vib_mlp", "fedcr_cnn", "fedcr_mlp",
)
"""Names ``fltune.models.register_model`` accepts (one builder each)."""

_METHODS_DIR = Path(__file__).parent / "methods"
_NOT_METHODS = {"base", "compose", "finetune", "functional", "objective", "wire"}


def method_names() -> tuple[str, ...]:
    """Every registered method's name: one file per method in ``fltune/methods`` (``_`` files are bases)."""
    files = (p.stem for p in _METHODS_DIR.glob("*.py"))
    return tuple(sorted(f for f in files if not f.startswith("_") and f not in _NOT_METHODS))
