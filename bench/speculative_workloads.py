"""The workloads of `radixlm bench speculative` (issue 25's CPU table): one chat prompt each, our
own text. Four give prompt lookup (NGRAM) something to copy from; free chat gives it nothing and
checks that speculation costs little where it cannot pay.

  rewrite        the request to repeat a paragraph with two words changed, then the paragraph
  rewrite-after  the same paragraph first, the same request after it
  extract        a short document with quoted values, and the request to put them in a JSON object
  code           the start of a Python file, to be continued
  chat           an ordinary question (no text to copy)
"""

from __future__ import annotations

_PARAGRAPH = (
    "The harbor town of Millbrook wakes up early. Before the sun is over the hills, the fishing "
    "boats leave the stone pier one by one, and the bakery on Water Street lights its ovens. By "
    "seven o'clock the market square is full of carts selling bread, apples, cheese and fresh "
    "fish, and the bell of the old clock tower rings over the rooftops. Visitors who arrive on "
    "the morning ferry often say that the town smells of salt, smoke and warm bread, and that it "
    "feels as if nothing has changed there for a hundred years."
)

_DOCUMENT = """\
DELIVERY NOTE 4471

Customer name: "Harriet Lindqvist"
Customer email: "h.lindqvist@example.org"
Shipping address: "12 Orchard Lane, Bramford, BR4 9QT"
Order number: "ORD-2026-118204"
Order date: "2026-03-14"
Items: "2 x ceramic teapot, 1 x bamboo tray, 6 x linen napkin"
Carrier: "Northline Parcel"
Tracking code: "NLP7781204466"
Delivery window: "between 09:00 and 13:00"
Notes from the customer: "Please leave the parcel with the neighbour at number 14."
"""

_CODE = '''\
"""A small inventory module: items, stock levels and restocking."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Item:
    sku: str
    name: str
    price: float
    quantity: int = 0


@dataclass
class Inventory:
    items: dict[str, Item] = field(default_factory=dict)

    def add_item(self, item: Item) -> None:
        if item.sku in self.items:
            raise ValueError(f"duplicate sku {item.sku}")
        self.items[item.sku] = item

    def remove_item(self, sku: str) -> Item:
        if sku not in self.items:
            raise KeyError(f"unknown sku {sku}")
        return self.items.pop(sku)

    def restock(self, sku: str, amount: int) -> None:
        if sku not in self.items:
            raise KeyError(f"unknown sku {sku}")
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.items[sku].quantity += amount

    def sell(self, sku: str, amount: int) -> float:
        if sku not in self.items:
            raise KeyError(f"unknown sku {sku}")
'''

# name -> the user message (the chat template is applied by the bench)
WORKLOADS: dict[str, str] = {
    # NOTE: two phrasings of one task. A capable model's answer copies all but two words; the
    # default 135M model copies the paragraph when the request comes first (it skips the two
    # changes), and paraphrases it when the request follows it (docs/speculative.md).
    "rewrite": (
        'In the paragraph below, change "Millbrook" to "Eastwick" and "seven" to "eight", and '
        f"write out the whole paragraph.\n\n{_PARAGRAPH}"
    ),
    "rewrite-after": (
        "Here is a paragraph:\n\n"
        f"{_PARAGRAPH}\n\n"
        'Rewrite the paragraph exactly as it is, but change "Millbrook" to "Eastwick" and '
        '"seven" to "eight". Keep every other word the same.'
    ),
    "extract": (
        "Read this document:\n\n"
        f"{_DOCUMENT}\n"
        "Extract every quoted value into one JSON object. Use the field names as keys in "
        "snake_case and copy each value exactly as it is quoted. Answer with the JSON only."
    ),
    "code": (
        "Continue this Python file. Finish the `sell` method and add a `total_value` method, in "
        "the same style. Answer with code only.\n\n"
        f"```python\n{_CODE}"
    ),
    "chat": "What are some good ways to stay focused when working from home?",
}
