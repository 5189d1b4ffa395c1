#!/usr/bin/env bash
# The verl 0.9.1 folder for the H200 (issue 21 item 5): what verl's GRPO path needs beyond the machine's
# `pip list` (tests/gpu/h200_piplist.txt) and the vLLM bundle (tests/gpu/bundle_wheels.txt), installed with
# `pip install --no-index --no-deps --target` by a CPython 3.12 here, slimmed, packed as vt.tar.xz and
# split into .gpu/v1 (26 MiB, carried with .gpu/p2) and .gpu/v2 (the rest, VT_SHA256SUMS).
# Needs the package index. usage: bash tests/gpu/verl_wheels.sh   (PY312=path of a python3.12)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY312=${PY312:-/root/.pyenv/versions/3.12.1/bin/python3.12}
WH=.gpu/verl-wheels; mkdir -p "$WH"
# verl 0.9.1 pins transformers>=5.5.3,<5.11 (its vllm extra: 5.9.0); 5.9.0 needs tokenizers<=0.23.0 (machine: 0.23.2).
# uvicorn, watchfiles, model-hosting-container-standards, prometheus-fastapi-instrumentator: vLLM's OpenAI server modules, imported by verl's
# vllm_async_server (the bundle leaves `vllm serve` out). transferqueue: verl's default V1 trainer (trainer.use_v1).
python3 tests/gpu/swift_wheels.py "$WH" tests/gpu/h200_piplist.txt tests/gpu/bundle_wheels.txt \
  verl==0.9.1 transformers==5.9.0 tokenizers==0.22.2 transferqueue==0.1.11 hydra-core==1.3.8 omegaconf==2.3.1 uvicorn watchfiles \
  model-hosting-container-standards prometheus-fastapi-instrumentator orjson jsonschema || true
rm -f "$WH"/packaging-*.whl "$WH"/wandb-*.whl        # machine's packaging 26.3 kept; wandb unused with the file logger
ls "$WH"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1 || python3 -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w "$WH"
rm -rf /tmp/vt && "$PY312" -m pip install -q --no-index --no-deps --no-compile --target /tmp/vt "$WH"/*.whl
# not imported on this path: console scripts (this machine's shebang), Ray's Java jar and dashboard UI, RLlib,
# the top-level test/script/recipe folders of verl and transferqueue (a `tests` package would shadow the repo's)
(cd /tmp/vt && rm -rf bin ray/jars ray/dashboard/client/build ray/rllib tests scripts recipe tutorial pydevd_plugins &&
 find . -name __pycache__ -prune -exec rm -rf {} +)
tar -C /tmp -cf - vt | xz -7 -T1 > .gpu/vt.tar.xz
rm -rf .gpu/v1 .gpu/v2 && mkdir -p .gpu/v1 .gpu/v2
(cd .gpu && split -b 26M vt.tar.xz v1/vt.tar.xz.part- && mv v1/vt.tar.xz.part-a[b-z] v2/ &&
 sha256sum vt.tar.xz > v2/VT_SHA256SUMS && (cd v1 && sha256sum vt.tar.xz.part-*) >> v2/VT_SHA256SUMS &&
 (cd v2 && sha256sum vt.tar.xz.part-a[b-z]) >> v2/VT_SHA256SUMS && rm vt.tar.xz)
du -cb .gpu/v1/* .gpu/v2/*
