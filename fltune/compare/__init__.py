"""``cli.py compare``: methods side by side on one setting (same partition and sampling, seeds, tuning on a
validation split)."""
