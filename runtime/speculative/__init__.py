"""Speculative decoding: draft proposers (NGRAM, STANDALONE, EAGLE/EAGLE3), the verify step and
acceptance that keeps the target model's distribution (issue 25)."""
