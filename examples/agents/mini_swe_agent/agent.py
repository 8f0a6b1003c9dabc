"""mini-swe-agent (https://mini-swe-agent.com), unmodified, as a rollout's agent program.

mini-swe-agent's own agent loop (`DefaultAgent`), its bash environment (`LocalEnvironment`: each
action a fresh `bash -c` in the working folder) and its litellm model, which sends every call, with
its `bash` tool, to the rollout's URL through litellm's `openai/` provider; the URL returns the
policy's calls as OpenAI `tool_calls` and records every token. The agent finishes as mini-swe-agent's
agents do: a command whose output begins with COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT submits the
rest of that output, and its last line is printed as the rollout's answer.

In a container (`[env_workers.container]`), mount the folder `install.py` fills at
/opt/mini-swe-agent; the working folder is /tmp/work (the container's only writable place), which a
grading command sees. The task row gives `prompt`, and may give `system` and `step_limit`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.environ.get("MINI_SWE_AGENT_SITE", "/opt/mini-swe-agent"))
WORK = Path(os.environ.get("MINI_SWE_AGENT_WORK", "/tmp/work"))
WORK.mkdir(parents=True, exist_ok=True)
os.environ.update(
    MSWEA_SILENT_STARTUP="1",                            # no banner on stdout: the last line is the answer
    MSWEA_GLOBAL_CONFIG_DIR=str(WORK.parent / ".mini-swe-agent"),  # the root filesystem is read-only
    MSWEA_COST_TRACKING="ignore_errors",                 # the policy has no price in litellm's table
    LITELLM_LOCAL_MODEL_COST_MAP="True")                 # and litellm must not fetch one: no network

import litellm  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

litellm.suppress_debug_info = True  # its notes go to stdout, where the answer goes

SYSTEM = ("You solve tasks with the bash tool. To finish, run echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT "
          "and then print your answer.")

task = json.loads(os.environ["ROLLWIRE_TASK"])
model = LitellmModel(model_name="openai/policy",
                     model_kwargs={"api_base": os.environ["OPENAI_BASE_URL"], "api_key": os.environ["OPENAI_API_KEY"]})
agent = DefaultAgent(model, LocalEnvironment(cwd=str(WORK), timeout=30),
                     system_template=task.get("system", SYSTEM), instance_template="{{task}}",
                     step_limit=int(task.get("step_limit", 8)))
result = agent.run(task["prompt"])
if result.get("exit_status") != "Submitted":
    sys.exit(f"mini-swe-agent stopped without submitting: {result.get('exit_status')}")
print(result.get("submission", "").strip())
