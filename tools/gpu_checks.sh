#!/usr/bin/env bash
# The checks that need the lent GPU machine (16 cores, one H200), as run for docs/benchmarks.md:
#
#   hybrid  Qwen3.5 packed == alone with flash-linear-attention's kernels (tools/check_hybrid_kernels.py)
#   train   one training step of Qwen2.5-VL-3B's sizes, naive vs packed (bench/bench_train_step.py --preset gpu)
#   ray     prepare 1 M rows on Ray Data and locally, 4 and 16 CPUs (bench/bench_prepare.py)
#
#   bash tools/gpu_checks.sh wheels            # here, once: the wheels below (.git/info/exclude them)
#   bash tools/gpu_checks.sh hybrid train      # there, carrying .whl: results under $OUT
#   bash tools/gpu_checks.sh ray               # there, carrying .whl and .whl_ray
#
# That machine reaches no package registry: the wheels it lacks travel with the working tree,
# downloaded here for its Python 3.12:
#   .whl/       transformers 5.23.0 (it has 5.17), datasets 5.2.0 with dill and multiprocess,
#               num2words, fla-core and flash-linear-attention 0.6.0; .whl/alt/ datasets 4.4.1,
#               for an older pyarrow
#   .whl_ray/   ray 2.60.0 unpacked without its jars, rllib, serve and llm, as .tar.xz (the wheel,
#               79 MB, is over the tool's 64 MiB), and jsonschema with what it needs
set -u
if [ "${1:-}" = wheels ]; then
    get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$@"; }
    get .whl transformers==5.23.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
        num2words==0.5.14 fla-core==0.6.0 flash-linear-attention==0.6.0
    get .whl/alt datasets==4.4.1
    get .whl_ray jsonschema jsonschema-specifications referencing rpds-py
    get /tmp/ray-wheel ray==2.60.0
    rm -rf /tmp/ray-unpacked && mkdir /tmp/ray-unpacked && unzip -q /tmp/ray-wheel/ray-*.whl -d /tmp/ray-unpacked
    (cd /tmp/ray-unpacked && rm -rf ray/jars ray/rllib ray/serve ray/llm && tar cf - . | xz -6) >.whl_ray/ray-2.60.0-cp312-trimmed.tar.xz
    exit
fi
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 MMDP_CACHE=/tmp/mmdp-cache TOKENIZERS_PARALLELISM=false
site=/tmp/site
if [ ! -d $site/transformers ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $site .whl/*.whl || exit 1
fi
export PYTHONPATH=$site:$PWD/src
if ! python3 -c "import datasets" 2>/dev/null; then  # datasets 5 needs pyarrow >= 24
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/alt/*.whl
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers, datasets, pyarrow; print('torch', torch.__version__, 'transformers', transformers.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)"

for check in "$@"; do
    case $check in
    hybrid)
        for flags in "" "--moe --dtype bfloat16"; do
            timeout 150 python3 tools/check_hybrid_kernels.py $flags
        done 2>&1 | tee "$OUT/hybrid.md"
        ;;
    train)
        timeout 330 python3 bench/bench_train_step.py --preset gpu --rounds 1 \
            --figure "$OUT/train_step_gpu.png" 2>&1 | tee "$OUT/train_step_gpu.txt"
        ;;
    ray)
        if [ ! -d $site/ray ]; then
            tar xJf .whl_ray/ray-*.tar.xz -C $site || exit 1
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $site .whl_ray/*.whl
        fi
        timeout 330 python3 bench/bench_prepare.py --rows 1000000 --cpus 4 16 --engines ray local \
            --repeats 1 2>&1 | grep -v "Running Dataset\|^- \|it/s\]" | tee "$OUT/bench_prepare.txt"
        ;;
    esac
done
