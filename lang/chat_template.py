"""Chat templates: the text a role's message begins and ends with.

The interpreter renders `system/user/assistant` by appending a per-role prefix, the content, and a
per-role suffix. `ChatTemplate` holds those strings. `from_jinja` derives them from a tokenizer's
Jinja chat template (Hugging Face's `tokenizer.chat_template`) by rendering conversations whose
contents are marker strings and splitting the output on the markers; it also detects a default
system message that the template injects when a conversation does not start with one (SmolLM2's
ChatML does). Tokenizers without a template get `PLAIN_TEMPLATE`.

Ownership: templates are immutable values shared by every state of a backend.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from radixlm.lang.errors import ChatTemplateError

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    """Per-role prefix/suffix strings, the default system prompt, and end-of-turn stop strings."""

    name: str
    role_prefix_and_suffix: Mapping[str, tuple[str, str]]
    # Inserted as a system message before the first message when that is not a system message;
    # `None` means the template inserts nothing.
    default_system_prompt: str | None = None
    stop_str: tuple[str, ...] = ()
    source: str | None = field(default=None, compare=False, repr=False)

    def get_prefix_and_suffix(
        self, role: str, hist_messages: Sequence[Mapping[str, Any]] = ()
    ) -> tuple[str, str]:
        """The strings around a message of `role` (SGLang's name; history is unused here)."""
        try:
            return self.role_prefix_and_suffix[role]
        except KeyError:
            raise ChatTemplateError(
                f"chat template {self.name!r} has no role {role!r} (roles: {sorted(self.role_prefix_and_suffix)})"
            ) from None

    def get_prompt(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Render OpenAI-style messages the way the interpreter would."""
        out = []
        if messages and messages[0]["role"] != "system" and self.default_system_prompt is not None:
            messages = [{"role": "system", "content": self.default_system_prompt}, *messages]
        for m in messages:
            prefix, suffix = self.get_prefix_and_suffix(m["role"])
            out.append(f"{prefix}{m['content']}{suffix}")
        return "".join(out)


# SGLang's "default" template, used when a tokenizer has no chat template.
PLAIN_TEMPLATE = ChatTemplate(
    name="plain",
    role_prefix_and_suffix={
        "system": ("SYSTEM:", "\n"),
        "user": ("USER:", "\n"),
        "assistant": ("ASSISTANT:", "\n"),
    },
)

_MARK = "@@RADIXLM_MARK_{}@@"  # NOTE: no whitespace-like chars: templates may `| trim`


def _environment():
    # NOTE: mirrors how transformers renders chat templates (sandboxed, trim/lstrip blocks,
    # loopcontrols, `raise_exception`, `tojson`, `strftime_now`) so templates render identically.
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, **kwargs: Any) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kwargs)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class _Renderer:
    def __init__(self, template: str, bos_token: str, eos_token: str) -> None:
        try:
            self._template = _environment().from_string(template)
        except Exception as e:
            raise ChatTemplateError(f"chat template does not parse: {e}") from e
        self._bos = bos_token
        self._eos = eos_token

    def render(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = False
    ) -> str | None:
        """The rendered text, or None when the template refuses this conversation."""
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except Exception:
            return None


def _split(segment: str | None, mark: str) -> tuple[str, str] | None:
    if segment is None or segment.count(mark) != 1:
        return None
    prefix, suffix = segment.split(mark)
    return prefix, suffix


def _increment(before: str | None, after: str | None) -> str | None:
    """The text `after` adds to `before`, when `after` extends it."""
    if before is None or after is None or not after.startswith(before):
        return None
    return after[len(before) :]


def from_jinja(
    template: str, *, bos_token: str = "", eos_token: str = "", name: str = "tokenizer"
) -> ChatTemplate:
    """Derive a `ChatTemplate` from a Hugging Face Jinja chat template.

    `bos_token` should be "" when the runtime's tokenizer adds BOS itself (otherwise it would be
    doubled). Raises `ChatTemplateError` when the template cannot be split per role.
    """
    r = _Renderer(template, bos_token, eos_token)
    sys_m, user_m, asst_m = (_MARK.format(i) for i in range(3))
    sys_msg = {"role": "system", "content": sys_m}
    user_msg = {"role": "user", "content": user_m}
    asst_msg = {"role": "assistant", "content": asst_m}

    roles: dict[str, tuple[str, str]] = {}
    base: list[dict[str, str]] = []
    system = _split(r.render([sys_msg]), sys_m)
    if system is not None:
        roles["system"] = system
        base = [sys_msg]
    base_text = r.render(base) if base else ""

    user = _split(_increment(base_text, r.render([*base, user_msg])), user_m)
    if user is None:
        raise ChatTemplateError(f"cannot find the user prefix/suffix of chat template {name!r}")
    roles["user"] = user
    user_text = r.render([*base, user_msg])
    assistant = _split(_increment(user_text, r.render([*base, user_msg, asst_msg])), asst_m)
    if assistant is None:
        raise ChatTemplateError(
            f"cannot find the assistant prefix/suffix of chat template {name!r}"
        )
    roles["assistant"] = assistant
    if "system" not in roles:
        # NOTE: templates that refuse a system role (e.g. Gemma's) get a bare paragraph for it.
        roles["system"] = ("", "\n\n")

    return ChatTemplate(
        name=name,
        role_prefix_and_suffix=roles,
        default_system_prompt=_default_system_prompt(r, roles, user_msg, user_m),
        stop_str=(eos_token,) if eos_token and eos_token in assistant[1] else (),
        source=template,
    )


def _default_system_prompt(
    r: _Renderer, roles: Mapping[str, tuple[str, str]], user_msg: dict[str, str], user_m: str
) -> str | None:
    """The system message the template injects before a conversation that starts with a user."""
    text = r.render([user_msg])
    if text is None:
        return None
    user_prefix = roles["user"][0]
    head = text[: text.find(user_prefix + user_m)] if user_prefix + user_m in text else ""
    sys_prefix, sys_suffix = roles["system"]
    if head and head.startswith(sys_prefix) and head.endswith(sys_suffix) and sys_prefix:
        return head[len(sys_prefix) : len(head) - len(sys_suffix)]
    return None


def from_tokenizer(tokenizer: Any) -> ChatTemplate:
    """The chat template of a (duck-typed) Hugging Face tokenizer, or `PLAIN_TEMPLATE`.

    Uses `tokenizer.chat_template` (a string, or a dict whose "default" entry is used) and its
    `eos_token`. BOS is left out of the role strings because the runtime's tokenizer adds it.
    """
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not template:
        return PLAIN_TEMPLATE
    eos = getattr(tokenizer, "eos_token", None) or ""
    name = getattr(tokenizer, "name_or_path", None) or "tokenizer"
    try:
        return from_jinja(template, bos_token="", eos_token=str(eos), name=str(name))
    except ChatTemplateError as e:
        warnings.warn(f"{e}; using the plain chat template instead", stacklevel=2)
        return PLAIN_TEMPLATE
