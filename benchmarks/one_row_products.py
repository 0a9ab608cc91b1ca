"""A decoding step's products by way, on a model's own weights: where the time of a batch-1 step goes.

    python benchmarks/one_row_products.py MODEL_DIR [--rows 1 4 32] [--threads 1 2] [--rounds 40] [--out FILE]

For each number of rows and threads, every way multiplies the decoder's step linears (not the cross-attention's
keys and values, which a search projects once) and the output weight in turn, as one step reads them, so that
each product finds its weight where the previous step left it (the caches hold a few of them, not all); the
ways take turns within each round, and the table gives each way's median ms a step, the decoder's linears and the
output projection apart, beside a plain sum over the same weights (what the memory alone costs). The ways:
`F.linear` (the layers' own), `weight @ hidden^T`, the weight stored transposed (`hidden @ weight^T`), a `bmm`
over the weight's two halves, and MKL's and oneDNN's packs where this torch has them. No way here changes what the
package runs: `speed/fast_products.py` times its own ways on real steps.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

# isort: off
import vaswani_hf  # noqa: F401  (before torch: the package's OpenMP policy, as every `vaswani` command has it)
import torch

# isort: on

from vaswani_hf.model.precision import cpu_name
from vaswani_hf.model.speed.fast_products import (
    MKL_OPS,
    ONEDNN_OPS,
    _step_linears,
    has_ops,
    mkl_packed_weight,
    packed_weight,
)
from vaswani_hf.translation.inference import load_for_inference

Product = Callable[[torch.Tensor], torch.Tensor]


def ways_for(weight: torch.Tensor, rows: int) -> dict[str, Product]:
    """Each way's product of `weight` (out, in) with `rows` rows of hidden states, its copies made here."""
    transposed = weight.t().contiguous()
    ways: dict[str, Product] = {
        "F.linear": lambda hidden: torch.nn.functional.linear(hidden, weight),
        "weight @ hidden^T": lambda hidden: weight @ hidden.t(),
        "transposed weight": lambda hidden: hidden @ transposed,
    }
    if weight.shape[0] % 2 == 0:
        halves = weight.view(2, weight.shape[0] // 2, weight.shape[1])
        ways["bmm of two halves"] = lambda hidden: torch.bmm(halves, hidden.t().expand(2, -1, -1))
    if torch.backends.mkl.is_available() and has_ops(*MKL_OPS):
        pack = mkl_packed_weight(weight, rows)  # the package's own packs, as its ways read them
        ways["MKL pack"] = lambda hidden: torch.ops.mkl._mkl_linear(hidden, pack, weight, None, rows)
    if torch.backends.mkldnn.is_available() and has_ops(*ONEDNN_OPS):
        blocked = packed_weight(weight)
        ways["oneDNN pack"] = lambda hidden: torch.ops.mkldnn._linear_pointwise(hidden, blocked, None, "none", [], "")
    return ways


def measure(weights: list[torch.Tensor], rows: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Each way's median ms a step: (the decoder's linears, the output projection); the last weight is the output's.
    "memory (a sum)" reads every weight once."""
    products = [ways_for(w, rows) for w in weights]
    hidden = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
    names = [name for name in products[0] if all(name in p for p in products)]
    products = [{**p, "memory (a sum)": lambda _, w=w: w.sum()} for p, w in zip(products, weights, strict=True)]
    names.append("memory (a sum)")
    times = {name: ([], []) for name in names}
    with torch.inference_mode():
        for step in range(rounds + 3):  # three warm-up steps
            for name in names:
                started = time.perf_counter()
                for product, weight in zip(products[:-1], weights[:-1], strict=True):
                    product[name](hidden[weight.shape[1]])
                middle = time.perf_counter()
                products[-1][name](hidden[weights[-1].shape[1]])
                ended = time.perf_counter()
                if step >= 3:
                    times[name][0].append(middle - started)
                    times[name][1].append(ended - middle)
    return {name: (statistics.median(d) * 1e3, statistics.median(o) * 1e3) for name, (d, o) in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 32])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    model, _ = load_for_inference(args.model_dir, device="cpu", precision="fp32")
    linears = _step_linears(model)
    output = model.get_output_embeddings().weight
    if not linears or output.dtype != torch.float32:
        raise SystemExit(f"{args.model_dir}: the decoder's step linears are not plain float32 layers")
    weights = [m.weight.detach() for m in linears] + [output.detach()]
    megabytes = sum(w.numel() * w.element_size() for w in weights) / 1e6
    lines = [
        f"CPU: {cpu_name()} ({platform.machine()}); torch {torch.__version__}; {args.model_dir}: "
        f"{len(linears)} decoder linears and a {tuple(output.shape)} output weight, {megabytes:.1f} MB; "
        f"median ms a step over {args.rounds} rounds",
        "",
        "| rows | threads | way | decoder linears | output projection |",
        "|---:|---:|---|---:|---:|",
    ]
    before = torch.get_num_threads()
    for rows in args.rows:
        for threads in args.threads:
            torch.set_num_threads(threads)
            for name, (decoder, out) in measure(weights, rows, args.rounds).items():
                lines.append(f"| {rows} | {threads} | {name} | {decoder:.3f} | {out:.3f} |")
    torch.set_num_threads(before)
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(table)


if __name__ == "__main__":
    main()
