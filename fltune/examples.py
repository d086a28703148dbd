"""The examples every command's ``--help`` ends with (argparse ``epilog``), in one import-free place so the
parsers of several command modules read alike."""

EXAMPLES: dict[str, str] = {
    "run": """examples:
  fltune run --method fedavg --dataset fmnist --partition dirichlet_prior --alpha 0.5 --clients 100 \\
      --fraction 0.1 --rounds 10 --local-epochs 5 --seed 0 --json-out out.json
  fltune run --method fedprox --set method.mu=0.01 --rounds 20 --plan
  fltune run --method ditto --set partition.eval_fraction=0.3 --no-mlflow
""",
    "methods": """examples:
  fltune methods
  fltune methods fedprox
  fltune run --method scaffold --print-config
""",
    "tune": """examples:
  fltune tune --space search_spaces/fedprox.yaml
  fltune tune --space search_spaces/fedprox.yaml --num-samples 8 --seeds 2 --set federation.rounds=20
  fltune tune --space search_spaces/fedprox.yaml --resume
""",
    "tables": """examples:
  fltune tables
  fltune reproduce table2 --datasets fmnist --scale quick --plan
""",
    "reproduce": """examples:
  fltune reproduce table2 --datasets fmnist --scale quick
  fltune reproduce table2 --scale paper --seeds 3 --plan
  fltune reproduce table2 --resume
""",
    "compare": """examples:
  fltune compare --methods fedavg,fedprox,scaffold --dataset fmnist --rounds 50 --seeds 3
  fltune compare --methods fedavg,fedprox --tune-budget 12 --seeds 3 --plan
  fltune compare --methods fedavg,fedprox --resume
""",
    "sync": """examples:
  fltune sync mlruns/tracking-backlog
  fltune sync studies/fedprox-mu
  fltune sync studies/fedprox-mu --uri http://mlflow.internal:5000
""",
}
"""Command name → the text after its ``--help`` (used with ``argparse.RawDescriptionHelpFormatter``)."""
