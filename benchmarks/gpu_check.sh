#!/usr/bin/env bash
# The GPU path in one command (see benchmarks/gpu_check.py): the teacher group with NCCL at TP1 in
# bf16, a ~1B dense model, a small MoE and a Nemotron-H (Mamba-2, attention and latent MoE layers at
# Nemotron 3 Nano's widths; needs mamba-ssm and causal-conv1d), against HF transformers on the same
# GPU; JSON on stdout. Nothing is downloaded. --dry-run checks everything that needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" benchmarks/gpu_check.py "$@"
