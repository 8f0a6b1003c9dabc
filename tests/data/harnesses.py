"""Harnesses for runtime tests, importable in a child process as `harnesses:NAME`."""

import time


def sleeps(row, model):
    time.sleep(row["seconds"])
    return "woke up"


def raises(row, model):
    raise ValueError("the environment is broken")


def echoes_completion(row, model):
    return model.complete(row["prompt"]).upper()


def sees_variables(row, model):
    """Which of `row["names"]` the harness's environment holds."""
    import os
    return ",".join(name for name in row["names"] if name in os.environ)
