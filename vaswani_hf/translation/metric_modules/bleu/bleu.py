"""sacreBLEU's corpus BLEU (cased, detokenized, 13a tokenization: the paper's section 6.1 score as the community
reports it), with its signature, as a 🤗 Evaluate metric that loads offline by path."""

import datasets
import evaluate
import sacrebleu

_CITATION = """@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    url = "https://www.aclweb.org/anthology/W18-6319",
}"""

_INPUTS = """
Args:
    predictions: list of hypotheses, one string each.
    references: list of references, one string each (or a list of strings each, for several references).
Returns:
    bleu: the corpus BLEU score (0-100); bleu_signature: sacreBLEU's signature; brevity_penalty: BP.
"""


@evaluate.utils.file_utils.add_start_docstrings(__doc__, _INPUTS)
class Bleu(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=[
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
                ),
            ],
            reference_urls=["https://github.com/mjpost/sacrebleu"],
        )

    def _compute(self, predictions, references):
        references = [[r] if isinstance(r, str) else list(r) for r in references]
        streams = [list(stream) for stream in zip(*references, strict=True)]  # sacreBLEU: one stream per reference
        bleu = sacrebleu.metrics.BLEU()
        result = bleu.corpus_score(list(predictions), streams)
        return {"bleu": result.score, "bleu_signature": str(bleu.get_signature()), "brevity_penalty": result.bp}
