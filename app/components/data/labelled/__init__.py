"""Labelled texts and text pairs for classification: the built-in NLI corpus, the columns
they need, tokenized and padded samples."""
