"""What a state's text is made of, and where in the user's program each piece came from.

`Span`s partition a state's text by origin (constant text, role prefix/suffix, generated text),
for the HTML view. `SubmitSite` remembers the lines of the user's program that appended an
expression, so that an error raised later on the executor thread can name them.

Ownership: both are immutable values; the executor replaces a span rather than mutating it.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass, replace

import radixlm.lang.errors
from radixlm.lang.errors import ProgramError

# Frames from these folders are radixlm's, not the user's program.
_OWN_DIRS = tuple(
    os.path.dirname(os.path.abspath(p)) + os.sep for p in (__file__, radixlm.lang.errors.__file__)
)


@dataclass(frozen=True)
class Span:
    kind: str  # "text" | "role_begin" | "role_end" | "gen" | "select"
    text: str
    role: str | None = None  # the role this span belongs to (None outside any role)
    name: str | None = None  # the variable a gen/select span fills

    def extend(self, more: str) -> Span:
        return replace(self, text=self.text + more)


@dataclass(frozen=True)
class SubmitSite:
    """The user's stack (innermost last) at the `s += ...` that submitted an expression."""

    stack: traceback.StackSummary

    @staticmethod
    def capture(skip: int = 2, limit: int = 4) -> SubmitSite:
        """The user's frames from the caller `skip` levels up, outward until radixlm's own code
        (the runner that called the program) or `limit` frames."""
        frame = sys._getframe(skip)
        frames = []
        for f, lineno in traceback.walk_stack(frame):
            if len(frames) == limit or f.f_code.co_filename.startswith(_OWN_DIRS):
                break
            frames.append((f, lineno))
        # NOTE: lookup_lines=False keeps this cheap on every `s += ...`; source lines are read
        # from linecache only if an error is formatted.
        stack = traceback.StackSummary.extract(iter(frames), lookup_lines=False)
        stack.reverse()
        return SubmitSite(stack)

    def where(self) -> str:
        if not self.stack:
            return "?"
        f = self.stack[-1]
        return f"{f.filename}:{f.lineno} in {f.name}"

    def format(self) -> str:
        return "".join(traceback.format_list(self.stack))


def program_error(
    program: str, what: str, site: SubmitSite | None, cause: BaseException
) -> ProgramError:
    """A `ProgramError` naming the program, the failing expression and the user's line."""
    where = site.where() if site else "?"
    err = ProgramError(
        f"program {program!r} failed in {what} (submitted at {where}): {type(cause).__name__}: {cause}"
    )
    err.__cause__ = cause
    if site is not None and hasattr(err, "add_note"):
        err.add_note("The expression was appended by:\n" + site.format().rstrip())
    return err
