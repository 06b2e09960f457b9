#!/usr/bin/env bash
# The README's set-up commands. Each installs everything first (idempotent), then:
#   bash run.sh demo   the main job on the embedded default: `kope precompile` of the example
#                      transformer block with the offline heuristic agent on the CPU target
#                      (every kernel verified and timed, all recorded in the experience store),
#                      then `kope compile` of the same model, which runs the chosen kernels
#   bash run.sh test   lint (ruff check, ruff format --check), type-check (mypy --strict),
#                      pytest and the lit suite of the MLIR passes: every stage runs and
#                      reports, and the command fails at the end if any stage failed
#   bash run.sh lint   the lint and type checks alone
#   bash run.sh bench  run benchmarks/dispatch_overhead.py
# PYTHON=/path/to/python chooses the interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

# The tests need the test tools, triton (whose interpreter runs the cuda and ascend
# targets' kernels on the CPU), ray (the cluster tests) and matplotlib (the bench plots);
# the demo needs none of them.
install() {
  local extras=${1-test,cuda,ray,bench}
  "$PYTHON" -m pip install --quiet --disable-pip-version-check torch==2.13.0
  "$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".${extras:+[$extras]}"
}

# mypy cannot follow setuptools' package-dir mapping of an editable install, so it checks
# the installed layout (kope <- kope_compiler/, kope.passes <- passes/, ...) assembled from
# links in a scratch folder.
typecheck() {
  local farm rc=0
  farm=$(mktemp -d "${TMPDIR:-/tmp}/kope-mypy.XXXXXX")
  mkdir "$farm/kope"
  ln -s "$PWD"/kope_compiler/*.py "$PWD"/kope_compiler/{core,frontend,tuner,agents,spaces,tools,testing} \
    "$farm/kope/"
  for room in passes memory targets vocabulary; do ln -s "$PWD/$room" "$farm/kope/$room"; done
  (cd "$farm" && "$PYTHON" -m mypy --config-file "$OLDPWD/pyproject.toml" \
    --cache-dir "$farm/.cache" -p kope) || rc=$?
  rm -rf "$farm"
  return $rc
}

lint() {
  "$PYTHON" -m ruff check .
  "$PYTHON" -m ruff format --check .
  typecheck
}

# Runs one stage of `test` and notes whether it passed; a failed stage does not stop the
# stages after it (a lint error must not hide a failing test, nor a test the lit suite).
failed=()
stage() {
  local name=$1
  shift
  echo "== stage: $name"
  if "$@"; then
    echo "== stage: $name passed"
  else
    echo "== stage: $name FAILED"
    failed+=("$name")
  fi
}

bin=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export PATH="$bin:$PATH"  # the kope and kope-opt scripts, which tests and lit call by name
case "${1:-}" in
  demo)
    install ""
    kope precompile transformer_block --agent heuristic --target cpu --budget 8 \
      --report kope-report.json
    kope compile transformer_block
    ;;
  test)
    install
    stage "ruff check" "$PYTHON" -m ruff check .
    stage "ruff format" "$PYTHON" -m ruff format --check .
    stage "mypy" typecheck
    stage "pytest" "$PYTHON" -m pytest -q
    stage "lit" lit -sv test/lit
    if ((${#failed[@]})); then
      echo "failed stages: ${failed[*]}" >&2
      exit 1
    fi
    echo "every stage passed: ruff check, ruff format, mypy, pytest, lit"
    ;;
  lint)
    install
    lint
    ;;
  bench)
    install
    "$PYTHON" benchmarks/dispatch_overhead.py
    ;;
  *)
    echo "usage: bash run.sh demo|test|lint|bench" >&2
    exit 2
    ;;
esac
