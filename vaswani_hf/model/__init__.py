"""The model (paper sections 3 and 6.1): configuration, the Transformer, generate() and its searches.

Every `*_vaswani.py` file here is also shipped beside saved weights as Hub remote code: they import only torch,
transformers and each other, with single-dot imports, so a checkpoint loads with `trust_remote_code=True` where this
package is absent. The package's own: `precision.py` (the precision the hardware runs fast, int8) and `speed/` (the
CPU fast products and the CUDA-graph search, plugged into generate() at import)."""

import sys

# the speed paths plug into generate() when they are imported, with this folder; not in `vaswani translate`'s light
# start (`vaswani_hf.light_start()`, read here without importing the package above: no circle), which decodes on
# torch alone and imports them where it hands over (`vaswani_hf.finish_import`)
if not getattr(sys.modules.get("vaswani_command"), "light_start", False):
    from . import speed  # noqa: F401
