"""A soak of `vaswani serve`: N clients over M models with --max_loaded below M, for minutes. Random pairs, composed
ones among them (through a pivot: two models a request), one model whose folder is broken (it fails its check and
must be reported, never evict a good model, never be retried per request), and clients that hang up mid-request.

    python benchmarks/serve_soak.py MODEL_DIR [--seconds 300] [--clients 8] [--max_loaded 2]

MODEL_DIR is a trained model (the README's `vaswani train` makes one); it is copied into en->de, de->en, en->fr and
fr->en (the weights nudged apart are not needed: the soak measures the server) and a broken en->es (its weights
truncated). Prints, for docs/serving-performance.md: per pair, requests served, refused (by status) and lost (a 5xx,
a connection error, or a refusal that should not happen), p50 and p99 latency; loads and unloads; RSS at the start
of the measured part and at its end, its slope; and writes the RSS over time as a plot (--plot)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from serve_many import LINES, Server, cpu  # noqa: E402

from tests.test_serve import _metric  # noqa: E402

PAIRS = [("en", "de"), ("de", "en"), ("en", "fr"), ("fr", "en"), ("de", "fr"), ("fr", "de"), ("en", "es")]
BROKEN = ("en", "es")


def folders(model: Path, root: Path) -> list[Path]:
    out = []
    for source, target in [("en", "de"), ("de", "en"), ("en", "fr"), ("fr", "en"), BROKEN]:
        folder = root / f"{source}-{target}"
        shutil.copytree(model, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
        facts = folder / "training_facts.json"
        text = facts.read_text() if facts.exists() else "{}"
        data = json.loads(text)
        data["data"] = {**data.get("data", {}), "src": source, "tgt": target}
        facts.write_text(json.dumps(data))
        if (source, target) == BROKEN:
            weights = folder / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        out.append(folder)
    return out


async def soak(url: str, clients: int, seconds: float, hang_up: float, seed: int, pairs: list) -> dict:
    """Closed-loop clients on random pairs; a share `hang_up` of requests abandoned after a random 0-0.5 s."""
    rng = random.Random(seed)
    outcome: dict = defaultdict(Counter)
    latency: dict = defaultdict(list)
    stop = time.monotonic() + seconds

    async def client(index: int) -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            while time.monotonic() < stop:
                pair = rng.choice(pairs)
                lines = "\n".join(rng.sample(LINES, rng.randint(1, 4)))
                body = {"q": lines, "source": pair[0], "target": pair[1]}
                start = time.monotonic()
                call = http.post(f"{url}/translate", json=body)
                try:
                    if rng.random() < hang_up:
                        call = await asyncio.wait_for(call, rng.uniform(0.0, 0.5))
                    else:
                        call = await call
                except TimeoutError:
                    outcome[pair]["hung up"] += 1
                    continue
                except httpx.TransportError as err:
                    outcome[pair][f"lost: {type(err).__name__}"] += 1
                    continue
                answer = call
                if answer.status_code == 200:
                    outcome[pair]["served"] += 1
                    latency[pair].append(time.monotonic() - start)
                elif pair == BROKEN and answer.status_code == 503 and "failed to load" in answer.text:
                    outcome[pair]["refused: broken model (503)"] += 1
                elif answer.status_code in (429, 503) and "retry-after" in answer.headers:
                    outcome[pair][f"refused: {answer.status_code}"] += 1
                    await asyncio.sleep(min(1.0, float(answer.headers["retry-after"])))
                else:
                    outcome[pair][f"lost: {answer.status_code} {answer.text[:80]}"] += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return {"outcome": outcome, "latency": latency}


def percentile(values: list[float], q: float) -> float | None:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--warmup", type=float, default=30, help="seconds of the same load before RSS is measured")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max_loaded", type=int, default=2)
    parser.add_argument("--hang_up", type=float, default=0.05, help="share of requests abandoned mid-way")
    parser.add_argument("--plot", type=Path, default=Path("benchmarks/results/serve_soak_rss.png"))
    parser.add_argument("--single", action="store_true", help="one model (en->de) alone, no --max_loaded: the leak "
                        "question without the turns")  # fmt: skip
    args = parser.parse_args()
    pairs = [("en", "de")] if args.single else PAIRS
    with tempfile.TemporaryDirectory() as tmp:
        served = folders(args.model_dir, Path(tmp))
        loaded = [] if args.single else ["--max_loaded", str(args.max_loaded)]
        server = Server(served[:1] if args.single else served, *loaded, "--request_timeout", "60")
        rss: list[tuple[float, float]] = []
        begun = time.monotonic()

        async def run() -> dict:
            async def sample() -> None:
                while True:
                    rss.append((time.monotonic() - begun, server.rss_mb("VmRSS")))
                    await asyncio.sleep(1)

            sampler = asyncio.create_task(sample())
            await soak(server.url, args.clients, args.warmup, args.hang_up, 1, pairs)
            result = await soak(server.url, args.clients, args.seconds, args.hang_up, 2, pairs)
            sampler.cancel()
            return result

        result = asyncio.run(run())
        metrics = httpx.get(f"{server.url}/metrics").text
        health = httpx.get(f"{server.url}/health").json()
        server.stop()
    measured = [(t, mb) for t, mb in rss if t >= args.warmup]
    first, last = measured[0][1], measured[-1][1]
    half = len(measured) // 2
    early, late = (sum(mb for _, mb in part) / len(part) for part in (measured[:half], measured[half:]))
    setup = ("one model (en->de), all loaded" if args.single
             else f"{len(PAIRS)} pairs over 5 models (one broken), --max_loaded {args.max_loaded}")  # fmt: skip
    print(f"CPU: {cpu()}; {args.clients} clients, {setup}, {args.seconds:.0f} s after {args.warmup:.0f} s of "
          f"warm-up, {args.hang_up:.0%} of requests abandoned mid-way\n")  # fmt: skip
    print("| pair | served | refused | hung up | lost | p50 ms | p99 ms |\n|---|---|---|---|---|---|---|")
    for pair in pairs:
        counts, times = result["outcome"][pair], result["latency"][pair]
        refused = ", ".join(f"{k[9:]} {v}" for k, v in counts.items() if k.startswith("refused")) or "0"
        lost = sum(v for k, v in counts.items() if k.startswith("lost"))
        p50, p99 = percentile(times, 0.5), percentile(times, 0.99)
        print(f"| {pair[0]}->{pair[1]} | {counts['served']} | {refused} | {counts['hung up']} | {lost} | "
              f"{p50 * 1000 if p50 else 0:.0f} | {p99 * 1000 if p99 else 0:.0f} |")  # fmt: skip
    lost_kinds = Counter({k: v for c in result["outcome"].values() for k, v in c.items() if k.startswith("lost")})
    print(f"\nlost: {dict(lost_kinds) or 0}")
    print(
        f"loads {_metric(metrics, 'vaswani_model_loads_total'):.0f}, unloads "
        f"{_metric(metrics, 'vaswani_model_unloads_total'):.0f}, load failures "
        f"{_metric(metrics, 'vaswani_model_load_failures_total'):.0f}; /health at the end: {health['status']}"
    )
    print(
        f"RSS: {first:.0f} MB after the warm-up, {last:.0f} MB at the end ({(last - first) / first:+.1%}); mean of "
        f"the first half {early:.0f} MB, of the second {late:.0f} MB ({(late - early) / early:+.1%})"
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 3))
    axes.plot([t for t, _ in rss], [mb for _, mb in rss])
    axes.axvline(args.warmup, color="grey", linestyle=":", label="end of warm-up")
    axes.set_xlabel("seconds")
    axes.set_ylabel("RSS, MB")
    axes.set_ylim(bottom=0)
    axes.set_title(f"vaswani serve soak: {args.clients} clients, {setup}")
    axes.legend()
    figure.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.plot, dpi=100)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
