"""A run recipe: one TOML file that says everything `rollwire run` starts, and how.

    rollwire run                      # the bundled demo (rollwire/run/demo.toml)
    rollwire run my-recipe.toml       # any recipe; every table is optional

Each component reads its own settings from the same resolved recipe (`<run_dir>/recipe.json`),
so what the supervisor started and what each process used cannot disagree. Paths in a recipe
are relative to the working directory.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollwire.consumers.vllm_server import VllmServerSettings
from rollwire.core.bus.settings import BusSettings, EmbeddedBusSettings
from rollwire.core.errors import ConfigError
from rollwire.core.identity import RunIdentity
from rollwire.core.objectstore import LocalStoreSettings, StoreSettings
from rollwire.core.telemetry import TelemetrySettings
from rollwire.producers.dispatcher import DispatcherSettings, EnvironmentMix
from rollwire.producers.env_worker import EnvWorkerSettings
from rollwire.producers.environment import EnvironmentSetup
from rollwire.producers.feedback_api import FeedbackApiSettings
from rollwire.producers.gateway import GatewaySettings
from rollwire.producers.tasksets import TASKSETS, check_taskset
from rollwire.schemas.topics import GroupRole
from rollwire.streams.feedback_join import FeedbackJoinSettings
from rollwire.streams.scoring import ScorerSettings
from rollwire.trainer.settings import TrainerSettings, WarmStartSettings

DEMO = "demo.toml"
"""The bundled demo recipe, next to this module."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class TinyModelSettings(_Section):
    """A tiny model and its tokenizer built locally (`rollwire.trainer.tiny`): a Llama with a
    character tokenizer by default; `architecture = "qwen2"`, `tokenizer = "bpe"`, `tie_embeddings =
    true` give the shape of Qwen2.5."""

    architecture: Literal["llama", "qwen2", "qwen3"] = "llama"
    """Model family (transformers' Llama, Qwen2 or Qwen3 classes, randomly initialised)."""
    tokenizer: Literal["char", "bpe"] = "char"
    """`char`: one token per character; `bpe`: byte-level BPE trained here on a small corpus."""
    hidden: int = Field(default=128, ge=8)
    """Hidden size."""
    layers: int = Field(default=2, ge=1)
    """Decoder layers."""
    heads: int = Field(default=4, ge=1)
    """Attention heads."""
    kv_heads: int = Field(default=2, ge=1)
    """Key/value heads (grouped-query attention)."""
    intermediate: int = Field(default=256, ge=8)
    """MLP width."""
    tie_embeddings: bool = False
    """Tie the output layer to the input embeddings, as Qwen2.5/3 and Llama-3.2 do (replicas reload
    such models with `rollwire.consumers.vllm_worker`, which keeps the tie)."""
    seed: int = 0
    """Seed of the random initial weights."""


class ModelRecipe(_Section):
    """The policy's starting weights: a local directory or hub name, or a tiny model built here."""

    path: str | None = None
    """Starting weights: a directory or hub name; a `.gguf` file, imported once into `<run_dir>/base`
    (`rollwire model import`); None builds `tiny` there."""
    tiny: TinyModelSettings = Field(default_factory=TinyModelSettings)
    """The tiny model to build when `path` is not set."""


class WarmStartRecipe(WarmStartSettings):
    """Supervised warm start on an environment's scripted teacher, before RL (`steps = 0`: none)."""

    steps: int = Field(default=0, ge=0)
    """Optimizer steps; 0 skips the warm start."""
    environment: str | None = None
    """Environment whose teacher writes the examples; default: the first environment."""


class EnvironmentRecipe(EnvironmentMix, EnvironmentSetup):
    """One environment of the run: the dispatcher's mix entry, the taskset's options, and the harness
    and runtime its rollouts run in (`rollwire.producers.environment`)."""

    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the taskset, e.g. `{ seed = 1 }`; checked against the taskset."""

    @model_validator(mode="after")
    def _taskset_accepts(self) -> EnvironmentRecipe:
        check_taskset(self.name, self.options)
        self.check(TASKSETS.get(self.name), self.name)
        return self

    def setup(self) -> EnvironmentSetup:
        return EnvironmentSetup(**{k: getattr(self, k) for k in EnvironmentSetup.model_fields})


class EnvWorkersRecipe(EnvWorkerSettings):
    """Every env worker of the run (one consumer group): the worker's settings, and how many."""

    count: int = Field(default=1, ge=1)
    """Env worker processes."""

    def for_worker(self, index: int) -> EnvWorkerSettings:
        return EnvWorkerSettings(**self.model_dump(exclude={"count", "name"}), name=f"env-worker-{index}")


