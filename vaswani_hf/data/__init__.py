"""The data (paper section 5.1): readers of parallel text, the shared BPE vocabulary, the prepared format and its
cache, preparation at WMT's size, token-budget batches, the built-in task."""
