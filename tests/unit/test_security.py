"""What the code must never do with data from elsewhere, checked on the code itself; and where
secrets come from."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rollwire.core.errors import ConfigError
from rollwire.core.objectstore import S3StoreSettings

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("rollwire", "schemas", "producers", "streams", "consumers", "trainer", "deploy", "bench", "examples")
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "marshal", "shelve", "cloudpickle", "joblib"}


def _findings(path: Path) -> list[str]:
    """Each use of a deserializer that runs code, of eval/exec, of yaml.load without a safe loader,
    and of torch.load without weights_only=True, as `file:line what`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{where}:{node.lineno} imports {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append(f"{where}:{node.lineno} imports from {node.module}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            keywords = {k.arg: k.value for k in node.keywords}
            if isinstance(func, ast.Name) and name in ("eval", "exec"):
                found.append(f"{where}:{node.lineno} calls {name}")
            elif (owner, name) == ("yaml", "load") and not _names_safe_loader(keywords.get("Loader")):
                found.append(f"{where}:{node.lineno} calls yaml.load without a safe Loader")
            elif (owner, name) == ("yaml", "unsafe_load") or name == "read_pickle":
                found.append(f"{where}:{node.lineno} calls {owner}.{name}")
            elif (owner, name) == ("torch", "load") and not (
                    isinstance(keywords.get("weights_only"), ast.Constant) and keywords["weights_only"].value is True):
                found.append(f"{where}:{node.lineno} calls torch.load without weights_only=True (that is pickle)")
    return found


def _names_safe_loader(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in ("SafeLoader", "CSafeLoader")


def test_no_pickle_eval_or_unsafe_yaml_anywhere_in_the_code():
    files = [f for package in PACKAGES for f in (ROOT / package).rglob("*.py")]
    assert len(files) > 100  # the scan reads the code, not an empty folder
    findings = [line for f in files for line in _findings(f)]
    assert findings == []


def test_the_scan_sees_what_it_looks_for(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text("import pickle\nimport yaml, torch\nyaml.load(b)\ntorch.load(p)\neval('1')\n"
                   "torch.load(p, weights_only=True)\nyaml.load(b, Loader=yaml.SafeLoader)\n")
    assert [line.split(" ", 1)[1] for line in _findings(bad)] == [
        "imports pickle", "calls yaml.load without a safe Loader",
        "calls torch.load without weights_only=True (that is pickle)", "calls eval"]


def test_store_credentials_come_from_the_environment_or_files_never_from_settings(tmp_path):
    with pytest.raises(ValueError, match=r"never go in settings .*AWS_SECRET_ACCESS_KEY"):
        S3StoreSettings(secret_key="hunter2-hunter2")
    settings = S3StoreSettings()
    assert "hunter2" not in settings.model_dump_json()
    assert settings.credentials({"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}) == ("AKIA1", "s3cr3t")
    with pytest.raises(ConfigError, match=r"no S3 secret key: set \$AWS_SECRET_ACCESS_KEY"):
        settings.credentials({"AWS_ACCESS_KEY_ID": "AKIA1"})
    (tmp_path / "secret").write_text("from-a-file\n")
    from_files = S3StoreSettings(access_key_env="MY_KEY", secret_key_file=tmp_path / "secret")
    assert from_files.credentials({"MY_KEY": "AKIA2"}) == ("AKIA2", "from-a-file")
    with pytest.raises(ConfigError, match="cannot read the S3 secret key from"):
        S3StoreSettings(secret_key_file=tmp_path / "missing").credentials({"AWS_ACCESS_KEY_ID": "k"})
