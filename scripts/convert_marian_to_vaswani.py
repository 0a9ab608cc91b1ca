#!/usr/bin/env python
"""Convert a Transformers Marian checkpoint directory into a Vaswani one.

Usage: python scripts/convert_marian_to_vaswani.py SRC_DIR DST_DIR
The result loads with `AutoModelForSeq2SeqLM.from_pretrained(DST_DIR)`, gives Marian's logits and, by default,
decodes as Marian does (its generation config is carried over); `--paper-decoding` gives it the paper's decoding
(beam 4, GNMT length penalty 0.6, source + 50) instead.
"""

import argparse
import sys

from vaswani_hf.interop.convert import convert_marian_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src_dir", help="directory of a saved MarianMTModel (config.json + weights)")
    parser.add_argument("dst_dir", help="output directory for the Vaswani checkpoint")
    parser.add_argument("--paper-decoding", action="store_true",
                        help="decode with the paper's settings instead of the Marian model's own")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        out = convert_marian_checkpoint(args.src_dir, args.dst_dir, paper_decoding=args.paper_decoding)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"Vaswani checkpoint written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
