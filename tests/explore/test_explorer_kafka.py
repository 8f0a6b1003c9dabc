"""`rollwire explore` on a run on Kafka, finished: its page, in Chromium, tells a dropped rollout's
reason and shows each sampled token's weight version, with the run stopped. The run refuses every
prompt longer than `max_rollout_tokens` allows (the longest digit strings), so some of its groups
are dropped as `errored`, as a real run's would be."""

from __future__ import annotations

import pytest
from explorer import browser, explorer, open_rollout, open_view, points, wait_for
from user_runs import finish, short_recipe, start_run

pytestmark = [pytest.mark.vllm, pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(1500)]

STEPS = 8
MAX_ROLLOUT_TOKENS = 10
"""Prompts are 7 to 10 characters (`r:` and 3 to 6 digits, between the start and `>`): those of 6
digits fill it, and their rollouts end errored (`too_long`)."""


@pytest.fixture(scope="module")
def kafka_run(tmp_path_factory, kafka_bootstrap):
    folder = tmp_path_factory.mktemp("explore-kafka")
    recipe = short_recipe("exk", STEPS).replace("[env_workers]\n", f"[env_workers]\nmax_rollout_tokens = {MAX_ROLLOUT_TOKENS}\n")
    (folder / "exk.toml").write_text(recipe)
    run_dir = folder / "exk"
    process = start_run(str(folder / "exk.toml"), "--run-dir", str(run_dir), "--bus", "kafka", "--bootstrap", kafka_bootstrap)
    output = finish(process, 1200)
    assert process.returncode == 0, output[-4000:]
    return run_dir


def test_a_dropped_rollout_shows_its_reason_and_tokens_their_versions_on_kafka(kafka_run):
    with explorer("--run-dir", str(kafka_run)) as url, browser() as driver:
        driver.get(url)
        wait_for(driver, lambda d: points(d, "chart-reward") == STEPS, 180, f"all {STEPS} steps on the reward curve")
        assert driver.find_element("id", "run-state").text == "✓ finished"  # the recipe's last step is on the log
        open_rollout(driver, fate="dropped", reason="errored")  # stale drops may come first
        reason = driver.find_element("id", "drop-reason").text
        assert "errored" in reason, reason
        assert "too_long" in driver.find_element("id", "rollout-detail").text  # its error, from its record
        open_rollout(driver, fate="trained")
        versions = [t.get_attribute("data-version") for t in driver.find_elements("css selector", "#tokens span.tok")]
        assert versions and all(v.isdigit() for v in versions), versions
        open_view(driver, "fleet")
        replica = wait_for(driver, lambda d: d.find_element("css selector", "#replica-table tbody tr"), 30, "the fleet on Kafka")
        assert replica.find_elements("tag name", "td")[2].text == str(STEPS)  # it serves the last version
        open_view(driver, "curves")
        assert points(driver, "chart-drops") >= 1
