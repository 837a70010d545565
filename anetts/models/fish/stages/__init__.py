"""Compiled AR stages of Fish S2: `slow_chunk` (stateful prefill/decode over layers [a, b)),
`lm_head` (the semantic rows + <|im_end|> of the tied head) and `fast_ar` (the fused `frame` and stepped `decode` over a 10-slot KV state)."""
