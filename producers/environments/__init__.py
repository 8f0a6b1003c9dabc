"""Built-in tasksets; importing this package registers them (`rollwire.producers.tasksets`)."""

from rollwire.producers.environments import arithmetic, calculator, math_word, reverse_digits  # noqa: F401
