"""`python -m app.gpu_suite --out DIR`: every GPU check of the trainer in one command.

Each step (`--list`) runs the trainer, its bench or its tests through their command lines,
within its own time limit, and reads what they write (summary.json, metrics.jsonl,
TensorBoard events, the bench's JSON, JUnit XML). `DIR/report.md` and `DIR/report.json` are
rewritten after every command, so a suite stopped at any point leaves its report.
`--dry-run` runs every step at tiny sizes on the CPU, and checks the settings of the commands
that need a GPU, so that a typo fails in CI and not on the rare GPU machine.
"""
