"""The model (paper sections 3 and 6.1): configuration, the Transformer, generate() and its searches.

Every `*_vaswani.py` file here is also shipped beside saved weights as Hub remote code: they import only torch,
transformers and each other, with single-dot imports, so a checkpoint loads with `trust_remote_code=True` where this
package is absent. `precision.py` (the precision the hardware runs fast, int8) is the package's alone."""
