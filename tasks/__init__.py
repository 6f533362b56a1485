"""Prefect tasks: thin wrappers, one library function each; retries, timeouts, tags and caching in decorators."""
