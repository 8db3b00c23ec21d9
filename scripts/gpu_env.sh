# Sourced by the scripts/gpu_*.sh that run on the GPU machine (torch and Triton there; no
# network): installs the wheels carried in .whl/ into /tmp/site, sets the environment, and
# unpacks a previous call's Triton/fla JIT cache (.whl/triton-cache.tgz.part-*: binaries and
# metadata only, ~70 MB unpacked, ~17 MB packed, in parts under the 16 MB a file from $OUT may have).
# `save_jit_cache` packs it into $OUT; copy those parts into .whl/ for the next call.
# A script sourcing this from another that did (scripts/gpu_stages.sh) finds it done.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -z "${EDGEMOE_GPU_ENV:-}" ]; then
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD/src:$PWD" EDGEMOE_CACHE_DIR=/tmp/edgemoe-cache PYTHONUNBUFFERED=1
mkdir -p .triton-cache && export TRITON_CACHE_DIR="$PWD/.triton-cache"
if compgen -G ".whl/triton-cache.tgz.part-*" >/dev/null; then cat .whl/triton-cache.tgz.part-* | tar xz -C .triton-cache
elif [ -f .whl/triton-cache.tgz ]; then tar xzf .whl/triton-cache.tgz -C .triton-cache; fi
export EDGEMOE_GPU_ENV=1 EDGEMOE_GPU_ENV_OWNER=$$
fi

save_jit_cache() {  # by the outermost script only
  if [ -n "${OUT:-}" ] && [ "${EDGEMOE_GPU_ENV_OWNER:-}" = "$$" ]; then
    # A cache hit reads only the metadata .json and the .cubin (Triton 3.6's get_group keeps
    # the files that exist): the IR text levels are 6/7 of the bytes (337 MB -> 71 MB).
    find .triton-cache -type f \( -name '*.ptx' -o -name '*.llir' -o -name '*.ttir' -o -name '*.ttgir' \
      -o -name '*.source' \) -delete 2>/dev/null
    python3 scripts/prune_jit_cache.py .triton-cache  # under the carry limit: the newest entries a kernel
    tar czf - -C .triton-cache . 2>/dev/null | split -b 15M - "$OUT/triton-cache.tgz.part-" || true
  fi
}
