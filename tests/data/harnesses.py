"""Harnesses for runtime tests, importable in a child process as `harnesses:NAME`."""

import time


def sleeps(row, model):
    time.sleep(row["seconds"])
    return "woke up"


def raises(row, model):
    raise ValueError("the environment is broken")


def echoes_completion(row, model):
    return model.complete(row["prompt"]).upper()
