"""radixlm.formats: conventions of model output that the language and the server share.

`tools` (OpenAI-style tool declarations -> the JSON schema that constrains a call) and `reasoning`
(splitting a `<think>...</think>` section from the answer). Pure Python, importing nothing of
radixlm: it sits below `lang`, `interpreter` and `runtime`, so the server's tool calling and
reasoning parsers (runtime/server/) and `gen(tools=...)` / `separate_reasoning` (lang/) use one
implementation without the runtime importing the language.
"""
