"""Tokenized BLEU as the paper and Ott et al. (2018) report it (section 6.1, Table 2), then multi-bleu.perl's corpus
BLEU (sacreBLEU with `tokenize="none"`). A 🤗 Evaluate metric that loads offline by path; its configuration name is
the Moses language (`--metric tokenized_bleu:de`; default en), which picks the procedure:

- French (`fr`): fairseq's `prepare-wmt14en2fr.sh` for its test set: `’` -> `'`, then Moses with `-a` (aggressive
  dash splits) and escaping; no compound splitting. newstest2014's French reference: 82,787 tokens.
- any other language (`de`): tensor2tensor's `get_ende_bleu.sh` and fairseq's `compound_split_bleu.sh`: Moses
  without `-a`, with escaping, then hyphenated compounds split (`##AT##-##AT##`). newstest2014's German reference:
  64,496 tokens.

`<unk>` in a hypothesis (as fairseq prints it) stays one token. Needs sacremoses (`pip install "vaswani-hf[fairseq]"`).
"""

import re

import datasets
import evaluate
import sacrebleu

_INPUTS = """
Args:
    predictions: list of detokenized hypotheses, one string each.
    references: list of detokenized references, one string each.
Returns:
    tokenized_bleu: the corpus BLEU of the tokenized text (0-100); tokenized_bleu_signature; tokenized_bleu_sys_len and
    tokenized_bleu_ref_len, the token counts BLEU's brevity penalty compares (fairseq prints them).
"""


def split_compounds(text: str) -> str:
    # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g': non-overlapping, left to right, as Python's re.sub
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", text)


@evaluate.utils.file_utils.add_start_docstrings(__doc__, _INPUTS)
class TokenizedBleu(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions, references):
        from sacremoses import MosesTokenizer

        language = self.config_name if self.config_name not in (None, "default") else "en"
        moses = MosesTokenizer(lang=language)
        french = language == "fr"  # prepare-wmt14en2fr.sh's test set

        # `<unk>` through Moses as a word of letters, which it neither splits nor escapes, so that it stays glued to
        # the letters beside it as in fairseq's output (`Bü<unk>t` one token, `<unk>-Haus` split as a compound)
        unknown = "UNKXQZPLACEHOLDER"

        def tokenized(text: str) -> str:
            text = text.replace("<unk>", unknown)
            text = text.replace("\u2019", "'") if french else text
            text = moses.tokenize(text, aggressive_dash_splits=french, return_str=True, escape=True)
            text = text.replace(unknown, "<unk>")
            return " ".join((text if french else split_compounds(text)).split())

        bleu = sacrebleu.metrics.BLEU(tokenize="none", force=True)
        result = bleu.corpus_score([tokenized(p) for p in predictions], [[tokenized(r) for r in references]])
        procedure = "quote+moses-a-fr" if french else f"moses-{language}+compound-split"
        return {"tokenized_bleu": result.score, "tokenized_bleu_signature": f"{procedure}|{bleu.get_signature()}",
                "tokenized_bleu_sys_len": result.sys_len, "tokenized_bleu_ref_len": result.ref_len}  # fmt: skip
