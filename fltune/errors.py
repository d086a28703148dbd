"""User-facing errors.

Every bad input a user can make raises :class:`FLTuneError` with one line naming the field and what is
allowed; the CLI prints that line and exits with status 2, never a traceback.
"""


class FLTuneError(Exception):
    """A user error: bad config, missing data, impossible partition or resources."""


class DatasetMissing(FLTuneError):
    """The dataset's files are not where fltune looked for them."""


class DatasetCorrupt(FLTuneError):
    """A dataset file is there but unusable: truncated, not gzip, a wrong header or checksum, unreadable."""
