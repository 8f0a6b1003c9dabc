"""The compose stack and the image files parse, and point at files that exist (the stack itself
runs for real in tests/stack)."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import yaml

from rollwire.run.recipe import load_recipe

REPO = Path(__file__).resolve().parent.parent.parent
ROLES = {"inference": "replica", "env-worker": "env-worker", "scorer": "scorer", "trainer": "trainer",
         "dispatcher": "dispatcher"}


def _compose(name: str = "docker-compose.yml") -> dict:
    return yaml.safe_load((REPO / name).read_text())


def test_every_role_is_a_service_of_the_one_image_reading_the_prepared_recipe():
    services = _compose()["services"]
    assert {"kafka", "s3", "jaeger", "init", *ROLES} <= set(services)
    for service, role in ROLES.items():
        spec = services[service]
        assert spec["image"] == services["init"]["image"] and spec["profiles"] == ["cpu"]
        assert spec["command"] == [role, "/var/lib/rollwire/run/recipe.json"]
        assert spec["entrypoint"] == ["python", "-m", "rollwire.run.roles"]
    assert services["env-worker"]["network_mode"] == "service:inference"  # vLLM's control routes stay in there


def test_ports_are_published_on_loopback_only_and_mounts_exist():
    for name in ("docker-compose.yml", "deploy/compose.offline.yml"):
        for service in _compose(name)["services"].values():
            for port in service.get("ports", []):
                assert port.startswith("127.0.0.1:"), port
            for volume in service.get("volumes", []):
                source = volume.split(":")[0]
                if source.startswith("./"):
                    assert (REPO / source).exists(), f"{source} is mounted but missing"
            image = service.get("image", "")
            assert ":" in image and not image.endswith(":latest") or image.startswith("${ROLLWIRE_IMAGE")


def test_the_stack_recipe_loads_and_uses_the_stacks_services():
    recipe = load_recipe(REPO / "deploy/stack/demo.toml")
    assert recipe.bus.type == "kafka" and recipe.bus.bootstrap_servers == "kafka:19092"
    assert recipe.store.type == "s3" and recipe.store.endpoint == "s3:8333"
    assert recipe.telemetry.otlp_endpoint.startswith("http://jaeger:4318")
    assert recipe.inference.port == 8000 and recipe.inference.host == "127.0.0.1"
    demo = tomllib.loads((REPO / "rollwire/run/demo.toml").read_text())
    stack = tomllib.loads((REPO / "deploy/stack/demo.toml").read_text())
    for table in ("model", "warm_start", "environments", "scorer", "trainer"):
        assert stack[table] == demo[table], f"[{table}] of the stack's recipe differs from the demo's"


def test_image_requirements_expand_rollwires_own_extras():
    spec = importlib.util.spec_from_file_location("requirements", REPO / "deploy/docker/requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    found = module.requirements(pyproject, ["trainer"])
    assert "confluent-kafka>=2.6" in found and "minio>=7.2" in found  # from rollwire[kafka,objectstore]
    assert not any(r.startswith("rollwire") for r in found)
    assert found[: len(pyproject["project"]["dependencies"])] == pyproject["project"]["dependencies"]


def test_every_python_package_folder_is_listed_for_the_wheel():
    """`pyproject.toml` lists the packages (the design's folders are mapped under `rollwire`): a new
    subpackage left out installs in editable mode and is missing from every image and wheel."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((package, *parts)))
    assert found - set(setuptools["packages"]) == set(), "add these to [tool.setuptools] packages"
