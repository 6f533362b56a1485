"""The cluster files in infra/compose parse and are consistent (Docker cannot run here: syntax and references only;
the job templates are also checked with Prefect's own validator and, in a slow test, by a real server)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
import yaml

from infra.stack import COMPOSE_DIR

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted(COMPOSE_DIR.glob("base-job-template-*.json"))


def test_compose_file_parses_and_is_complete():
    spec = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
    services = spec["services"]
    assert {"prefect-server", "prefect-db", "mlflow", "mlflow-db", "minio", "worker-cpu", "worker-gpu"} <= set(services)
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond localhost"
        if "build" in svc:
            assert (REPO / svc["build"]["dockerfile"]).exists(), f"{name}: missing {svc['build']['dockerfile']}"
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "postgresql+asyncpg://" in services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert "--artifacts-destination s3://" in services["mlflow"]["command"]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_base_job_templates_pass_prefect_validation(path: Path):
    from prefect.server.schemas.actions import WorkPoolCreate

    template = orjson.loads(path.read_bytes())
    pool_type = "docker" if "docker" in path.stem else "kubernetes"
    WorkPoolCreate(name=f"gpu-{pool_type}", type=pool_type, base_job_template=template)
    used = set(re.findall(r"{{\s*(\w+)\s*}}", orjson.dumps(template["job_configuration"]).decode()))
    assert "gpus" in used and used <= set(template["variables"]["properties"])


def test_dockerfiles_use_tagged_base_images():
    for name in ("Dockerfile.worker", "Dockerfile.gpu-worker", "Dockerfile.mlflow"):
        bases = re.findall(r"^FROM (\S+)", (COMPOSE_DIR / name).read_text(), flags=re.M)
        assert bases and all(":" in b and not b.endswith(":latest") for b in bases), f"{name}: {bases}"
