"""fltune.jobs: the scaffold every Ray Tune job of fltune shares (a study, its confirmation, a paper-table
reproduction, a comparison's tuning studies and cells): scaffold.py (checks before Ray, Ray start, the fit,
``--resume``, clean exits, the MLflow parent), tuner.py (trials' placement groups, the Tuner's run settings),
storage.py (job folders written whole)."""
