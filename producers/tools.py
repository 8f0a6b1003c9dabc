"""Tools a model calls in the chat harness: plain Python functions with typed arguments, and
toolboxes whose tools share one rollout's state.

    def search(query: str, limit: int = 3) -> str:
        \"\"\"Searches the shop's catalogue.

        Args:
            query: words to look for
            limit: how many results to return
        \"\"\"

    class Scratch(Toolbox):
        \"\"\"A scratch directory of the rollout's own.\"\"\"

        def setup(self, row: dict) -> None:          # before the rollout's first call
            self.folder = Path(tempfile.mkdtemp())
        def teardown(self) -> None:                  # after its last, whatever happened
            shutil.rmtree(self.folder)

        @tool
        def write(self, path: str, text: str) -> str:
            \"\"\"Writes a file.\"\"\"

    class Shop(Taskset):
        harness = "chat"
        tools = [search, Scratch]                    # every rollout's; a row's `tools` may name a subset

The schema the model sees is written from the signature and the docstring (its first paragraph
describes the tool, an `Args:` section each argument); `self` and the toolbox's state never reach
the model. Arguments are checked and converted as the annotations say before the function runs;
a wrong call, an unknown tool and an exception in a tool all come back to the model as an `error:`
message it can read, and the rollout goes on. A tool returns text (anything else is sent as JSON).

Tools are named in rows and recipes by name (`TOOLS`: the built-in `calculator`, which a model may
call even where no row offers it, as `CALL calculator(...)` prompts teach), or by reference,
`package.module:function`, `package.module:Toolbox` (all its tools) or `path/file.py:function`, so
that a harness in a subprocess or a container finds the same ones.
"""

from __future__ import annotations

import ast
import inspect
import json
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from rollwire.core.errors import ConfigError
from rollwire.core.registry import Registry, is_reference, options_model, validation_problems


class Toolbox:
    """Tools that share state for one rollout: a fresh instance per rollout, `setup(row)` before its
    first call and `teardown()` after its last; its methods marked `@tool` are the tools."""

    def setup(self, row: dict) -> None:  # noqa: B027 - optional
        """Prepares the rollout's state (a scratch folder, a sandbox handle) from its task row."""

    def teardown(self) -> None:  # noqa: B027 - optional
        """Releases the state; runs even when the rollout failed."""

    @classmethod
    def tools(cls) -> list[Tool]:
        """Its tools: the methods marked `@tool`, in the order they are defined (a toolbox whose
        tools are found at run time, e.g. an MCP server's, overrides this)."""
        found = [Tool.of(member, toolbox=cls) for _, member in vars(cls).items()
                 if callable(member) and hasattr(member, "__rollwire_tool__")]
        if not found:
            raise ConfigError(f"toolbox {cls.__qualname__} has no tools: mark its methods with @tool")
        return found


def tool(fn: Callable | None = None, *, name: str | None = None) -> Any:
    """Marks a function, or a method of a `Toolbox`, as a tool (`name`: default the function's)."""
    def mark(target: Callable) -> Callable:
        target.__rollwire_tool__ = name or target.__name__  # type: ignore[attr-defined]
        return target
    return mark(fn) if fn is not None else mark


_ARGS_HEADER = re.compile(r"^(Args|Arguments|Parameters)\s*:$")
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _describe(fn: Callable) -> tuple[str, dict[str, str]]:
    """The docstring's first paragraph, and the `Args:` section's text per argument (Google style:
    `name: text` or `name (type): text`, continued on more indented lines)."""
    lines = (inspect.getdoc(fn) or "").splitlines()
    summary = []
    for line in lines:
        if not line.strip() or _ARGS_HEADER.match(line.strip()):
            break
        summary.append(line.strip())
    arguments: dict[str, str] = {}
    start = next((i + 1 for i, line in enumerate(lines) if _ARGS_HEADER.match(line.strip())), len(lines))
    indent, current = None, None
    for line in lines[start:]:
        if not line.strip():
            break
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        match = _ARG_LINE.match(line.strip())
        if depth == indent and match:
            current = match.group(1)
            arguments[current] = match.group(2).strip()
        elif depth > indent and current is not None:
            arguments[current] = f"{arguments[current]} {line.strip()}".strip()
        else:
            break
    return " ".join(summary), arguments


