#!/usr/bin/env python
"""Convert a Transformers Marian checkpoint directory into a Vaswani one.

Usage: python scripts/convert_marian_to_vaswani.py SRC_DIR DST_DIR
The result loads with `AutoModelForSeq2SeqLM.from_pretrained(DST_DIR)` and gives Marian's logits.
"""

import argparse
import sys

from vaswani_hf.convert import convert_marian_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src_dir", help="directory of a saved MarianMTModel (config.json + weights)")
    parser.add_argument("dst_dir", help="output directory for the Vaswani checkpoint")
    args = parser.parse_args(argv)
    try:
        out = convert_marian_checkpoint(args.src_dir, args.dst_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"Vaswani checkpoint written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
