"""Who a run is: the names every component of one run must agree on, owned by the run's recipe
(`RunRecipe.identity`) and handed to each component as it starts (`rollwire.run.roles`).

    name      the run's name                       demo
    run_dir   where the run keeps its files        runs/demo       (log, weights, faust, caches, logs)
    prefix    its topics' prefix                   demo            demo.rollouts, demo.scored, ...
    policy    the policy's name                    policy          in the store, on `weights`, served by vLLM
    groups    each role's consumer group           demo-scorer     (`Topics.group`, the roles' commands too)

A component started by hand (`rollwire score`, `rollwire train`, ...) takes the same names from its
flags (`--prefix`, `--policy`, ...), so it joins the run it names.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from rollwire.schemas.topics import GroupRole, Topics


class RunIdentity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    run_dir: Path
    prefix: str
    policy: str = "policy"

    @property
    def topics(self) -> Topics:
        return Topics(self.prefix)

    def group(self, role: GroupRole) -> str:
        """The consumer group of `role` in this run (`<prefix>-<role>`)."""
        return self.topics.group(role)

    @property
    def faust_dir(self) -> Path:
        """Where the run's faust workers keep their local files."""
        return self.run_dir / "faust"

    def replica_cache(self, index: int) -> Path:
        """Replica `index`'s weight cache (and its vLLM server's pid file)."""
        return self.run_dir / ("replica-cache" if index == 0 else f"replica-cache-{index}")
