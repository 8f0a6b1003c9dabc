"""A taskset with its own tools, named by file (`examples/environments/shop.py:Shop`):
a typed multi-argument function, and a toolbox whose tools share one rollout's cart."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from rollwire.producers.tasksets import RolloutView, Taskset, reward
from rollwire.producers.tools import Toolbox, tool

PRICES = {"apple": 0.5, "pear": 0.75, "melon": 3.0}
LEDGER = "SHOP_LEDGER"
"""The variable naming a file each cart is appended to when its rollout ends (a test reads it)."""


def price(item: str, quantity: int = 1) -> float:
    """The price of some of one item.

    Args:
        item: what to buy, e.g. apple
        quantity: how many
    """
    if item not in PRICES:
        raise KeyError(f"no {item!r} in the shop; it sells {', '.join(PRICES)}")
    return PRICES[item] * quantity


class Cart(Toolbox):
    """A cart of the rollout's own."""

    def setup(self, row: dict) -> None:
        self.owner, self.items = row["task_id"], []

    def teardown(self) -> None:
        if LEDGER in os.environ:
            with open(os.environ[LEDGER], "a") as out:
                out.write(json.dumps({"owner": self.owner, "items": self.items}) + "\n")

    @tool
    def add(self, item: str, quantity: int) -> str:
        """Puts items in the cart.

        Args:
            item: what to add
            quantity: how many
        """
        self.items += [item] * quantity
        return f"{len(self.items)} items in the cart"

    @tool(name="total")
    def cart_total(self) -> float:
        """What the cart costs."""
        return sum(PRICES[i] for i in self.items)


class Shop(Taskset):
    name = "shop"
    harness = "chat"
    tools = [price, Cart]

    def rows(self) -> Iterator[dict]:
        yield {"task_id": "shop-0", "messages": [{"role": "user", "content": "Buy two pears."}]}
        yield {"task_id": "shop-1", "messages": [{"role": "user", "content": "Price a melon."}], "tools": ["price"]}

    @reward("said_a_number")
    def said_a_number(self, r: RolloutView) -> float:
        return float(any(c.isdigit() for c in r.completion))
