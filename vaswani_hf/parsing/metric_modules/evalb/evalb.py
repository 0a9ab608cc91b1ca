"""EVALB (Sekine & Collins), the constituency parse scorer of section 6.3, as a 🤗 Evaluate metric that loads
offline by path: the figures of the C program run with COLLINS.prm (or nk.prm), from `vaswani_hf.parsing.evalb`."""

import datasets
import evaluate

from vaswani_hf.parsing.evalb import parameters, read_tree, score_trees
from vaswani_hf.parsing.trees import MalformedTree

_CITATION = """@misc{sekine-collins-1997-evalb,
    title = "{EVALB}: a bracket scoring program",
    author = "Sekine, Satoshi and Collins, Michael",
    year = "1997",
    url = "https://nlp.cs.nyu.edu/evalb/",
}"""

_INPUTS = """
Args:
    predictions: the parser's trees, one bracketed string each ('', '()', '(())' or '(TOP)' for a failed parse:
        a skip sentence, as EVALB reads them).
    references: the gold trees, one bracketed string each.
    params: 'collins' (COLLINS.prm, the default) or 'nk' (nk.prm).
Returns:
    evalb_f1, evalb_recall, evalb_precision, evalb_complete_match, evalb_tagging_accuracy, ... (percentages) and
    the same for sentences of at most 40 words (evalb_f1_len40, ...); the sentence counts (evalb_error_sentences...).
"""


def _trees(texts, kind):
    # read as `vaswani evalb` reads a file's lines (EVALB's rules): a parser writes `()` for a sentence it failed,
    # which EVALB counts as a skip sentence, not an error that stops the scoring
    trees = []
    for number, text in enumerate(texts, start=1):
        try:
            trees.append(read_tree(text))
        except MalformedTree as err:
            raise ValueError(f"{kind} {number}: {err}") from None
    return trees


@evaluate.utils.file_utils.add_start_docstrings(__doc__, _INPUTS)
class Evalb(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            reference_urls=["https://nlp.cs.nyu.edu/evalb/"],
        )

    def _compute(self, predictions, references, params="collins"):
        gold, test = _trees(references, "reference"), _trees(predictions, "prediction")
        return score_trees(gold, test, parameters(params)).as_dict()
