"""The error tree drawn in `rollwire.core.errors` is the real one: every exception class rollwire defines
descends from `RollwireError` and appears in the drawing under its parent."""

from __future__ import annotations

import importlib
import pkgutil
import re

from rollwire.core.errors import RollwireError


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_error_class_is_drawn_under_its_parent():
    packages = ("rollwire", "rollwire.core", "rollwire.schemas", "rollwire.producers", "rollwire.streams",
                "rollwire.consumers")
    for package in packages:
        root = importlib.import_module(package)
        for module in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not module.name.endswith("__main__") and "faust" not in module.name:  # faust: heavy, no errors
                importlib.import_module(module.name)
    from rollwire.trainer import losses, settings  # noqa: F401 - torch-free parts of the trainer
    drawing = importlib.import_module("rollwire.core.errors").__doc__
    depth = {m.group(2): len(m.group(1)) for m in re.finditer(r"^( *(?:[│ ]   )*(?:├── |└── )?)(\w+)", drawing, re.M)}
    for cls in _all_subclasses(RollwireError):
        if cls.__module__.startswith("rollwire"):
            assert cls.__name__ in depth, f"{cls.__name__} ({cls.__module__}) is missing from the tree in rollwire.core.errors"
            parent = next(b for b in cls.__mro__[1:] if issubclass(b, RollwireError))
            assert depth[cls.__name__] > depth[parent.__name__], f"{cls.__name__} is not drawn under {parent.__name__}"
