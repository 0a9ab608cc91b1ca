"""Section 6.3: English constituency parsing as sequence to sequence, and its scoring as EVALB scores it."""
