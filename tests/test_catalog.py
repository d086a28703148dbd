"""The torch-free catalog names exactly what the dataset, model and method registries hold."""

from fltune import catalog
from fltune.data.datasets import DATASETS
from fltune.methods import METHODS
from fltune.models import MODELS


def test_datasets_models_and_methods_match_their_registries():
    assert set(catalog.NUM_CLASSES) == set(DATASETS)
    assert set(catalog.MODELS) == set(MODELS)
    assert set(catalog.method_names()) == set(METHODS)
