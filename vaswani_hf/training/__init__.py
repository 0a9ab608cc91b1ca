"""Training (paper section 5): the recipe behind `vaswani train`, the trainer (Adam, warmup, label smoothing),
regularizers, GPU speed-ups, checkpoint averaging."""
