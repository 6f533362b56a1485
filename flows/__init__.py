"""Prefect flows: composition only (loops, branches, early stops) over tasks; presets in flows/configs."""
