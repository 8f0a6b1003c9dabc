"""Named variants chosen in settings: advantage algorithms, losses, group rewards, tasksets,
harnesses. One small helper for all of them, so that a name or an option is checked when the
recipe loads, not when the first rollout reaches the code that uses it.

    ALGORITHMS = Registry("advantage algorithm", package="rollwire.streams.advantages")

    @ALGORITHMS.register("grpo")          # in a module of that package
    class Grpo: ...

    ALGORITHMS.get("grpoo")  ->  UnknownNameError: unknown advantage algorithm 'grpoo'; valid:
                                 distill, dr_grpo, grpo, ... (did you mean 'grpo'?)
    check_options("group reward shortest_correct", shortest_correct, {"bonuss": 0.2})
                             ->  ConfigError: group reward shortest_correct has no option 'bonuss'
                                 (did you mean 'bonus'?); it takes bonus, correct, threshold

Every module of `package` is imported on the first lookup, so adding a variant is adding a module.
Those modules must import nothing heavy at import time (torch is imported by what runs them), so
that settings can be checked by processes that never load a model.

Variants can live outside rollwire too (`Registry(..., entry_points=GROUP)`):

- an installed package declares them in its pyproject, `[project.entry-points."GROUP"]`, each entry
  a module (imported: its decorators register) or an object (registered by its `name`);
- a name may be a reference, `package.module:Object` or `path/to/file.py:Object`; a file holding one
  variant may be named alone (`envs/sorting.py`). A relative path is read from the current folder.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import pkgutil
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from rollwire.core.errors import ConfigError

T = TypeVar("T")


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice most like `name`, if one is close enough to be a likely typo; a choice that `name`
    begins (`ppo` for `ppo_clip`) before one merely spelled alike (`ipo`)."""
    choices = list(choices)
    prefixed = sorted(c for c in choices if c.startswith(name) and name)
    if prefixed:
        return prefixed[0]
    found = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return found[0] if found else None


def _suggestion(name: str, choices: Iterable[str]) -> str:
    match = closest(name, choices)
    return f" (did you mean {match!r}?)" if match else ""


class UnknownNameError(ConfigError, KeyError):
    """No variant of a kind is registered under the requested name; the message lists the valid
    names and the closest one."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]) -> None:
        valid = sorted(valid)
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(valid)}{_suggestion(name, valid)}")
        self.kind, self.name, self.valid = kind, name, valid

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def is_reference(name: str) -> bool:
    """Whether `name` points at code (`module:Object`, a `.py` file) rather than naming a variant."""
    return ":" in name or name.endswith(".py")


class Registry(Generic[T]):
    """Variants of one kind by name."""

    def __init__(self, kind: str, *, package: str | None = None, entry_points: str | None = None,
                 accepts: Callable[[object], bool] | None = None,
                 error: type[UnknownNameError] = UnknownNameError) -> None:
        self.kind, self._package, self._group, self._error = kind, package, entry_points, error
        self._accepts = accepts or (lambda item: True)  # is an object a reference names of this kind?
        self._items: dict[str, T] = {}
        self._references: dict[str, T] = {}
        self._discovered = package is None and entry_points is None

    def add(self, name: str, item: T) -> T:
        if name in self._items and self._items[name] is not item:
            raise ConfigError(f"two {self.kind}s claim the name {name!r}")
        self._items[name] = item
        return item

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator: registers under `name`, or the decorated class's `name` attribute."""
        def add(item: T) -> T:
            return self.add(name or str(getattr(item, "name")), item)  # noqa: B009 - T has no declared `name`
        return add

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        if self._package is not None:
            package = importlib.import_module(self._package)
            for module in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self._package}.{module.name}")
        if self._group is not None:
            for entry in importlib.metadata.entry_points(group=self._group):
                self._load_entry_point(entry)

    def _load_entry_point(self, entry: importlib.metadata.EntryPoint) -> None:
        where = f"entry point {entry.name!r} ({entry.value}) of the installed package " \
                f"{entry.dist.name if entry.dist else '?'} in group {self._group!r}"
        try:
            loaded = entry.load()
        except Exception as exc:
            raise ConfigError(f"{where} failed to load: {type(exc).__name__}: {exc}; fix that package or "
                              "uninstall it") from exc
        if inspect.ismodule(loaded):
            return  # importing it registered what it holds
        if not self._accepts(loaded) or not getattr(loaded, "name", None):
            raise ConfigError(f"{where} is not a {self.kind} with a `name`: point it at one, or at the module "
                              "that registers them")
        if loaded not in self._items.values():
            self.add(str(getattr(loaded, "name")), loaded)  # noqa: B009

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._items)

    def get(self, name: str) -> T:
        """The variant registered as `name`, or the one a reference names (`module:Object`,
        `file.py:Object`, `file.py`); `UnknownNameError` naming the valid ones otherwise."""
        self._discover()
        if name in self._items:
            return self._items[name]
        if is_reference(name):
            if name not in self._references:
                self._references[name] = self._resolve(name)
            return self._references[name]
        raise self._error(self.kind, name, self._items) from None

    def _resolve(self, reference: str) -> T:
        source, _, attribute = reference.rpartition(":") if ":" in reference else (reference, "", "")
        if source.endswith(".py"):
            module = _import_file(source, self.kind)
        else:
            try:
                module = importlib.import_module(source)
            except ImportError as exc:
                raise ConfigError(f"{self.kind} {reference!r}: cannot import {source!r} ({exc}); install the package "
                                  "that holds it, or name a .py file") from exc
        if attribute:
            if not hasattr(module, attribute):
                public = [n for n in vars(module) if not n.startswith("_")]
                raise ConfigError(f"{self.kind} {reference!r}: {source} has no {attribute!r}"
                                  f"{_suggestion(attribute, public)}")
            found = getattr(module, attribute)
            if not self._accepts(found):
                raise ConfigError(f"{self.kind} {reference!r}: {attribute} is not a {self.kind}")
            return found
        defined = [v for v in vars(module).values() if self._accepts(v) and getattr(v, "__module__", None) ==
                   module.__name__]
        if len(defined) != 1:
            names = ", ".join(getattr(v, "__name__", "?") for v in defined) or "none"
            raise ConfigError(f"{self.kind} {reference!r}: the file defines {len(defined)} {self.kind}s ({names}); "
                              f"name one: {reference}:NAME")
        return defined[0]

    def check(self, name: str) -> str:
        """`name`, if registered (a pydantic `AfterValidator`)."""
        self.get(name)
        return name

    def __contains__(self, name: object) -> bool:
        self._discover()
        return name in self._items


