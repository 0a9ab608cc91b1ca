"""Translation with a trained model: loading, batched and n-best translation, ensembles, vocabulary shortlists,
source lines, BLEU/chrF, attention maps."""
