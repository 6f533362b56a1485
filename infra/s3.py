"""S3 access for ``infra.artifacts`` through fsspec/s3fs: options from the environment or a secret store.

``infra.artifacts`` opens ``s3://`` URIs with fsspec, so S3 needs no code path of its own: this module only puts
the endpoint and credentials into fsspec's per-protocol config. Sources, in order: explicit values, then
``SEARCHLOOP_S3_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` and the standard AWS variables
(which boto also reads by itself). A Prefect Secret block can supply the same fields (see ``tasks.ops``).
Credentials are ``SecretStr`` and never appear in ``describe()`` or logs. Region goes through the environment
(``AWS_DEFAULT_REGION``), not ``client_kwargs``: a region there makes ``mkdir`` send a LocationConstraint that
us-east-1 endpoints (and moto) reject.
"""

from __future__ import annotations

import logging
import os

from pydantic import Field, SecretStr

from infra.config import StrictModel

log = logging.getLogger(__name__)


class S3Options(StrictModel):
    """Endpoint and credentials for s3fs."""

    endpoint_url: str | None = Field(default=None, description="S3 endpoint (MinIO, moto); None = AWS.")
    key: SecretStr | None = Field(default=None, description="Access key id (None: boto's default chain).")
    secret: SecretStr | None = Field(default=None, description="Secret access key.")
    anon: bool = Field(default=False, description="Anonymous access (public buckets).")

    def storage_options(self) -> dict:
        """Keyword arguments for ``s3fs.S3FileSystem`` (contains secrets: do not log)."""
        opts: dict = {"anon": self.anon}
        if self.endpoint_url:
            opts["client_kwargs"] = {"endpoint_url": self.endpoint_url}
        if self.key and self.secret:
            opts["key"] = self.key.get_secret_value()
            opts["secret"] = self.secret.get_secret_value()
        return opts


def options_from_env(env: dict[str, str] | None = None) -> S3Options:
    """Read S3 options from environment variables (``os.environ`` by default)."""
    e = os.environ if env is None else env
    endpoint = e.get("SEARCHLOOP_S3_ENDPOINT_URL") or e.get("AWS_ENDPOINT_URL_S3") or e.get("AWS_ENDPOINT_URL")
    key, secret = e.get("AWS_ACCESS_KEY_ID"), e.get("AWS_SECRET_ACCESS_KEY")
    return S3Options(endpoint_url=endpoint, key=SecretStr(key) if key else None,
                     secret=SecretStr(secret) if secret else None)


def describe(options: S3Options) -> str:
    """A log-safe one-line description (no credentials)."""
    creds = "explicit key" if options.key else ("anonymous" if options.anon else "default credential chain")
    return f"s3 endpoint={options.endpoint_url or 'aws'} credentials={creds}"


def configure(options: S3Options | None = None) -> S3Options:
    """Make every later ``s3://`` access in this process use ``options`` (default: from the environment)."""
    import fsspec

    opts = options or options_from_env()
    fsspec.config.conf["s3"] = opts.storage_options()
    try:
        from s3fs import S3FileSystem

        S3FileSystem.clear_instance_cache()
    except ImportError:
        log.warning("s3fs is not installed; s3:// URIs will fail (pip install s3fs)")
    log.info("configured %s", describe(opts))
    return opts
