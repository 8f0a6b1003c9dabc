"""Environments people bring: tasksets found by entry point (an installed package's) or by a
reference (`module:Class`, a file), and the package `rollwire env init` writes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rollwire.core.errors import ConfigError
from rollwire.core.registry import Registry
from rollwire.producers.tasksets import ENTRY_POINTS, TASKSETS, RolloutView, Taskset, load_taskset

SORTING = '''
from rollwire.producers.tasksets import Taskset, reward

class Sorting(Taskset):
    name = "sorting"
    def __init__(self, *, size: int = 3) -> None:
        self.size = size
    def rows(self):
        yield {"task_id": "s-0", "prompt": "3 1 2 ->", "answer": "1 2 3"}
    @reward("sorted")
    def sorted(self, r):
        return float(r.completion.strip() == r.task["answer"])
'''


def test_a_file_and_a_module_reference_load_the_taskset_they_name(tmp_path, monkeypatch):
    (tmp_path / "sorting_env.py").write_text(SORTING)
    by_file = load_taskset(str(tmp_path / "sorting_env.py"), size=4)
    assert type(by_file).__name__ == "Sorting" and by_file.size == 4
    assert TASKSETS.get(f"{tmp_path / 'sorting_env.py'}:Sorting") is type(by_file)
    monkeypatch.syspath_prepend(str(tmp_path))
    by_module = load_taskset("sorting_env:Sorting")
    row = next(iter(by_module.rows()))
    assert by_module.judge(RolloutView(task=row, completion="1 2 3")).reward == 1.0
    with pytest.raises(ConfigError, match="has no option 'sise'.*did you mean 'size'"):
        load_taskset("sorting_env:Sorting", sise=3)


def test_a_bad_reference_names_what_to_change(tmp_path):
    (tmp_path / "two.py").write_text(SORTING + "\nclass Other(Sorting):\n    name = 'other'\n")
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    cases = {str(tmp_path / "missing.py"): "no such file",
             f"{tmp_path / 'two.py'}:Sortng": "has no 'Sortng' \\(did you mean 'Sorting'\\?\\)",
             str(tmp_path / "two.py"): "defines 2 tasksets \\(Sorting, Other\\); name one",
             str(tmp_path / "broken.py"): "failed to import: ModuleNotFoundError",
             "no_such_package.envs:Thing": "cannot import 'no_such_package.envs'.*install the package",
             "json:dumps": "dumps is not a taskset",
             "reverse-digit": "unknown taskset 'reverse-digit'.*did you mean 'reverse-digits'"}
    for name, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            TASKSETS.get(name)


def test_entry_points_of_installed_packages_are_found_by_name(tmp_path, monkeypatch):
    """A package's `[project.entry-points."rollwire.environments"]`, as installed metadata on sys.path."""
    (tmp_path / "sorting_pkg.py").write_text(SORTING)
    info = tmp_path / "sorting_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sorting-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINTS}]\nsorting = sorting_pkg:Sorting\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("taskset", entry_points=ENTRY_POINTS,
                        accepts=lambda item: isinstance(item, type) and issubclass(item, Taskset))
    assert "sorting" in registry.names()
    assert registry.get("sorting").__module__ == "sorting_pkg"
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINTS}]\nbad = sorting_pkg:Nothing\n")
    fresh = Registry("taskset", entry_points=ENTRY_POINTS)
    with pytest.raises(ConfigError, match="entry point 'bad' .* of the installed package sorting-pkg .* failed to load"):
        fresh.names()


def test_env_init_writes_a_package_whose_taskset_and_test_work(tmp_path):
    folder = tmp_path / "my-adder"
    done = subprocess.run([sys.executable, "-m", "rollwire", "env", "init", "my-adder", "--dir", str(folder)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    pyproject = (folder / "pyproject.toml").read_text()
    assert '[project.entry-points."rollwire.environments"]\nmy-adder = "my_adder.taskset:MyAdder"' in pyproject
    taskset = load_taskset(f"{folder / 'src/my_adder/taskset.py'}:MyAdder", seed=2, largest=5)
    rows = [row for _, row in zip(range(20), taskset.rows())]
    assert all(int(a) + int(b) == int(row["answer"]) and int(a) <= 5
               for row in rows for a, b in [row["prompt"].removeprefix("<|bos|>").rstrip("=").split("+")])
    assert taskset.group_rewards == [{"name": "shortest_correct", "bonus": 0.1, "correct": "exact_match"}]
    site = tmp_path / "site-packages"  # installed as pip installs it, beside (not into) the test environment
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--target",
                    str(site), str(folder)], check=True, capture_output=True)
    listed = subprocess.run([sys.executable, "-m", "rollwire", "env", "list"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200"})
    assert "my-adder" in listed.stdout and "my_adder.taskset:MyAdder" in listed.stdout, listed.stdout
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=folder,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)})
    assert test.returncode == 0, test.stdout[-2000:]
    again = subprocess.run([sys.executable, "-m", "rollwire", "env", "init", "my-adder", "--dir", str(folder)],
                           capture_output=True, text=True)
    assert again.returncode != 0 and "is not empty: choose another --dir" in again.stderr


@pytest.mark.parametrize("name", ["My-Env", "2fast", "a--b", "class", "with space"])
def test_env_init_refuses_a_name_that_cannot_name_a_package(tmp_path, name):
    from rollwire.producers.env_package import write_package
    with pytest.raises(ConfigError, match="use lowercase letters, digits and single dashes"):
        write_package(name, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_the_template_reads_as_a_user_would_write_it():
    from rollwire.producers import env_package
    source = env_package.TASKSET.format(name="x", module="x", cls="X")
    compile(textwrap.dedent(source), "taskset.py", "exec")
