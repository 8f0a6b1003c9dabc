"""The soak's report (`bench/soak.py`): the rate's fit over every minute and vLLM's own throughput read
from its log, on made-up rows whose answer is known."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("soak", Path(__file__).parents[2] / "bench" / "soak.py")
assert _SPEC is not None and _SPEC.loader is not None
soak = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(soak)

START = 1_800_000_000.0


def steps(rollouts_in_minute) -> list[dict]:
    """Metrics rows: `rollouts_in_minute(m)` rollouts trained in minute m, as 10 steps a minute."""
    rows = []
    for minute in range(60):
        for i in range(10):
            rows.append({"time_ms": 1000 * (START + 60 * minute + 6 * i), "rollouts": rollouts_in_minute(minute) / 10})
    return rows


def test_a_rate_that_falls_steadily_is_fitted_per_hour_of_its_value_at_the_warm_up_end():
    rows = steps(lambda minute: 1000 - 5 * (minute - 10))  # 1000 a minute at minute 10, 300 less an hour
    trend, spread, error = soak.rate_trend(rows, warm=600.0, first_step_at=START)
    assert trend == pytest.approx(-30.0, abs=0.1)
    assert spread > 0 and error == pytest.approx(0.0, abs=0.01)  # on the line: nothing left to err


def test_a_held_rate_fits_flat_whatever_its_noise():
    rows = steps(lambda minute: 1000 + (100 if minute % 2 else -100))
    trend, spread, error = soak.rate_trend(rows, warm=600.0, first_step_at=START)
    assert abs(trend) < 2.0
    assert spread == pytest.approx(10.0, abs=0.5)
    # +-10% a minute over 49 minutes: 10% / sqrt(sum of squared hours from their mean) ~ 6.2% an hour
    assert error == pytest.approx(6.2, abs=0.3)


def test_vllm_generation_throughput_is_read_from_each_servers_log(tmp_path: Path):
    def line(at: float, rate: float) -> str:
        clock = time.strftime("%m-%d %H:%M:%S", time.localtime(at))
        return (f"(APIServer pid=1) INFO {clock} [loggers.py:335] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
                f"Avg generation throughput: {rate} tokens/s, Running: 3 reqs\n")

    (tmp_path / "vllm.log").write_text("starting\n" + line(START, 800.0) + line(START + 10, 900.0))
    (tmp_path / "vllm-1.log").write_text(line(START + 5, 500.0))
    servers = soak.generation_rates(tmp_path, time.localtime(START).tm_year)
    assert [[rate for _, rate in points] for points in servers] == [[500.0], [800.0, 900.0]]
    assert soak._generation(servers, START, START + 20) == pytest.approx(850.0 + 500.0)
    assert soak._generation(servers, START + 100, START + 200) != soak._generation(servers, START + 100, START + 200)
