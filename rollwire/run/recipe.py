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

from rollwire.bus import EmbeddedBusSettings, KafkaBusSettings
from rollwire.errors import ConfigError
from rollwire.objectstore import LocalStoreSettings, S3StoreSettings
from rollwire.producers.dispatcher import EnvironmentMix
from rollwire.producers.env_worker import SimulatedLatency
from rollwire.streams.scoring import ScorerSettings
from rollwire.telemetry import TelemetrySettings
from rollwire.trainer.warmstart import WarmStartSettings

DEMO = "demo.toml"
"""The bundled demo recipe, next to this module."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class TinyModelSettings(_Section):
    """A tiny Llama and a character tokenizer built locally (`rollwire.trainer.tiny`)."""

    hidden: int = Field(default=128, ge=8)
    layers: int = Field(default=2, ge=1)
    heads: int = Field(default=4, ge=1)
    kv_heads: int = Field(default=2, ge=1)
    intermediate: int = Field(default=256, ge=8)
    tie_embeddings: bool = False
    """Must stay false for full-weight training: vLLM's hot reload leaves a tied output layer stale
    (`rollwire.consumers.weight_subscriber.TIED_RELOAD`)."""
    seed: int = 0


class ModelRecipe(_Section):
    """The policy's starting weights: a local directory or hub name, or a tiny model built here."""

    path: str | None = None
    """Starting weights (directory or hub name); None builds `tiny` under `<run_dir>/base`."""
    tiny: TinyModelSettings = Field(default_factory=TinyModelSettings)
    """The tiny model to build when `path` is not set."""


class WarmStartRecipe(WarmStartSettings):
    """Supervised warm start on an environment's scripted teacher, before RL (`steps = 0`: none)."""

    environment: str | None = None
    """Environment whose teacher writes the examples; default: the first environment."""


