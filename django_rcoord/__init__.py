"""Redis coordination for Django: locks, semaphores, autocomplete, task queues."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

# One source of truth: the version in pyproject.toml, as installed.
try:
    __version__ = _distribution_version("django-rcoord")
except PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
