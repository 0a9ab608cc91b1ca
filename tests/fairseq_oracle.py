"""Run by the Python of fairseq's own environment (`tests/fairseq_venv.py`), never imported by the suite: fairseq's
hub interface (`TransformerModel.from_pretrained(...).translate`, fairseq's Moses tokenizer, subword-nmt BPE and
`SequenceGenerator`) translates the sentences of a file with each setting asked for, in one process.

    python tests/fairseq_oracle.py ARCHIVE SOURCES SETTINGS_JSON OUT_JSON [OVERRIDES_JSON]

SETTINGS_JSON maps a name to `translate()`'s keyword arguments (`{"beam": 4, "lenpen": 0.6}`); what is not given is
fairseq-generate's default (max_len_a 0, max_len_b 200, min_len 1, lenpen 1). Two names are not settings:
`"encode": true` gives each source line's ids as fairseq's `encode` makes them (Moses, BPE, dictionary), and
`"decode": [[id, ...], ...]` each id row's string as fairseq's `decode` makes it. OVERRIDES_JSON: keyword arguments
of `from_pretrained` (the archive's arguments overridden, e.g. `{"moses_no_escape": true}`). OUT_JSON gets each
name's results and the generation settings fairseq used."""

import json
import os
import sys

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # fairseq 0.12 unpickles its own argparse checkpoints


def main(archive: str, sources: str, settings: str, out: str, overrides: str = "{}") -> None:
    import torch
    from fairseq.models.transformer import TransformerModel

    torch.set_num_threads(1)
    hub = TransformerModel.from_pretrained(archive, checkpoint_file="model.pt", data_name_or_path=archive,
                                           tokenizer="moses", bpe="subword_nmt", **json.loads(overrides))  # fmt: skip
    hub.eval()
    with open(sources, encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle]
    results = {"generation": {k: hub.cfg.generation[k] for k in ("max_len_a", "max_len_b", "min_len", "lenpen")}}
    with torch.no_grad():
        for name, kwargs in json.loads(settings).items():
            if name == "encode":
                results[name] = [hub.encode(line).tolist() for line in lines]
            elif name == "decode":
                results[name] = [hub.decode(torch.tensor(ids)) for ids in kwargs]
            else:
                results[name] = hub.translate(lines, **kwargs)
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, ensure_ascii=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
