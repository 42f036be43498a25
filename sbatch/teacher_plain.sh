#!/bin/bash
# Start one teacher with plain sbatch (no submitit): render its script and submit it.
#   bash sbatch/teacher_plain.sh RECIPE TEACHER RUN_DIR [overrides...]
# `podium render --write` also writes the run directory (spec, rendezvous.json, token), so the
# job entry finds what it needs; trainers then `podium wait RUN_DIR` and connect as usual.
set -euo pipefail
RECIPE=$1 TEACHER=$2 RUN_DIR=$3
shift 3
script=$(mktemp)
trap 'rm -f "$script"' EXIT
${PODIUM:-podium} render "$RECIPE" "$@" --teacher "$TEACHER" --run-dir "$RUN_DIR" --write > "$script"
sbatch --parsable "$script"
