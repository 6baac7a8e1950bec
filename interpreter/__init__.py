"""radixlm.interpreter: runs generation programs (states, executors, batches, backends, display).

Importing it never imports torch or the runtime; the Engine backend imports them on first use.
"""
