"""Stream a chat answer token by token with `run(stream=True)` and `text_iter`.

Run: python examples/streaming.py
"""

from __future__ import annotations

import contextlib

import radixlm as rl


@rl.function
def chat(s, question):
    s += rl.user(question)
    s += rl.assistant(rl.gen("answer", max_tokens=32))


def main(engine: rl.Engine | None = None) -> None:
    """Run on `engine` (the tests pass a shared one), or on a new default Engine."""
    with contextlib.nullcontext(engine) if engine else rl.Engine() as engine:
        rl.set_default_backend(engine)
        state = chat.run(question="Write a haiku about tea.", stream=True, temperature=0)
        for piece in state.text_iter("answer"):
            print(piece, end="", flush=True)
        print()


if __name__ == "__main__":
    main()
