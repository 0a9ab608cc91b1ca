"""Run by the Python of fairseq's own environment (`tests/fairseq_venv.py`), never imported by the suite: fairseq's
hub interface (`TransformerModel.from_pretrained(...).translate`, fairseq's Moses tokenizer, subword-nmt BPE and
`SequenceGenerator`) translates the sentences of a file with each setting asked for, in one process.

    python tests/fairseq_oracle.py ARCHIVE SOURCES SETTINGS_JSON OUT_JSON

SETTINGS_JSON maps a name to `translate()`'s keyword arguments (`{"beam": 4, "lenpen": 0.6}`); what is not given is
fairseq-generate's default (max_len_a 0, max_len_b 200, min_len 1, lenpen 1). OUT_JSON gets each name's strings and
the generation settings fairseq used."""

import json
import os
import sys

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # fairseq 0.12 unpickles its own argparse checkpoints


def main(archive: str, sources: str, settings: str, out: str) -> None:
    import torch
    from fairseq.models.transformer import TransformerModel

    torch.set_num_threads(1)
    hub = TransformerModel.from_pretrained(archive, checkpoint_file="model.pt", data_name_or_path=archive,
                                           tokenizer="moses", bpe="subword_nmt").eval()  # fmt: skip
    with open(sources, encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle]
    results = {"generation": {k: hub.cfg.generation[k] for k in ("max_len_a", "max_len_b", "min_len", "lenpen")}}
    with torch.no_grad():
        for name, kwargs in json.loads(settings).items():
            results[name] = hub.translate(lines, **kwargs)
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, ensure_ascii=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
