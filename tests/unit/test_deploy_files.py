"""The compose stack and deploy configs parse and point at files that exist."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent.parent


def test_compose_file_mounts_only_files_in_the_repository():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert {"kafka", "s3", "otel-collector", "jaeger"} <= set(compose["services"])
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{source} is mounted but missing"
        assert ":" in service["image"] and not service["image"].endswith(":latest")
    yaml.safe_load((REPO / "deploy/otel/collector.yaml").read_text())
