"""`python -m app.report --storage URL_OR_JOURNAL [--study NAME] [--out DIR]`: a study's
report.html (self-contained: it opens offline, with no server) and PNGs of its main plots, for
any study: this sweeper's (the sweep writes one itself at its end) or one of plain Optuna.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.report", description=__doc__.splitlines()[0])
    p.add_argument("--storage", required=True, help="a database URL or an Optuna journal file")
    p.add_argument("--study", help="the study's name (needed when the storage holds several)")
    p.add_argument(
        "--out", help="where to write (default: <the journal's folder, else here>/<study>)"
    )
    args = p.parse_args(argv)
    from hydra_plugins.hydratrain_optuna_sweeper.report import ReportError, write_study_report

    try:
        path = write_study_report(args.storage, args.study, args.out)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"Report in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
