"""The whole suite as `make test` (and so CI) runs it: the whole-run tier (`tests/run`: `rollwire run`
as a user runs it, each run with its own vLLM servers) in one pytest process, every other tier in
another, side by side. Much of either is waiting (servers starting, brokers answering, images
building), which the other fills, so the suite takes about the longer of the two rather than their
sum. Each process starts the services it needs (a Kafka broker each; the vLLM servers are the
tests' own); the whole-run tier's output is printed after the other's.

    python tests/tiers.py [PYTEST_ARGS...]     # PYTEST_ARGS go to both processes

Exit status: non-zero when either process failed, or when no test ran at all. The last line counts both: `tests: N passed,
N failed, N skipped`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
APART = "tests/run"


def _pytest(args: list[str], junit: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", f"--junitxml={junit}", *args], cwd=REPO, **popen)


def _counts(junit: Path) -> dict[str, int]:
    """passed, failed, skipped from a JUnit XML report (errors count as failed)."""
    if not junit.exists():
        return {"passed": 0, "failed": 1, "skipped": 0}  # the process died before writing it
    suites = ElementTree.parse(junit).getroot()
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for suite in suites.iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
    failed = totals["failures"] + totals["errors"]
    return {"passed": totals["tests"] - failed - totals["skipped"], "failed": failed, "skipped": totals["skipped"]}


def main(argv: list[str]) -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rollwire-tiers-") as folder:
        work = Path(folder)
        apart_log = open(work / "run-tier.log", "wb")
        apart = _pytest([APART, "--durations=15", *argv], work / "run-tier.xml", stdout=apart_log,
                        stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": os.environ.get("COLUMNS", "120")})
        rest = _pytest([f"--ignore={APART}", "--durations=30", *argv], work / "rest.xml")
        rest_code = rest.wait()
        rest_s = time.monotonic() - started
        apart_code = apart.wait()
        apart_s = time.monotonic() - started
        apart_log.close()
        print(f"\n{'=' * 30} {APART} (run beside the other tiers) {'=' * 30}", flush=True)
        sys.stdout.buffer.write((work / "run-tier.log").read_bytes())
        counts = [_counts(work / "rest.xml"), _counts(work / "run-tier.xml")]
    total = {key: sum(c[key] for c in counts) for key in ("passed", "failed", "skipped")}
    print(f"\nwall time: the other tiers {rest_s / 60:.1f} min, {APART} {apart_s / 60:.1f} min; "
          f"in all {(time.monotonic() - started) / 60:.1f} min")
    print(f"tests: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    # 5: the arguments selected no test in that process (the other may have some)
    ok = all(code in (0, 5) for code in (rest_code, apart_code)) and total["passed"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
