"""Prefect tasks: thin wrappers, one library function each; retries, timeouts, tags and caching in decorators.

Importing the task layer wires the library's hooks to Prefect: MLflow runs and flow runs link both ways
(``tasks.links``) and long loops report progress as Prefect progress artifacts and timer lines in the run's log
(``tasks.progress``).
"""

from tasks.links import install as _install_links
from tasks.progress import install as _install_progress

_install_links()
_install_progress()