def _import_file(path: str, kind: str) -> ModuleType:
    """The Python file `path`, imported once per process under a name made from its absolute path."""
    file = Path(path).resolve()
    if not file.is_file():
        raise ConfigError(f"{kind} {path!r}: no such file (relative paths are read from {Path.cwd()})")
    name = "rollwire_user_" + "".join(c if c.isalnum() else "_" for c in str(file))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{kind} {path!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"{kind} {path!r} failed to import: {type(exc).__name__}: {exc}") from exc
    return module


def options_model(fn: Callable[..., Any], *, skip: int = 0,
                  descriptions: Mapping[str, str] | None = None) -> type[BaseModel]:
    """A pydantic model of `fn`'s keyword options (its parameters after the first `skip`), with
    their annotations, defaults and `descriptions`; extra keys are refused."""
    fields: dict[str, Any] = {}
    hints = _hints(fn)
    for parameter in list(inspect.signature(fn).parameters.values())[skip:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        default = ... if parameter.default is parameter.empty else parameter.default
        described = (descriptions or {}).get(parameter.name)
        fields[parameter.name] = (hints.get(parameter.name, Any),
                                  Field(default, description=described) if described else default)
    return create_model(f"{getattr(fn, '__name__', 'options')}_options",
                        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True), **fields)


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The parameters' annotations, each evaluated on its own: one that cannot be evaluated here (a
    type imported only for type checkers, such as the tensors a correction takes) accepts any value,
    and the others still check theirs."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    hints = {}
    for name, annotation in inspect.get_annotations(target).items():
        if name == "return":
            continue
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, getattr(target, "__globals__", {}))  # noqa: S307 - the module's own annotation
            except Exception:
                continue
        hints[name] = annotation
    return hints


def check_options(what: str, fn: Callable[..., Any], options: Mapping[str, Any], *, skip: int = 0) -> dict[str, Any]:
    """`options` validated against `fn`'s keyword parameters (see `options_model`); `ConfigError`
    names the option to change, the closest valid one, and every valid option."""
    model = options_model(fn, skip=skip)
    try:
        return model.model_validate(dict(options)).model_dump(exclude_unset=True)
    except ValidationError as exc:
        valid = list(model.model_fields)
        takes = f"; it takes {', '.join(valid)}" if valid else "; it takes no options"
        raise ConfigError(f"{what} {'; '.join(validation_problems(exc, valid, 'option'))}{takes}") from None


def validation_problems(exc: ValidationError, valid: list[str], noun: str) -> list[str]:
    """A phrase per error of a keyword model's validation: an unknown `noun` (with the closest of
    `valid`), a missing one, or a value that does not fit."""
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])  # `judge.model` inside a nested option
        if error["type"] == "extra_forbidden":
            problems.append(f"has no {noun} {field!r}{_suggestion(field, valid) if len(error['loc']) == 1 else ''}")
        elif error["type"] == "missing":
            problems.append(f"needs {noun} {field!r}")
        else:
            problems.append(f"{noun} {field!r}: {error['msg']}")
    return problems


class NamedSpec(BaseModel):
    """A registered function chosen in settings by its name, its options beside the name
    (`{ name = "icepop", lower = 0.5 }`), checked against the function's keyword parameters when
    the settings load. A subclass says which registry (`registry`) and what the reader calls such a
    function (`kind`); the function's first `skip` parameters are what it is applied to."""

    model_config = ConfigDict(extra="allow")
    kind: ClassVar[str]
    registry: ClassVar[Registry]
    skip: ClassVar[int] = 1

    name: str
    """The registered name."""

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def function(self) -> Callable[..., Any]:
        return self.registry.get(self.name)

    @model_validator(mode="after")
    def _known(self) -> NamedSpec:
        check_options(f"{self.kind} {self.name}", self.function(), self.options(), skip=self.skip)
        return self