class InferenceRecipe(VllmServerSettings):
    """The managed vLLM servers (`replicas` of them, the same settings each). Their model is
    `[model]`'s; `dtype = "auto"` here means the trainer's dtype (float32 on CPU, bfloat16 on CUDA),
    so that sampler and trainer logprobs agree (vLLM's own `auto` picks bfloat16 on a CPU)."""

    model: str = ""
    """Filled in from `[model]`; leave unset."""
    replicas: int = Field(default=1, ge=1)
    """Inference replicas. Env workers route each rollout's calls over them by weight version
    (`rollwire.producers.routing`); each holds a whole vLLM server (about 3 GB for the tiny model)."""
    replica_ports: list[int] = Field(default_factory=list)
    """Filled in when the run starts (replica i on `port + i`, or free ports); leave unset."""
    stage_weights: bool = True
    """Read each new version into host memory while the replica still serves, so that its pause only
    copies it in (one more copy of the weights in host memory meanwhile); false reads inside the pause."""
    direct_weights: bool = True
    """Receive a version from the trainer's memory when it offers that (`[trainer.direct] enabled`),
    with no object-store read; false always fetches from the store."""


class FeedbackRecipe(_Section):
    """Production feedback in the run: `enabled = true` starts the serving gateway in front of the
    replica (`rollwire serve`), the feedback ingestion API (`rollwire feedback serve`) and the
    joiner (`rollwire join`). The trainer mixes what they make into its batches by `[trainer.feedback]`."""

    enabled: bool = False
    """Start the gateway, the ingestion API and the joiner."""
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    """The serving gateway (`[feedback.gateway]`); `upstream` and `model` are the replica's, filled in."""
    ingest: FeedbackApiSettings = Field(default_factory=FeedbackApiSettings)
    """The feedback ingestion API (`[feedback.ingest]`)."""
    join: FeedbackJoinSettings = Field(default_factory=FeedbackJoinSettings)
    """The joiner (`[feedback.join]`); `tokenizer` defaults to the policy's."""


