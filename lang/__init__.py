"""radixlm.lang: the structured-generation language (IR, primitives, chat templates, tracer).

Pure Python: importing it never imports torch or the runtime. The public names are re-exported
by the `radixlm` package (see `radixlm.interpreter.api`).
"""
