"""Paper tables, one module per paper; importing a module registers its tables."""

from fltune.reproduce.papers import fedalign, fedsol, man, simfafl  # noqa: F401
