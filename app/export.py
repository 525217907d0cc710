"""`python -m app.export`: write a run's model in Hugging Face format (see app/cli/export.py)."""

from __future__ import annotations

from app.cli.export import main

if __name__ == "__main__":
    main()