@dataclass(frozen=True)
class Tool:
    """One tool: its name, what the model is told about it, and how to call it."""

    name: str
    description: str
    function: Callable[..., Any]
    arguments: type[BaseModel] | None
    """The call's arguments, checked and converted (the function's parameters, `self` left out);
    None for a tool described by `parameters`, whose own server checks its arguments."""
    toolbox: type[Toolbox] | None = None
    """The toolbox whose per-rollout instance the function is called on; None: a plain function."""
    parameters: dict[str, Any] | None = None
    """The arguments' JSON schema as a tool server gave it (an MCP server's `inputSchema`)."""
    source: type | None = None
    """The class that found this tool at run time (an `McpServer`): references name it."""

    @classmethod
    def of(cls, function: Callable[..., Any], *, toolbox: type[Toolbox] | None = None) -> Tool:
        """The tool `function` is (built once per function: each rollout's tools are looked up again)."""
        key = (function, toolbox)
        if key not in _BUILT:
            _BUILT[key] = cls._build(function, toolbox)
        return _BUILT[key]

    @classmethod
    def _build(cls, function: Callable[..., Any], toolbox: type[Toolbox] | None) -> Tool:
        name = getattr(function, "__rollwire_tool__", None) or function.__name__
        description, documented = _describe(function)
        model = options_model(function, skip=1 if toolbox is not None else 0, descriptions=documented)
        return cls(name=name, description=description or name, function=function, arguments=model, toolbox=toolbox)

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema chat templates render into the prompt."""
        parameters: dict[str, Any] = (
            json.loads(json.dumps(self.parameters)) if self.parameters is not None  # a copy: it is edited below
            else self.arguments.model_json_schema() if self.arguments is not None else {"type": "object"})
        parameters.pop("title", None)
        parameters.pop("additionalProperties", None)
        for field in parameters.get("properties", {}).values():
            field.pop("title", None)
        parameters.setdefault("properties", {})
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": parameters}}

    @property
    def argument_names(self) -> list[str]:
        if self.arguments is not None:
            return list(self.arguments.model_fields)
        return list((self.parameters or {}).get("properties", {}))

    @property
    def first_argument(self) -> str | None:
        return next(iter(self.argument_names), None)

    @property
    def reference(self) -> str:
        """How another process finds this tool: its registered name, `module:function`, or
        `module:Toolbox#tool` (a file's path for a module imported from a file)."""
        if self.name in TOOLS and TOOLS.get(self.name) is self:
            return self.name
        if self.source is not None:
            return f"{_module_reference(self.source)}:{self.source.__qualname__}#{self.name}"
        owner = self.toolbox or self.function
        reference = f"{_module_reference(owner)}:{owner.__qualname__}"
        return f"{reference}#{self.name}" if self.toolbox is not None else reference


_BUILT: dict[tuple[Any, Any], Tool] = {}


def _module_reference(owner: Any) -> str:
    module = owner.__module__
    if module.startswith("rollwire_user_"):  # imported from a file (`core.registry._import_file`)
        return inspect.getfile(owner)
    return module


def tools_of(item: Any) -> list[Tool]:
    """The tools an entry of a taskset's `tools` stands for: a function, a `Toolbox` class, a `Tool`,
    or a name or reference (see the module's docstring)."""
    if isinstance(item, Tool):
        return [item]
    if isinstance(item, str):
        if item in TOOLS or not is_reference(item):
            return [TOOLS.get(item)]
        item, _, one = item.partition("#")
        found = _REFERENCES.get(item)
        if inspect.isclass(found) and issubclass(found, Toolbox):
            every = found.tools()
            chosen = [t for t in every if t.name == one] if one else every
            if not chosen:
                raise ConfigError(f"toolbox {item} has no tool {one!r}; it has {', '.join(t.name for t in every)}")
            return chosen
        if isinstance(found, Tool):
            return [found]
        if callable(found):
            return [Tool.of(found)]
    if inspect.isclass(item) and issubclass(item, Toolbox):
        return item.tools()
    if callable(item):
        return [Tool.of(item)]
    raise ConfigError(f"{item!r} is not a tool: give a function, a Toolbox class, or a tool's name or "
                      "package.module:function reference")


def offered_tools(row: dict, offered: Iterable[Any]) -> list[str]:
    """The references of the tools a rollout of `row` gets from a taskset that `offered` these (a
    taskset's `tools`): the ones the row's `tools` names (by name, else as a built-in or a
    reference), or all of them when the row names none."""
    available = {t.name: t for item in offered for t in tools_of(item)}
    names = row.get("tools")
    if names is None:
        return [t.reference for t in available.values()]
    chosen: list[Tool] = []
    for name in names:
        chosen += [available[name]] if isinstance(name, str) and name in available else tools_of(name)
    return [t.reference for t in chosen]


def _is_tool_source(item: object) -> bool:
    return callable(item) or isinstance(item, Tool)


TOOLS: Registry[Tool] = Registry("tool")
"""Built-in tools by name."""
_REFERENCES: Registry[Any] = Registry("tool", accepts=_is_tool_source)
"""Tools and toolboxes named by reference (`module:function`, `file.py:Toolbox`), imported once."""


class ToolSet:
    """The tools of one rollout: schemas for the prompt, and calls. As a context manager it makes
    the rollout's toolbox instances (`setup(row)`) and tears them down at the end."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for item in tools:
            if item.name in self.tools and self.tools[item.name] is not item:
                raise ConfigError(f"two tools are named {item.name!r}: rename one (@tool(name=...))")
            self.tools[item.name] = item
        self._boxes: dict[type[Toolbox], Toolbox] = {}

    @classmethod
    def named(cls, names: Iterable[Any]) -> ToolSet:
        return cls(t for item in names for t in tools_of(item))

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def open(self, row: dict) -> ToolSet:
        for box in {t.toolbox for t in self.tools.values() if t.toolbox is not None}:
            instance = box()
            self._boxes[box] = instance
            instance.setup(row)
        return self

    def close(self) -> None:
        boxes, self._boxes = list(self._boxes.values()), {}
        for instance in boxes:
            instance.teardown()

    def __enter__(self) -> ToolSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, name: str, arguments: dict[str, Any] | str) -> str:
        """What the model reads back for one call: the tool's result as text, or `error: ...`
        saying what to change (a text `arguments` is the tool's first argument: `CALL tool(text)`)."""
        found = self.tools.get(name) or (TOOLS.get(name) if name in TOOLS else None)  # built-ins: always
        if found is None:
            known = ", ".join(self.tools) or "none"
            return f"error: no tool {name!r}; the tools are {known}"
        if isinstance(arguments, str):
            arguments = {found.first_argument: arguments} if found.first_argument else {}
        if found.arguments is None:  # its server checks the arguments and says what is wrong
            values = dict(arguments)
        else:
            try:
                checked = found.arguments.model_validate(arguments)
            except ValidationError as exc:
                return f"error: {name}: {_argument_problems(exc, found)}"
            values = {k: getattr(checked, k) for k in found.arguments.model_fields if k in checked.model_fields_set
                      or found.arguments.model_fields[k].is_required()}
        target = found.function
        if found.toolbox is not None:
            box = self._boxes.get(found.toolbox)
            if box is None:
                raise RuntimeError(f"tool {name!r} needs its toolbox set up: use the ToolSet in `with toolset.open(row)`")
            target = target.__get__(box)
        try:
            result = target(**values)
        except Exception as exc:  # the tool's own failure: the model reads it and may try again
            return f"error: {name} failed: {type(exc).__name__}: {exc}"
        return result if isinstance(result, str) else json.dumps(result, default=str)


def _argument_problems(exc: ValidationError, found: Tool) -> str:
    valid = found.argument_names
    return "; ".join(validation_problems(exc, valid, "argument")) + f" (it takes {', '.join(valid) or 'no arguments'})"


def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression: numbers, + - * / and parentheses.

    Args:
        expression: the expression, e.g. (2+3)*4
    """
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.USub: operator.neg}

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( ) are allowed")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (ValueError, SyntaxError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(result) if float(result).is_integer() else result)


TOOLS.add("calculator", Tool.of(calculator))
