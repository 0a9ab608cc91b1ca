"""Parallel text in the `{split}.{lang}` layout (e.g. ../shared/data/multi30k_en_de: train.en, train.de...)."""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def read_parallel(data_dir: str | Path, split: str, src: str, tgt: str) -> list[tuple[str, str]]:
    """Aligned (source, target) pairs of one split; stripped, with empty pairs dropped and counted.

    Files of different line counts or bytes that are not UTF-8 are errors naming the file, never silently
    truncated data."""
    paths = [Path(data_dir) / f"{split}.{lang}" for lang in (src, tgt)]
    sides = []
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: --data must hold {split}.{src} and {split}.{tgt} (one sentence a line)."
            )
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            line = raw[: err.start].count(b"\n") + 1
            raise ValueError(f"{path}: line {line} is not valid UTF-8; convert the file to UTF-8.") from None
        sides.append(text.splitlines())
    if len(sides[0]) != len(sides[1]):
        raise ValueError(
            f"{paths[0]} has {len(sides[0])} lines but {paths[1]} has {len(sides[1])}: parallel files must be aligned."
        )
    pairs = [(s.strip(), t.strip()) for s, t in zip(*sides, strict=True)]
    kept = [(s, t) for s, t in pairs if s and t]
    if len(kept) < len(pairs):
        logger.warning("%s: dropped %d pairs with an empty side", split, len(pairs) - len(kept))
    if not kept:
        raise ValueError(f"{paths[0]} and {paths[1]} hold no non-empty sentence pairs.")
    return kept
