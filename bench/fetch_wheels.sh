#!/usr/bin/env bash
# .wheels for the lent GPU machine (no network there; Python 3.12, torch, Triton and transformers already in its
# image): what engine/server, tests/gpu and the bench scripts import beyond that, as manylinux x86-64 wheels, and
# fla-core with einops (the run_steps.sh `wheels` / `fla_aside` steps keep them apart). .wheels is git-ignored and a
# fresh checkout has none: run this here (PyPI reachable), then carry `.wheels` in the device call.
# `bench/fetch_wheels.sh REV...` also writes .wheels/prev/tree-REV.tgz (REV's engine, for a script's --engine).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .wheels/prev
PLATFORMS=(manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64
    manylinux_2_34_x86_64)
WANT=(
    annotated-doc==0.0.7 annotated-types==0.7.0 anthropic==2.15.0 anyio==4.16.0 apache-tvm-ffi==0.1.15.post2
    attrs==26.1.0 certifi==2026.10.19.post1 click==8.5.1 distro==1.9.0 docstring_parser==0.18.0 einops==0.8.2
    execnet==2.1.2 fastapi==0.165.0 fla-core==0.6.0 h11==0.16.0 httpcore==1.0.9 httpx==0.28.1 idna==3.21
    jiter==0.19.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 openai==3.57.0 opentelemetry-api==1.45.3
    prometheus_client==0.26.0 pydantic==2.14.4 pydantic_core==2.50.5 pytest-timeout==2.4.0 pytest-xdist==3.8.0
    referencing==0.37.0 rpds-py==2026.9.1 sniffio==1.3.1 starlette==1.10.0 typing-inspection==0.4.5 uvicorn==0.54.0
    xgrammar==0.2.9
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]/#/--platform=}" -d .wheels "${WANT[@]}"
for rev in "$@"; do
    git archive --format=tar.gz -o ".wheels/prev/tree-$rev.tgz" "$rev" engine
done
du -sh .wheels
