"""Command lines: the preflight of `python -m app.train`, the export, the run-directory guard."""
