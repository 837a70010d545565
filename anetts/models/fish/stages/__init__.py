"""Compiled AR stages of Fish S2: `slow_chunk` (stateful prefill/decode over layers [a, b); the last
also gives the restricted head's logits, `lm_head`) and `fast_ar` (the fused `frame` and stepped
`decode` over a 10-slot KV state)."""
