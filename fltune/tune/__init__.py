"""fltune.tune: ``cli.py tune``, hyperparameter studies of a method with Ray Tune + Optuna, tracked in MLflow.

space.py (the search-space files) → spec.py (a resolved, saved study) → study.py (resources, Tuner) →
trainable.py (one trial: a federation per seed, reported per round, checkpointed) → board.py (terminal),
tracking.py (MLflow parent + children), results.py (status, ranking, CSV, sensitivity plot, best YAML).
"""

import sys

from fltune.api import CommandModule

sys.modules[__name__].__class__ = CommandModule  # ``fltune.tune(...)`` is ``fltune.api.tune``
