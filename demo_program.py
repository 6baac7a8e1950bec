"""The generation program shown by `radixlm demo`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class Plan(BaseModel):
    idea: str
    steps: int


def run_program(engine: Any) -> Any:
    import radixlm as rl

    @rl.function
    def plan(s: Any, topic: str) -> None:
        s += rl.system("You are concise.")
        s += rl.user(f"Give one idea about {topic}.")
        forks = s.fork(2)
        for f in forks:
            f += rl.assistant(rl.gen("idea", max_tokens=16, stop="\n"))
        s += rl.user("Pick one: A) " + forks[0]["idea"] + " B) " + forks[1]["idea"])
        s += rl.assistant(rl.select("pick", choices=["A", "B"]))
        s += rl.user("Now as JSON.")
        s += rl.assistant(rl.gen("plan", json_schema=Plan, max_tokens=48))

    rl.set_default_backend(engine)
    return plan.run(topic="tea", temperature=0)
