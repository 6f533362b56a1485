"""The ``searchloop run ...`` command group, shared by the training flows (``em-loop`` here, ``rl`` elsewhere).

Modules that add a ``run`` sub-command import ``run_app`` and attach their command to it; this module's
``register`` adds the group to the root app once.
"""

from __future__ import annotations

import typer

run_app = typer.Typer(help="Run a training flow from a preset (EM loop, RL).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``run`` group to the root CLI."""
    app.add_typer(run_app, name="run")
