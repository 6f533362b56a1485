"""Infrastructure shared by every stage: settings, config loading, artifact storage, tracking, processes.

Nothing in this package imports Prefect; heavy libraries (mlflow, fsspec backends) are imported lazily.
"""
