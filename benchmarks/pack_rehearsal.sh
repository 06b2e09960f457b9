#!/usr/bin/env bash
# The closest rehearsal of a device run without a device: precompile a model for a Triton
# target, export its kernel pack, and run the pack's runner in a fresh virtual environment
# that holds only torch (the CPU wheel) and triton, under Triton's interpreter.
#   bash benchmarks/pack_rehearsal.sh [MODEL] [cuda|ascend]
# Prints the runner's table; every kernel must come back verified. Then records the results.
set -euo pipefail
model=${1:-transformer_block}
target=${2:-cuda}
work=$(mktemp -d "${TMPDIR:-/tmp}/kope-rehearsal.XXXXXX")
python=${PYTHON:-python3}
kope precompile "$model" --target "$target" --budget 3 --store "$work/store" > "$work/precompile.txt"
kope export --target "$target" -o "$work/pack" --store "$work/store"
"$python" -m venv "$work/env"
"$work/env/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 \
  "triton==$("$python" -c 'import triton; print(triton.__version__)')" numpy
"$work/env/bin/python" -c 'import importlib.util as u; assert not any(u.find_spec(m) for m in ("kope", "torch_mlir", "rustworkx", "openai"))'
TRITON_INTERPRET=1 "$work/env/bin/python" "$work/pack/runner.py" "$work/pack"
kope memory import-results "$work/pack/results.json" --store "$work/store"
echo "rehearsal folder: $work"
