"""Many questions after one shared few-shot prefix: `run_batch` caches the prefix once.

Run: python examples/few_shot_batch.py
"""

from __future__ import annotations

import contextlib

import radixlm as rl

FEW_SHOT = """Answer with the capital city only.
Q: What is the capital of France?
A: Paris
Q: What is the capital of Germany?
A: Berlin
Q: What is the capital of Italy?
A: Rome
"""


@rl.function
def capital(s, country):
    s += FEW_SHOT
    s += "Q: What is the capital of " + country + "?\n"
    s += "A:" + rl.gen("answer", max_tokens=6, stop="\n")


def main(engine: rl.Engine | None = None) -> None:
    """Run on `engine` (the tests pass a shared one), or on a new default Engine."""
    with contextlib.nullcontext(engine) if engine else rl.Engine() as engine:
        rl.set_default_backend(engine)
        countries = ["Spain", "Japan", "Egypt", "Canada", "Peru", "Kenya"]
        states = capital.run_batch(
            [{"country": c} for c in countries], temperature=0, progress_bar=True
        )
        for country, state in zip(countries, states, strict=True):
            meta = state.get_meta_info("answer")
            print(
                f"{country:8s} ->{state['answer']!s:12s} "
                f"(prompt {meta['prompt_tokens']} tokens, {meta['cached_tokens']} from cache)"
            )


if __name__ == "__main__":
    main()
