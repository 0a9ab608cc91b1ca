"""sacreBLEU's corpus chrF (character 6-grams, beta 2), with its signature, as a 🤗 Evaluate metric that loads
offline by path."""

import datasets
import evaluate
import sacrebleu

_CITATION = """@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\\'c}, Maja",
    booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015",
    url = "https://aclanthology.org/W15-3049",
}"""

_INPUTS = """
Args:
    predictions: list of hypotheses, one string each.
    references: list of references, one string each (or a list of strings each, for several references).
Returns:
    chrf: the corpus chrF score (0-100); chrf_signature: sacreBLEU's signature.
"""


@evaluate.utils.file_utils.add_start_docstrings(__doc__, _INPUTS)
class Chrf(evaluate.Metric):
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
        streams = [list(stream) for stream in zip(*references, strict=True)]
        chrf = sacrebleu.metrics.CHRF()
        result = chrf.corpus_score(list(predictions), streams)
        return {"chrf": result.score, "chrf_signature": str(chrf.get_signature())}
