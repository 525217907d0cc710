#!/usr/bin/env bash
# Gathers into ./.whl (git-ignored) the wheels `python -m app.gpu_suite` installs on a GPU
# machine whose Python has torch, transformers, tensorboard and nvidia-ml-py but no Hydra,
# Optuna, pytest, accelerate (the transformers Trainer of the bench) or datasets (labelled
# data, the DeBERTa step), and no network (docs/observability.md, "GPU suite"). Run it on a machine with PyPI
# access. PYVER is the GPU machine's Python (default 3.12); extra NAME==VERSION arguments are
# fetched too. HAVE names the distributions the GPU image already holds, left out: all of them
# come to about 73 MiB, pandas and pyarrow 67 of it, more than some loans carry (64 MiB), e.g.
#   HAVE="pandas pyarrow pytest pluggy iniconfig accelerate psutil xxhash python-dateutil six markupsafe"
set -euo pipefail
cd "$(dirname "$0")/.."
pyver="${PYVER:-3.12}"
mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
wanted=()
for spec in 'hydra-core>=1.3.2,<1.4' 'omegaconf>=2.3,<2.4' 'optuna>=4.5' alembic sqlalchemy \
    colorlog mako greenlet markupsafe pytest pluggy iniconfig accelerate psutil datasets dill \
    multiprocess pandas pyarrow xxhash python-dateutil six; do
  [[ " ${HAVE:-} " == *" ${spec%%[<>=]*} "* ]] || wanted+=("$spec")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp "${plat[@]}" -d .whl "${wanted[@]}" "$@"
# antlr4 4.9.3 (Hydra's parser runtime) ships only as source: build its pure-Python wheel.
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
ls -1 .whl
du -sh .whl
