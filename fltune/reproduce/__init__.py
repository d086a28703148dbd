"""fltune.reproduce"""

import sys

from fltune.api import CommandModule

sys.modules[__name__].__class__ = CommandModule  # ``fltune.reproduce(...)`` is ``fltune.api.reproduce``
