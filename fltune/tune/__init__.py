"""fltune.tune: ``cli.py tune``, hyperparameter studies of a method with Ray Tune + Optuna, tracked in MLflow.

space.py (the search-space files) → spec.py (a resolved, saved study) → search.py (Optuna, ASHA) → trainable.py (one
trial: a federation per seed, reported per round, checkpointed) → board.py (terminal), mlflow_runs.py (MLflow parent +
children), results.py (status, ranking, CSV, figures), importance.py and confirm.py (after the search); the scaffold
every Tune job shares is ``fltune.jobs``."""
