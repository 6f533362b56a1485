"""CLI command groups; each module exposes ``register(app)`` and imports heavy code inside commands."""
