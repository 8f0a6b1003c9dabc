"""The recipes for real models (recipes/): each loads and validates with no network and prints with
`--print-recipe`. A recipe naming hub models runs its loading path on local stand-ins for the hub
model and dataset; one naming a GGUF file names the one `deploy/models/fetch.py` fetches (its run on
the real model is `tests/inference/test_real_model.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollwire.producers.tasksets import load_taskset
from rollwire.run.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.toml"))
HUB_RECIPES = [path for path in RECIPES if not load_recipe(path).model.path.endswith(".gguf")]


def test_there_are_recipes():
    assert RECIPES, "recipes/ holds no recipe"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_a_recipe_loads_and_prints_without_the_network(path):
    recipe = load_recipe(path)
    if recipe.model.path.endswith(".gguf"):  # a file the repository's fetch script brings, from the repository root
        sys.path.insert(0, str(REPO / "deploy" / "models"))
        from fetch import CACHE, MODELS
        assert any(REPO / recipe.model.path == CACHE / Path(member).name for _, member in MODELS.values())
    else:
        assert recipe.model.path and not Path(recipe.model.path).exists()  # a hub name, for the user's machine
    printed = subprocess.run([sys.executable, "-m", "rollwire", "run", str(path), "--print-recipe"],
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert f'path = "{recipe.model.path}"' in printed.stdout


@pytest.mark.parametrize("path", HUB_RECIPES, ids=lambda p: p.stem)
def test_a_recipes_model_and_data_load_from_local_stand_ins(path, tmp_path):
    from rollwire.trainer.model import ModelSettings, load_policy
    from rollwire.trainer.tiny import build_bpe_tokenizer, build_tiny_model
    stand_in = build_tiny_model(tmp_path / "model", build_bpe_tokenizer(), architecture="qwen3", tie_embeddings=True)
    rows = tmp_path / "gsm8k.jsonl"
    rows.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"... #### {2 * i}"}) + "\n"
                            for i in range(5)))
    recipe = load_recipe(path, **{"model.path": str(stand_in)})
    environment = recipe.environments[0]
    taskset = load_taskset(environment.name, **{**environment.options, "path": str(rows), "config": None})
    first = next(iter(taskset.rows()))
    assert first["reference"] == 0.0 and first["messages"][0]["content"] == "What is 0 + 0?"
    model = load_policy(ModelSettings(path=recipe.trainer.model.path))
    assert model.config.tie_word_embeddings and recipe.inference.model == str(stand_in)
