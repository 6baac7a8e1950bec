"""The language in one program: roles, forks, select and JSON-schema output.

Run: python examples/quickstart.py   (CPU, default model SmolLM2-135M-Instruct)
"""

from __future__ import annotations

import contextlib
import json

from pydantic import BaseModel

import radixlm as rl


class Plan(BaseModel):
    idea: str
    steps: int


@rl.function
def plan(s, topic):
    s += rl.system("You are concise.")
    s += rl.user(f"Give one idea about {topic}.")
    forks = s.fork(2)
    for f in forks:
        f += rl.assistant(rl.gen("idea", max_tokens=16, stop="\n"))
    s += rl.user("Pick one: A) " + forks[0]["idea"] + " B) " + forks[1]["idea"])
    s += rl.assistant(rl.select("pick", choices=["A", "B"]))
    s += rl.user("Now as JSON.")
    s += rl.assistant(rl.gen("plan", json_schema=Plan, max_tokens=48))


def main(engine: rl.Engine | None = None) -> None:
    """Run on `engine` (the tests pass a shared one), or on a new default Engine."""
    with contextlib.nullcontext(engine) if engine else rl.Engine() as engine:
        rl.set_default_backend(engine)
        state = plan.run(topic="tea", temperature=0)
        print("ideas:", state["idea"])
        print("pick:", state["pick"])
        print("plan:", Plan.model_validate(json.loads(state["plan"])))
        for m in state.messages():
            print(f"[{m['role']}] {m['content']}")


if __name__ == "__main__":
    main()
