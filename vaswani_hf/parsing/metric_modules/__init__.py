"""🤗 Evaluate metric modules for parsing, loaded by path (`evaluate.load(folder)`): `evalb/evalb.py`."""
