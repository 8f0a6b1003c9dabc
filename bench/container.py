"""What a rollout's container costs: the container runtime against the same agent as a bare process.

    python bench/container.py [--rollouts 20] [--gap-s 0] [--image local/python:3.11]

Runs an agent that makes one model call and prints its answer, `--rollouts` times one after
another, through
  - a bare Python process on the host, reaching the rollout's URL over TCP (the baseline: the
    least a separate process costs, no isolation),
  - the container runtime (`rollwire.producers.sandbox`: `docker run` with no network, limits,
    the Unix-socket relay), each container started when its rollout starts (`warm = 0`),
  - the same with a warm pool (`warm = 2`): containers started ahead, waiting for their rollout,
and prints seconds per rollout with the ratio to the baseline measured in this run. The model is
a stand-in that answers at once, so the figures are the runtime's own cost. Back to back
(`--gap-s 0`) the pool's next container starts while the rollout runs, on the same cores; a real
rollout's model time gives it room, as `--gap-s 1` does. Needs a running Docker
engine (`python deploy/stack/engine.py start`) and the image (`python deploy/stack/images.py
--only debian --only python`). The last line is `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rollwire.producers.harnesses import script_harness
from rollwire.producers.interception import Interceptor
from rollwire.producers.interception_server import InterceptionServer
from rollwire.producers.sandbox import Container, ContainerSettings
from rollwire.schemas import SamplingParams

AGENT = """
import json, os, urllib.request
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/completions",
                                 data=json.dumps({"model": "policy", "prompt": "r:12>"}).encode(),
                                 headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as response:
    print(json.loads(response.read())["choices"][0]["text"])
"""


class InstantModel:
    """Answers every call at once with two tokens (the runtime's cost, not the model's, is measured)."""

    def tokenize(self, text: str) -> list[int]:
        return [1] * len(text)

    def detokenize(self, ids: list[int]) -> str:
        return "21"

    def generate(self, prompt_ids, *, max_tokens, **_):
        return {"choices": [{"token_ids": [2, 1], "finish_reason": "stop",
                             "logprobs": {"content": [{"logprob": -0.1}] * 2}}]}


def seconds_per_rollout(run, rollouts: int, gap_s: float = 0.0) -> list[float]:
    times = []
    for _ in range(rollouts):
        time.sleep(gap_s)
        interceptor = Interceptor(InstantModel(), SamplingParams(max_tokens=4))
        started = time.perf_counter()
        answer = run(interceptor)
        times.append(time.perf_counter() - started)
        assert answer.strip() == "21" and len(interceptor.calls) == 1, (answer, interceptor.calls)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=20, help="rollouts per runtime (default %(default)s)")
    parser.add_argument("--gap-s", type=float, default=0.0,
                        help="idle seconds between rollouts, as a model's time would leave (default %(default)s)")
    parser.add_argument("--image", default="local/python:3.11", help="the container image (default %(default)s)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-container-"))
    folder.chmod(0o755)
    (folder / "agent.py").write_text(AGENT)
    (folder / "agent.py").chmod(0o644)

    server = InterceptionServer()
    bare = script_harness([sys.executable, str(folder / "agent.py")], server, timeout_s=60)
    baseline = seconds_per_rollout(lambda interceptor: bare({}, interceptor), args.rollouts, args.gap_s)
    server.shutdown()
    medians = {}
    for warm in (0, 2):
        runtime = Container(ContainerSettings(image=args.image, command=["python3", "/agents/agent.py"],
                                              mounts=[f"{folder}:/agents"], warm=warm))
        try:
            if warm:
                time.sleep(2.0)  # the pool's first containers up, as they are after a worker's first rollouts
            medians[warm] = statistics.median(seconds_per_rollout(
                lambda interceptor, runtime=runtime: runtime.run("-", {}, interceptor, timeout_s=60), args.rollouts,
                args.gap_s))
        finally:
            runtime.close()

    base, cold, warm = statistics.median(baseline), medians[0], medians[2]
    print(f"{args.rollouts} rollouts each, one at a time, {args.gap_s:g} s apart, median seconds per rollout")
    print(f"  bare process (baseline)            {base:.3f} s")
    for label, value in (("container runtime, warm = 0", cold), ("container runtime, warm = 2", warm)):
        print(f"  {label:<34} {value:.3f} s   {value / base:.1f}x the baseline, +{value - base:.3f} s")
    print(f"RESULT bare_s={base:.3f} container_s={cold:.3f} warm_s={warm:.3f} ratio={cold / base:.2f} "
          f"warm_ratio={warm / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
