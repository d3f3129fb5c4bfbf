#!/usr/bin/env bash
# The GPU host run, in two phases that fit the device tool's 10-minute calls:
#   bash benchmarks/gpu_session.sh test    # install, build every card, the GPU test suite
#   bash benchmarks/gpu_session.sh bench   # kernelkit run + loader benchmarks; bench2: diffusion + triton cross-check
#   bash benchmarks/gpu_session.sh split   # the split's differential corpus against torch's builds (+ probes)
# Wheels the host lacks travel in .whl/ (see the device docs); results go under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kk-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KERNELKIT_CACHE_DIR=${KERNELKIT_CACHE_DIR:-/tmp/kk-gpu-cache}
if [ -d .whl ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import kernelkit" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3

case "${1:-test}" in
test)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
  python3 -c "import torch, kernelkit; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
  # build every card in parallel processes (16 cores) so the tests find them cached
  python3 -c "import kernelkit; print('\n'.join(kernelkit.cards()))" | xargs -P 8 -I{} python3 -m kernelkit build {} > "$OUT/build.txt" 2>&1
  tail -20 "$OUT/build.txt"
  timeout ${TEST_TIMEOUT:-480} python3 -m pytest -m "${PYTEST_MARK:-gpu}" -q -rfEs --durations=20 ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -60
  # the notebooks, every one in its GPU mode (01-03 are not marked gpu: CI runs them on the CPU)
  timeout ${NB_TIMEOUT:-300} python3 -m pytest tests/test_notebooks.py -q -rfEs -n 4 2>&1 | tee "$OUT/pytest_notebooks.txt" | tail -15
  ;;
bench)
  /usr/bin/time -f "kernelkit run wall time: %e s" timeout ${RUN_TIMEOUT:-330} python3 -m kernelkit run --out "$OUT/run" 2>&1 | tail -45
  timeout ${LB_TIMEOUT:-240} python3 benchmarks/loader_bench.py --repeat ${LOADER_REPEAT:-2} --json "$OUT/loader_bench.json" 2>&1 | tail -12
  ;;
split)
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  for root in ${SC_ROOTS:-tests/fixtures/split_corpus}; do
    name=$(basename "$root")
    timeout ${SC_TIMEOUT:-540} python3 benchmarks/split_corpus.py --root "$root" --torch-steps ${SC_TORCH:-original} \
      --jobs ${SC_JOBS:-12} --work "/tmp/kk-sc-$name" --out "$OUT/$name.json" ${SC_ARGS:-} 2>&1 | tee "$OUT/$name.txt" | tail -70
  done
  ;;
bench2)
  PYTHONPATH=examples:$PYTHONPATH timeout ${DB_TIMEOUT:-300} python3 -m diffusion_policy.bench --json "$OUT/diffusion_bench.json" ${DB_ARGS:-} 2>&1 | tail -40
  timeout 120 python3 benchmarks/crosscheck_triton.py --json "$OUT/crosscheck.json" 2>&1 | tail -10
  timeout ${LB_TIMEOUT:-200} python3 benchmarks/loader_bench.py --repeat ${LOADER_REPEAT:-1} --json "$OUT/loader_bench.json" 2>&1 | tail -10
  ;;
esac
