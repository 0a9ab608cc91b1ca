"""The decoding speed paths of the installed package, plugged into generate() through one seam,
`generation_vaswani.SPEEDUPS`, when the package is imported:

- `fast_products.py`: the CPU fast products (the decoder's linears and the output projection multiplied the way
  measured fastest on this CPU, greedy search screened through a bf16 or int8 copy of the output weight); switch:
  `generate(cpu_fast_paths=False)` or `VASWANI_CPU_FAST_PATHS=0`, off under `torch.use_deterministic_algorithms`;
- `step_threads.py`: a search or step of few rows (8, or 2 for a model wider than 256) on one thread, one of the
  fast products (same switch); alone: `VASWANI_ONE_THREAD_ROWS=0`;
- `lean_step.py`: the decoder's step for one token without its module calls, the same operators on the same
  weights (the same bits); used by the CPU searches with the fast products on or off; switch:
  `VASWANI_LEAN_STEP=0`;
- `graph_search.py`: the paper's searches with static shapes, each step replayed as one CUDA graph; switch:
  `generate(graph_decoding=False)` or `VASWANI_GRAPH_DECODING=0`.

Both give the plain search's tokens and scores (tests/test_search_properties.py). They are machinery, not the
paper: a checkpoint's remote code ships the configuration, the model and the search without them, and decodes with
the model's own products and the eager search where this package is absent."""

from .. import generation_vaswani
from . import fast_products, graph_search, lean_step

generation_vaswani.SPEEDUPS.cpu_products = fast_products.FastCpuProducts
generation_vaswani.SPEEDUPS.cpu_exact_products = lean_step.LeanProducts
generation_vaswani.SPEEDUPS.graphs = graph_search
