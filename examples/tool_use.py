"""A ReAct-style loop: the model picks an action with `select`, the program runs the tool.

Run: python examples/tool_use.py
"""

from __future__ import annotations

import contextlib

import radixlm as rl

TOOLS = {
    "add": lambda a, b: a + b,
    "multiply": lambda a, b: a * b,
}


@rl.function
def calculator_agent(s, question, max_steps=3):
    s += "You solve arithmetic with tools. Tools: add(a, b), multiply(a, b).\n"
    s += "Question: What is 3 times 4?\n"
    s += "Action: multiply(3, 4)\nObservation: 12\nAction: answer\nAnswer: 12\n\n"
    s += "Question: " + question + "\n"
    for step in range(max_steps):
        s += "Action: " + rl.select(f"tool_{step}", choices=["add", "multiply", "answer"])
        tool = s[f"tool_{step}"]
        if tool == "answer":
            break
        s += "(" + rl.gen_int(f"a_{step}", max_tokens=4) + ", "
        s += rl.gen_int(f"b_{step}", max_tokens=4) + ")\n"
        result = TOOLS[tool](int(s[f"a_{step}"]), int(s[f"b_{step}"]))  # the program runs the tool
        s += f"Observation: {result}\n"
    s += "\nAnswer: " + rl.gen("answer", max_tokens=8, stop="\n")


def main(engine: rl.Engine | None = None) -> None:
    """Run on `engine` (the tests pass a shared one), or on a new default Engine."""
    with contextlib.nullcontext(engine) if engine else rl.Engine() as engine:
        rl.set_default_backend(engine)
        state = calculator_agent.run(question="What is 7 times 6?", temperature=0)
        print(state.text())


if __name__ == "__main__":
    main()
