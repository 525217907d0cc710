"""Causal-LM text: the built-in corpus, documents, tokenizers (bytes, BPE, transformers'),
rows read through `datasets`, and the packed token blocks."""