class EnvironmentRecipe(EnvironmentMix):
    """One environment of the run: the dispatcher's mix entry plus the taskset's options."""

    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the taskset, e.g. `{ seed = 1 }`."""


class EnvWorkersRecipe(_Section):
    count: int = Field(default=1, ge=1)
    """Env worker processes (one consumer group)."""
    concurrency: int = Field(default=16, ge=1)
    """Rollouts in flight per worker (environment slots; a rollout waiting on its environment holds one)."""
    inference_concurrency: int = Field(default=32, ge=1)
    """Generation requests in flight per worker to the fleet."""
    inference_window_s: float = Field(default=0.0, ge=0, le=1)
    """Longest a generation request waits for others to reach the fleet with it as one batch."""
    runtime: Literal["in-process", "subprocess"] = "in-process"
    """Where harnesses run (`rollwire.producers.runtimes`)."""
    simulated_latency: SimulatedLatency | None = None
    """A random delay before every rollout, to rehearse slow environments (benchmarks); None: off."""


class InferenceRecipe(_Section):
    """The managed vLLM server (one replica); the model comes from `[model]`."""

    port: int = Field(default=0, ge=0, le=65535)
    """Port on 127.0.0.1; 0 picks a free one."""
    max_model_len: int = Field(default=256, ge=16)
    kv_cache_gib: int = Field(default=1, ge=1)
    dtype: str = "auto"
    """Weights dtype of the server; `auto` takes the trainer's (float32 on CPU, bfloat16 on CUDA), so
    that sampler and trainer log-probabilities agree (vLLM's own `auto` picks bfloat16 on CPU)."""
    extra_args: list[str] = Field(default_factory=list)


class BusRecipe(_Section):
    type: Literal["embedded", "kafka"] = "embedded"
    """`embedded`: `<run_dir>/log`, nothing to run; `kafka`: a cluster at `bootstrap_servers`."""
    bootstrap_servers: str = "127.0.0.1:9092"
    prefix: str | None = None
    """Topic prefix; default: the recipe's name (each run its own topics)."""


class StoreRecipe(_Section):
    type: Literal["local", "s3"] = "local"
    """`local`: `<run_dir>/weights`; `s3`: the `s3` settings."""
    s3: S3StoreSettings = Field(default_factory=S3StoreSettings)


class RunRecipe(_Section):
    """Everything `rollwire run` starts."""

    name: str = Field(default="demo", pattern=r"^[A-Za-z0-9_-]+$")
    """Name of the run: the default run directory and topic prefix."""
    run_dir: Path | None = None
    """Where the run keeps its log, weights, checkpoints, metrics and plots; default `runs/<name>`."""
    steps: int = Field(default=100, ge=1)
    """Trainer steps; the run ends after the last one."""
    model: ModelRecipe = Field(default_factory=ModelRecipe)
    warm_start: WarmStartRecipe = Field(default_factory=lambda: WarmStartRecipe(steps=0))
    environments: list[EnvironmentRecipe] = Field(min_length=1)
    """The dispatcher's mix; every env worker runs all of them."""
    dispatcher_seed: int = 0
    env_workers: EnvWorkersRecipe = Field(default_factory=EnvWorkersRecipe)
    scorer: ScorerSettings = Field(default_factory=ScorerSettings)
    trainer: dict[str, Any] = Field(default_factory=dict)
    """`TrainerSettings` without `model.path` and `checkpoint_dir` (the run fills them in)."""
    trainer_threads: int = Field(default=1, ge=1)
    """torch CPU threads of the trainer process (on a small CPU the inference server needs the rest)."""
    inference: InferenceRecipe = Field(default_factory=InferenceRecipe)
    bus: BusRecipe = Field(default_factory=BusRecipe)
    store: StoreRecipe = Field(default_factory=StoreRecipe)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    """Where spans go (`exporter = "otlp"`, `"console"`, `"file"` with `file_path`, or `"none"`)."""

    @model_validator(mode="after")
    def _consistent(self) -> RunRecipe:
        if self.run_dir is None:
            self.run_dir = Path("runs") / self.name
        full_weights = "lora" not in self.trainer.get("model", {})
        if full_weights and self.model.path is None and self.model.tiny.tie_embeddings:
            raise ValueError("model.tiny.tie_embeddings = true cannot be trained with full-weight versions: vLLM's "
                             "hot reload leaves a tied output layer on the old weights; set it to false")
        from rollwire.consumers.weight_subscriber import ties_embeddings
        if full_weights and self.model.path is not None and ties_embeddings(Path(self.model.path)):
            raise ValueError(f"model.path = {self.model.path!r} ties its embeddings (tie_word_embeddings): its full "
                             "weight versions cannot be hot-reloaded by vLLM; untie it, or train LoRA adapters "
                             "([trainer.model.lora])")
        names = [e.name for e in self.environments]
        if self.warm_start.steps and self.warm_start.environment not in (None, *names):
            raise ValueError(f"warm_start.environment = {self.warm_start.environment!r} is not one of the "
                             f"recipe's environments ({', '.join(names)})")
        self.trainer_settings()  # fails here, at load time, on a bad [trainer] table
        try:
            self.bus_settings()
        except ValidationError as exc:
            raise ValueError(f"[bus] table: {exc.errors()[0]['msg']}") from None
        from rollwire.producers.tasksets import known_tasksets
        unknown = [n for n in names if n not in known_tasksets()]
        if unknown:
            raise ValueError(f"unknown environment {unknown[0]!r} in [[environments]]; known: "
                             f"{', '.join(sorted(known_tasksets()))}")
        return self

    # -- what each component gets -------------------------------------------------------------

    @property
    def base_model(self) -> str:
        return self.model.path or str(self.run_dir / "base")

    @property
    def prefix(self) -> str:
        return self.bus.prefix or self.name

    def bus_settings(self) -> EmbeddedBusSettings | KafkaBusSettings:
        if self.bus.type == "kafka":
            return KafkaBusSettings(bootstrap_servers=self.bus.bootstrap_servers)
        return EmbeddedBusSettings(path=self.run_dir / "log")

    def store_settings(self) -> LocalStoreSettings | S3StoreSettings:
        return self.store.s3 if self.store.type == "s3" else LocalStoreSettings(root=self.run_dir / "weights")

    def trainer_settings(self):
        from rollwire.trainer.loop import TrainerSettings
        data = {**self.trainer, "checkpoint_dir": str(self.run_dir / "trainer")}
        data["model"] = {**data.get("model", {}), "path": self.base_model}
        data.setdefault("batch", {})
        try:
            return TrainerSettings.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"[trainer] table: {exc}") from None

    def inference_dtype(self) -> str:
        if self.inference.dtype != "auto":
            return self.inference.dtype
        from rollwire.trainer.model import resolve_device
        _, dtype = resolve_device(self.trainer_settings().model)
        return str(dtype).removeprefix("torch.")

    @property
    def max_off_policy(self) -> int:
        return self.trainer_settings().batch.max_off_policy

    @property
    def batch_rollouts(self) -> int:
        return self.trainer_settings().batch.batch_rollouts or 64

    def warm_start_environment(self) -> EnvironmentRecipe:
        name = self.warm_start.environment or self.environments[0].name
        return next(e for e in self.environments if e.name == name)

    def telemetry_for(self, component: str) -> TelemetrySettings:
        """The run's telemetry settings, named for `component`; the `file` exporter defaults to
        `<run_dir>/spans.jsonl` (every process appends to it)."""
        update: dict[str, Any] = {"service_name": f"rollwire-{component}"}
        if self.telemetry.exporter == "file" and self.telemetry.file_path is None:
            update["file_path"] = self.run_dir / "spans.jsonl"
        return self.telemetry.model_copy(update=update)


def recipe_text(path: Path | None = None) -> str:
    """The TOML text of the recipe at `path`, or of the bundled demo."""
    try:
        return Path(path).read_text() if path else resources.files("rollwire.run").joinpath(DEMO).read_text()
    except FileNotFoundError:
        raise ConfigError(f"no recipe at {path}; give a TOML file, or no argument for the bundled demo") from None


def load_recipe(path: Path | None = None, **overrides: Any) -> RunRecipe:
    """The recipe at `path` (default: the bundled demo), with `overrides` (`key` or `table.key`) applied."""
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
        raise ConfigError(f"{where}: {exc}") from None
