"""The task every SDK agent here solves, and its two tools: add two numbers, then negate the sum."""

QUESTION = "Add 2 and 3, then negate it."
SYSTEM = "Use the tools."
PARAMETERS = {
    "add": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]},
    "negate": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
}
DESCRIPTIONS = {"add": "Adds two numbers.", "negate": "Negates a number."}


def run(name: str, arguments: dict) -> str:
    value = arguments["a"] + arguments["b"] if name == "add" else -arguments["x"]
    return str(int(value))
