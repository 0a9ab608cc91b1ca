"""Tokenized BLEU as the paper reports it (section 6.1, Table 2): hypotheses and references Moses-tokenized, hyphenated
compounds split (`##AT##-##AT##`), then multi-bleu.perl's corpus BLEU (sacreBLEU with `tokenize="none"`), the
procedure of tensor2tensor's `get_ende_bleu.sh` and fairseq's `compound_split_bleu.sh`. A 🤗 Evaluate metric that
loads offline by path; its configuration name is the Moses language (`--metric tokenized_bleu:de`; default en).
Needs sacremoses (`pip install "vaswani-hf[fairseq]"`)."""

import re

import datasets
import evaluate
import sacrebleu

_INPUTS = """
Args:
    predictions: list of detokenized hypotheses, one string each.
    references: list of detokenized references, one string each.
Returns:
    tokenized_bleu: the corpus BLEU of the tokenized, compound-split text (0-100); tokenized_bleu_signature.
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

        def tokenized(text: str) -> str:
            return split_compounds(moses.tokenize(text, return_str=True, escape=True))

        bleu = sacrebleu.metrics.BLEU(tokenize="none", force=True)
        result = bleu.corpus_score([tokenized(p) for p in predictions], [[tokenized(r) for r in references]])
        signature = f"moses-{language}+compound-split|{bleu.get_signature()}"
        return {"tokenized_bleu": result.score, "tokenized_bleu_signature": signature}
