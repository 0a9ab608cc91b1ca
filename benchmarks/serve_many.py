"""`vaswani serve` with two models under mixed load, against a server holding one model alone; the cost of a composed
pair; the memory with --max_loaded 1 against 2. Real server processes on loopback ports, closed-loop clients (each
sends its next request when the last is answered), a bounded number of requests and seconds.

    python benchmarks/serve_load.py --many MODEL_DIR [--seconds 20] [--clients 8]   (or benchmarks/serve_many.py)

MODEL_DIR is a trained model (the README's `vaswani train` makes one); the benchmark copies it into two folders
serving en->de and de->en (the same weights: the figures measure the server, not the models) and a third, en->fr,
for the composed pair de->fr. Prints a Markdown table for docs/serving-performance.md, with the CPU named.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from serve_process import start  # noqa: E402

from vaswani_hf.data.number_words import builtin_splits  # noqa: E402

LINES = [source for source, _ in builtin_splits()["test"][:400]]


def cpu() -> str:
    name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")), platform.processor())  # fmt: skip
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    kept = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    return f"{name}, {os.cpu_count()} cores ({', '.join(kept)})"


class Server:
    """`vaswani serve` of these folders (serve_load.start), in fp32."""

    def __init__(self, folders: list[Path], *options: str) -> None:
        self.process, self.url = start([str(f) for f in folders], "--precision", "fp32", *options)

    def rss_mb(self, field: str = "VmHWM") -> float:
        """The server's peak (VmHWM) or present (VmRSS) resident memory."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith(field))) / 1024

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.communicate(timeout=60)


def load(server: Server, pairs: list[tuple[str, str]], clients: int, seconds: float) -> dict:
    """Closed-loop clients, client i on pairs[i % len(pairs)]: lines answered per pair, per second."""
    done = {pair: 0 for pair in pairs}
    latencies = {pair: [] for pair in pairs}
    lock, stop = threading.Lock(), time.monotonic() + seconds

    def client(index: int) -> None:
        pair = pairs[index % len(pairs)]
        with httpx.Client(timeout=120) as http:
            at = index
            while time.monotonic() < stop:
                line = LINES[at % len(LINES)]
                at += clients
                start = time.monotonic()
                answer = http.post(f"{server.url}/translate", json={"q": line, "source": pair[0], "target": pair[1]})
                if answer.status_code != 200:
                    raise RuntimeError(
                        f"{pair}: {answer.status_code} {answer.text[:500]} (server log: {server.log.name})"
                    )
                with lock:
                    done[pair] += 1
                    latencies[pair].append(time.monotonic() - start)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    return {pair: {"lines_per_s": done[pair] / elapsed,
                   "median_ms": 1000 * sorted(latencies[pair])[len(latencies[pair]) // 2] if latencies[pair] else None}
            for pair in pairs}  # fmt: skip


def base_size(folder: Path, out: Path) -> Path:
    """A copy of `folder` whose weights are a random Table 3 base model (the same tokenizer and pair): big enough
    that memory shows the models, not the runtime. Its translations run to the source + 50 limit."""
    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

    shutil.copytree(folder, out)
    small = json.loads((folder / "config.json").read_text())
    ids = {k: small[k] for k in ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id")}
    (out / "model.safetensors").unlink()
    VaswaniForConditionalGeneration(VaswaniConfig.base(**ids)).save_pretrained(out)
    return out


def throughput(folders: dict, args: argparse.Namespace) -> list[tuple]:
    """The table's rows: one model alone against two under mixed load, an idle second model, a composed pair."""
    en_de, de_en = ("en", "de"), ("de", "en")
    rows = []
    alone = Server([folders[en_de]])
    solo = load(alone, [en_de], args.clients, args.seconds)[en_de]
    alone.stop()
    two = Server([folders[en_de], folders[de_en]])
    mixed = load(two, [en_de, de_en], args.clients, args.seconds)
    half = load(two, [en_de], args.clients // 2, args.seconds)[en_de]
    two.stop()
    alone = Server([folders[en_de]])
    solo_half = load(alone, [en_de], args.clients // 2, args.seconds)[en_de]
    alone.stop()
    total = sum(m["lines_per_s"] for m in mixed.values())
    rows.append(("one model alone, en->de", f"{solo['lines_per_s']:.1f}", f"{solo['median_ms']:.0f}", "1.00"))
    for pair, figures in mixed.items():
        rows.append((f"two models, mixed load: {pair[0]}->{pair[1]}", f"{figures['lines_per_s']:.1f}",
                     f"{figures['median_ms']:.0f}", ""))  # fmt: skip
    rows.append(("two models, mixed load: both", f"{total:.1f}", "", f"{total / solo['lines_per_s']:.2f}"))
    rows.append((f"one model alone, {args.clients // 2} clients", f"{solo_half['lines_per_s']:.1f}",
                 f"{solo_half['median_ms']:.0f}", "1.00"))  # fmt: skip
    rows.append((f"two models, {args.clients // 2} clients on en->de only", f"{half['lines_per_s']:.1f}",
                 f"{half['median_ms']:.0f}", f"{half['lines_per_s'] / solo_half['lines_per_s']:.2f}"))  # fmt: skip
    three = Server(list(folders.values()))
    direct = load(three, [de_en], args.clients, args.seconds)[de_en]
    composed = load(three, [("de", "fr")], args.clients, args.seconds)[("de", "fr")]
    three.stop()
    rows.append(("direct de->en", f"{direct['lines_per_s']:.1f}", f"{direct['median_ms']:.0f}", "1.00"))
    ratio = composed["lines_per_s"] / direct["lines_per_s"]
    rows.append(("composed de->fr (de->en, en->fr)", f"{composed['lines_per_s']:.1f}",
                 f"{composed['median_ms']:.0f}", f"{ratio:.2f}"))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--memory_only", action="store_true", help="only the --max_loaded runs")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="serve-load-"))
    folders = {}
    for source, target in (("en", "de"), ("de", "en"), ("en", "fr")):
        folder = root / f"{source}-{target}"
        shutil.copytree(args.model_dir, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
        facts_file = folder / "training_facts.json"
        facts = json.loads(facts_file.read_text()) if facts_file.is_file() else {}
        facts["data"] = {**facts.get("data", {}), "src": source, "tgt": target}
        facts_file.write_text(json.dumps(facts))
        folders[(source, target)] = folder
    en_de, de_en = ("en", "de"), ("de", "en")
    rows = []
    try:
        if not args.memory_only:
            rows = throughput(folders, args)
        memory = []
        big = [base_size(folders[pair], root / f"base-{pair[0]}-{pair[1]}") for pair in (en_de, de_en)]
        for most in (1, 2):
            server = Server(big, "--max_loaded", str(most))
            figures = load(server, [en_de, de_en], args.clients, args.seconds)
            rate = sum(f["lines_per_s"] for f in figures.values())
            memory.append((most, server.rss_mb("VmHWM"), server.rss_mb("VmRSS"), rate))
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"CPU: {cpu()}; {args.clients} closed-loop clients, {args.seconds:g} s a run, one line a request\n")
    print("| server, load | lines/s | median latency, ms | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(
        "\n| --max_loaded (two base-size models, 65M parameters each, random weights) | peak RSS, MB | RSS at the end,"
        " MB | lines/s |"
    )
    print("|---|---|---|---|")
    for most, peak, end, rate in memory:
        print(f"| {most} | {peak:.0f} | {end:.0f} | {rate:.2f} |")


if __name__ == "__main__":
    main()
