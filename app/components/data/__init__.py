"""Data: corpora, tokenizers, sources, packed blocks, padded rows, the step loader."""
