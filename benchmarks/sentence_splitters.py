"""Which sentence splitter `vaswani serve` uses: three kept on PyPI, measured on real text.

newstest2014 holds one sentence a line (a few lines hold two). Consecutive lines are joined with one space into
paragraphs of 3 (as a user's text reaches the server), and each splitter must give the lines back: a paragraph is
right when its sentences are exactly its lines. Also: sentences/s on one core. Run in a virtual environment of its
own (pysbd installs a top-level package named `benchmarks`, which then shadows this folder for the tests):
    pip install sentencex pysbd sentence-splitter
    python benchmarks/sentence_splitters.py [../shared/data/wmt14_newstest2014]
"""

import sys
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared/data/wmt14_newstest2014"
DATA = Path(sys.argv[1]) if len(sys.argv) > 1 else SHARED
FILES = {"en": "newstest2014.en-de.en", "de": "newstest2014.en-de.de", "fr": "newstest2014.en-fr.fr"}


def splitters(lang):
    import pysbd
    import sentencex
    from sentence_splitter import SentenceSplitter

    segmenter = pysbd.Segmenter(language=lang, clean=False)
    moses = SentenceSplitter(language=lang)
    return {
        "sentencex": lambda text: list(sentencex.segment(lang, text)),
        "pysbd": segmenter.segment,
        "sentence-splitter (Moses)": moses.split,
    }


def main() -> None:
    print("| splitter | language | paragraphs right | sentences/s |")
    print("|---|---|---|---|")
    for lang, name in FILES.items():
        lines = (DATA / name).read_text(encoding="utf-8").splitlines()[:1500]
        paragraphs = [lines[i : i + 3] for i in range(0, len(lines) - 2, 3)]
        for label, split in splitters(lang).items():
            right, start = 0, time.perf_counter()
            for paragraph in paragraphs:
                got = [s.strip() for s in split(" ".join(paragraph)) if s.strip()]
                right += got == paragraph
            seconds = time.perf_counter() - start
            print(f"| {label} | {lang} | {100 * right / len(paragraphs):.1f}% | {3 * len(paragraphs) / seconds:,.0f} |")


if __name__ == "__main__":
    main()
