# GPUFlex tasks. `just demo` and `just test` create .venv on first use.

set shell := ["bash", "-euo", "pipefail", "-c"]

# Which torch to install: the CPU build by default. See README "GPU install paths".
torch_spec := env_var_or_default("GPUFLEX_TORCH", "torch==2.13.0")
torch_index := env_var_or_default("GPUFLEX_TORCH_INDEX", "")

default:
    @just --list

# Create .venv and install GPUFlex with the chosen torch; does nothing when up to date.
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
    want="$(cat pyproject.toml | sha256sum | cut -c1-16) {{torch_spec}} {{torch_index}}"
    if [ -f .venv/.gpuflex-setup ] && [ "$(cat .venv/.gpuflex-setup)" = "$want" ]; then exit 0; fi
    .venv/bin/python -m pip install --quiet --upgrade pip
    if [ -n "{{torch_index}}" ]; then
        .venv/bin/python -m pip install --quiet "{{torch_spec}}" --index-url "{{torch_index}}"
    else
        .venv/bin/python -m pip install --quiet "{{torch_spec}}"
    fi
    .venv/bin/python -m pip install --quiet -e '.[dev,llm]'
    # The extras must never replace the pinned torch (a newer one pulls GBs of CUDA).
    .venv/bin/python -c 'import sys, torch; want = sys.argv[1].partition("==")[2]; sys.exit(0 if not want or torch.__version__.split("+")[0] == want else f"torch {torch.__version__} replaced {want}")' "{{torch_spec}}"
    echo "$want" > .venv/.gpuflex-setup

# Run the main job on a local mesh of node processes on loopback.
demo *ARGS: setup
    .venv/bin/gpuflex demo {{ARGS}}

# The test suite: four workers, a test file each at a time, the longest files first
# (tests/conftest.py): the real-process tests spend more than half their time waiting on
# deadlines and the network. Four were once too many for two cores (load averages of 10 to 19
# and waits running out, when the suite took 750-1,100 CPU seconds); at about 400 CPU seconds
# they kept the load near 5 and the run under five minutes. The suite has grown back to
# 800-960 CPU seconds and 440-520 s on two cores, over the five-minute budget (BENCHMARKS.md,
# "The suite, 2026-12-02").
# Bytecode is cached even where the environment sets PYTHONDONTWRITEBYTECODE: every worker and
# every node or CLI process the tests start would otherwise compile the project again (and
# pytest rewrite every test module's asserts again), about 15 CPU seconds per worker.
# The 200-node simulation (tests/scale, 3-4 CPU-minutes) is left out: `just test-scale` runs it.
# Run the whole test suite but the 200-node simulation.
test *ARGS: setup
    PYTHONDONTWRITEBYTECODE= .venv/bin/python -m pytest -q -rs -n 4 --dist loadfile --no-loadscope-reorder -m "not scale" {{ARGS}}

# The simulated mesh at 200 nodes: every round commits through a churn trace, no accepted
# update is lost, upkeep per node stays bounded.
# Run the 200-node simulated mesh test (CI runs it after `just test`).
test-scale *ARGS: setup
    PYTHONDONTWRITEBYTECODE= .venv/bin/python -m pytest -q -rs -m scale tests/scale {{ARGS}}

# Lint: ruff, the import contracts (pyproject.toml [tool.importlinter]), mypy (pyproject.toml [tool.mypy]).
lint: setup
    .venv/bin/ruff check .
    .venv/bin/lint-imports --no-cache
    .venv/bin/mypy

# Build the wheel and the sdist into dist/ (`pip install dist/gpuflex-*.whl` installs this version).
dist: setup
    rm -f dist/gpuflex-*.whl dist/gpuflex-*.tar.gz
    .venv/bin/python -m build --outdir dist .
    sha256sum dist/gpuflex-*.whl

# Run the benchmarks and print ratios measured side by side.
bench *ARGS: setup
    .venv/bin/python -m benchmarks {{ARGS}}