class RunRecipe(_Section):
    """Everything `rollwire run` starts. Each table is a component's own settings model."""

    name: str = Field(default="demo", pattern=r"^[A-Za-z0-9_-]+$")
    """Name of the run: the default run directory and topic prefix."""
    run_dir: Path = Path("runs/<name>")
    """Where the run keeps its log, weights, checkpoints, metrics and plots; default `runs/<name>`."""
    prefix: str | None = None
    """Topic prefix; default: the run's name (each run its own topics)."""
    policy: str = Field(default="policy", pattern=r"^[A-Za-z0-9_.-]+$")
    """The policy's name, the one every component uses: the weights' name in the store and on the
    `weights` topic (the trainer's `policy`), the model name the replicas serve (`inference.
    served_model_name`) and the gateway forwards. Set it here, not on a component."""
    steps: int = Field(default=100, ge=1)
    """Trainer steps; the run ends after the last one."""
    stall_after_s: float = Field(default=300.0, gt=0)
    """With no trainer step for this long, the run says which stage stopped first (display and log)."""
    model: ModelRecipe = Field(default_factory=ModelRecipe)
    """The policy's starting weights."""
    warm_start: WarmStartRecipe = Field(default_factory=WarmStartRecipe)
    """Supervised warm start before RL."""
    environments: list[EnvironmentRecipe] = Field(min_length=1)
    """The dispatcher's mix; every env worker runs all of them."""
    dispatcher: DispatcherSettings = Field(default_factory=DispatcherSettings)
    """The dispatcher (its budget is the trainer's `[trainer.batch]`)."""
    env_workers: EnvWorkersRecipe = Field(default_factory=EnvWorkersRecipe)
    """The env workers."""
    scorer: ScorerSettings = Field(default_factory=ScorerSettings)
    """The group scorer."""
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    """The trainer; `model.path` and `checkpoint_dir` default to the run's."""
    trainer_threads: int = Field(default=1, ge=1)
    """torch CPU threads of the trainer process (on a small CPU the inference server needs the rest)."""
    inference: InferenceRecipe = Field(default_factory=InferenceRecipe)
    """The managed vLLM server."""
    bus: BusSettings = Field(default_factory=EmbeddedBusSettings)
    """The event log: `type = "embedded"` (default path `<run_dir>/log`) or `"kafka"`."""
    store: StoreSettings = Field(default_factory=LocalStoreSettings)
    """Weights: `type = "local"` (default root `<run_dir>/weights`) or `"s3"`."""
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    """Where spans go (`exporter = "otlp"`, `"console"`, `"file"` with `file_path`, or `"none"`), where
    metrics go (`[telemetry.metrics]`), and the trackers each trainer step goes to (`report_to`)."""
    feedback: FeedbackRecipe = Field(default_factory=FeedbackRecipe)
    """Production traffic and its feedback as training data (off by default)."""

    @model_validator(mode="after")
    def _resolve(self) -> RunRecipe:
        """Fills in what derives from the run (paths, the model), and refuses what cannot run."""
        if "run_dir" not in self.model_fields_set:
            self.run_dir = Path("runs") / self.name
        if "path" not in self.bus.model_fields_set and isinstance(self.bus, EmbeddedBusSettings):
            self.bus = self.bus.model_copy(update={"path": self.run_dir / "log"})
        if "root" not in self.store.model_fields_set and isinstance(self.store, LocalStoreSettings):
            self.store = self.store.model_copy(update={"root": self.run_dir / "weights"})
        for section, field, own in (("trainer", "policy", self.trainer), ("inference", "served_model_name", self.inference)):
            value = getattr(own, field)
            if field in own.model_fields_set and value != self.policy:
                raise ValueError(f"{section}.{field} = {value!r} differs from the run's policy {self.policy!r}: a run's "
                                 f"policy has one name; set `policy = {value!r}` at the top of the recipe instead")
        trainer: dict[str, Any] = {"model": self.trainer.model.model_copy(update={"path": self.base_model}),
                                   "policy": self.policy}
        if "checkpoint_dir" not in self.trainer.model_fields_set:
            trainer["checkpoint_dir"] = self.run_dir / "trainer"
        self.trainer = self.trainer.model_copy(update=trainer)
        inference: dict[str, Any] = {"model": self.base_model, "enable_lora": self.trainer.model.lora is not None,
                                     "served_model_name": self.policy}
        if self.inference.log_path is None:
            inference["log_path"] = self.run_dir / "logs" / "vllm.log"
        self.inference = self.inference.model_copy(update=inference)
        if not self.feedback.join.tokenizer:
            self.feedback.join = self.feedback.join.model_copy(update={"tokenizer": self.base_model})
        names = [e.name for e in self.environments]
        if self.warm_start.steps and self.warm_start.environment not in (None, *names):
            raise ValueError(f"warm_start.environment = {self.warm_start.environment!r} is not one of the "
                             f"recipe's environments ({', '.join(names)})")
        if self.trainer.batch.batch_rollouts is None:
            raise ValueError("trainer.batch.batch_rollouts must be set in a run: the dispatcher paces work in "
                             "rollouts (batch_tokens may still cap a step)")
        return self

    # -- what each component gets -------------------------------------------------------------

    @property
    def base_model(self) -> str:
        """What the trainer and the servers load: the recipe's model, or `<run_dir>/base` where the run
        builds it (a tiny model, or the import of a GGUF file)."""
        if self.model.path and not self.model.path.endswith(".gguf"):
            return self.model.path
        return str(self.run_dir / "base")

    @property
    def topic_prefix(self) -> str:
        return self.prefix or self.name

    @property
    def identity(self) -> RunIdentity:
        """The names every component of this run agrees on (`rollwire.core.identity`)."""
        return RunIdentity(name=self.name, run_dir=self.run_dir, prefix=self.topic_prefix, policy=self.policy)

    def server_port(self, index: int = 0) -> int:
        """Replica `index`'s server port. Apart from `server_settings`, which resolves the dtype with
        torch: the supervisor, which lives as long as the run, only needs the port."""
        return self.inference.replica_ports[index] if self.inference.replica_ports else self.inference.port

    def server_settings(self, index: int = 0) -> VllmServerSettings:
        """Replica `index`'s server: this recipe's `[inference]` on that replica's port, its own log
        (`vllm.log`, `vllm-1.log`, ...), with `dtype = "auto"` resolved to the trainer's."""
        dtype = self.inference.dtype
        if dtype == "auto":
            from rollwire.trainer.model import resolve_device
            dtype = str(resolve_device(self.trainer.model)[1]).removeprefix("torch.")
        own: dict[str, Any] = {"dtype": dtype, "port": self.server_port(index)}
        if index and self.inference.log_path is not None:
            own["log_path"] = self.inference.log_path.with_name(f"{self.inference.log_path.stem}-{index}.log")
        settings = self.inference.model_dump(exclude={"replicas", "replica_ports", "stage_weights", "direct_weights", *own})
        return VllmServerSettings(**settings, **own)

    def group_id(self, role: GroupRole) -> str:
        """The consumer group of a role (on Kafka the faust roles' app id, which is their group):
        `Topics.group`, the one spelling the roles' own commands use too."""
        if role == "env-worker" and self.env_workers.group_id:
            return self.env_workers.group_id
        return self.identity.group(role)

    def consumer_groups(self) -> list[tuple[str, str]]:
        """(group id, topic) of every consumer group of the run, for its lag (`rollwire.core.metrics.LagProbe`).
        The trainer keeps its positions in its checkpoint, not in a group: it reports its own lag."""
        topics = self.identity.topics
        groups = [(self.group_id("env-worker"), topics.tasks), (self.group_id("scorer"), topics.rollouts)]
        if self.feedback.enabled:
            groups += [(self.group_id("joiner"), topics.served), (self.group_id("joiner"), topics.feedback)]
        return groups

    def warm_start_environment(self) -> EnvironmentRecipe:
        name = self.warm_start.environment or self.environments[0].name
        return next(e for e in self.environments if e.name == name)

    def telemetry_for(self, component: str) -> TelemetrySettings:
        """The run's telemetry settings, named for `component`. Files default to the run directory
        (every process appends to the same ones): spans to `spans.jsonl`, metrics to
        `metrics-otel.jsonl`, TensorBoard's events to `tensorboard/`."""
        telemetry = self.telemetry
        update: dict[str, Any] = {"service_name": f"rollwire-{component}"}
        if telemetry.exporter == "file" and telemetry.file_path is None:
            update["file_path"] = self.run_dir / "spans.jsonl"
        if telemetry.metrics.exporter == "file" and telemetry.metrics.file_path is None:
            update["metrics"] = telemetry.metrics.model_copy(update={"file_path": self.run_dir / "metrics-otel.jsonl"})
        if telemetry.tensorboard.log_dir is None:
            update["tensorboard"] = telemetry.tensorboard.model_copy(update={"log_dir": self.run_dir / "tensorboard"})
        return telemetry.model_copy(update=update)


def describe_errors(exc: ValidationError) -> str:
    """A pydantic error as one line per problem: `field.path: what to change`."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}" if where else message)
    return "; ".join(lines)


def recipe_text(path: Path | None = None) -> str:
    """The TOML text of the recipe at `path`, or of the bundled demo."""
    try:
        return Path(path).read_text() if path else resources.files("rollwire.run").joinpath(DEMO).read_text()
    except FileNotFoundError:
        raise ConfigError(f"no recipe at {path}; give a TOML file, or no argument for the bundled demo") from None


def load_recipe(path: Path | None = None, **overrides: Any) -> RunRecipe:
    """The recipe at `path` (default: the bundled demo), with `overrides` (`key` or `table.key`) applied;
    a recipe that cannot run raises `ConfigError` naming each field to change."""
    where = str(path) if path else "the bundled demo recipe"
    text = recipe_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    for key, value in overrides.items():
        if value is not None:
            section, _, field = key.partition(".")
            if field:
                data.setdefault(section, {})[field] = value
            else:
                data[key] = value
    try:
        return RunRecipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {describe_errors(exc)}") from None
