"""🤗 Evaluate metric modules shipped with vaswani-hf, loaded by path (`evaluate.load(folder)`), so that the
recipe's BLEU and chrF need no network: `bleu/bleu.py` and `chrf/chrf.py`, both sacreBLEU's own metrics with
their signatures. `vaswani_hf.translation.metrics` loads them by name."""
