"""The language in one program: roles, forks, select and JSON-schema output.

Run: python examples/quickstart.py   (CPU, default model SmolLM2-135M-Instruct)
"""

from __future__ import annotations

import contextlib
import json

from pydantic import BaseModel, Field

import radixlm as rl


class Plan(BaseModel):  # bounded fields, so the JSON always fits in max_tokens
    idea: str = Field(max_length=40)
    steps: int = Field(ge=1, le=10)


@rl.function
def plan(s, topic):
    s += rl.system("You are concise.")
    s += rl.user(f"Give one idea about {topic}.")
    forks = s.fork(2)
    for f in forks:
        f += rl.assistant(rl.gen("idea", max_tokens=16, stop="\n"))
    s += rl.user("Pick one: A) " + forks[0]["idea"] + " B) " + forks[1]["idea"])
    forks.join()  # the forks' variables become lists on `s`: s["idea"] == [idea A, idea B]
    s += rl.assistant(rl.select("pick", choices=["A", "B"]))
    s += rl.user("Now as JSON.")
    s += rl.assistant(rl.gen("plan", json_schema=Plan, max_tokens=64))


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
