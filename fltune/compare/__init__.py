"""``cli.py compare``: methods side by side on one setting (same partition and sampling, seeds, tuning on a
validation split)."""

import sys

from fltune.api import CommandModule

sys.modules[__name__].__class__ = CommandModule  # ``fltune.compare(...)`` is ``fltune.api.compare``
