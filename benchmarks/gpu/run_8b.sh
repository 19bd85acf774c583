#!/bin/bash
# Issue 26 on one H200: a Llama-3.1-8B-shaped decoder with random weights, exported with a KV cache in FP32, then
# onnxprec's AutoCast FP16 and INT4 (calibrated on CUDA, arithmetic on the GPU through CuPy) and ONNX Runtime's
# MatMulNBitsQuantizer RTN, each timed with host peak RSS and GPU memory (benchmarks/gpu/measure.py).
#
# The device machine gets this repository without network; the caller carries a folder G (default .gpu8b) holding
#   src/onnxprec (the code under test), gpu/ (this folder), whl/*.whl (onnx-ir >= 1.1), parts/ (onnxruntime-gpu
#   1.31.1's wheel cut with `split -b 50M -d`), and later folders .gpu8b_pN with the other parts.
#
#   run_8b.sh stage        (on the development machine, from the repository root) refreshes G's src/onnxprec and
#                          gpu/ from the working tree, keeping its whl/ and parts/
#   run_8b.sh start        environment (the CuPy backend tests too with PYTEST=1), then the pipeline in the background
#                          (from a copy of G on the work disk, so later calls may drop G)
#   run_8b.sh part DIR     adds DIR's wheel parts (marks them complete when DIR holds a file named LAST)
#   run_8b.sh wait SECS    follows the pipeline for at most SECS seconds; copies the results to $OUT
# The pipeline: the export, then STEPS (default "int4"; "int4 autocast ortrtn" for all three), each under
# measure.py: wall time, host peak RSS (/usr/bin/time -v), RSS and GPU memory sampled every 0.5 s, and the INT4
# step's phases (load+select, written text, calibration walk, after the walk, save, check) with each one's wall time
# and peak RSS, printed in pipeline.log as each step ends. INT4_CAP (default 840 s) bounds the INT4 step.
# A later call does not find the carried G any more (an ignored path not carried again is gone): run those two from
# the copy, `bash /g8b/g/gpu/run_8b.sh part .gpu8b_p1` (the work dir is the roomiest disk's g8b, in /root/g8b_dir).
# Results of the 2026-11-28 run, with the exact commands: benchmarks/results/gpu-2026-11-28.json.
set -u
G=${G:-$PWD/.gpu8b}
STATE=/root/g8b_dir

pick_dir() {  # the non-tmpfs file system with the most free space
    df -B1G --output=fstype,avail,target 2>/dev/null | tail -n +2 | grep -v -E '^(tmpfs|devtmpfs|proc|sysfs)' \
        | sort -k2 -n | tail -1 | awk '{print $3}'
}

# A phase of the INT4 step starts at the first log line (after the previous phase's) that matches its regex; the check's
# start is its first progress line (within 10 s of it), looked for only once the save has started ('>': the walk logs
# the same progress lines; the 2026-11-29b table called the walk 'check').
INT4_PHASES='load+select=^;written text=An LLM without layer options;calibration walk=Quantizing [0-9]+ weights'
INT4_PHASES+=';after the walk=Reference run: [0-9]+ tensors;save=Model weights exceed|Saving weights|Writing weights'
INT4_PHASES+=';check=>Reference run \(segments\)|INT4 result|ONNX Runtime ran the output|Quantized [0-9]+ weights'

case "$1" in
stage)
    mkdir -p "$G/src" "$G/gpu" "$G/whl" "$G/parts"
    rm -rf "$G/src/onnxprec" && cp -r src/onnxprec "$G/src/" && cp benchmarks/gpu/* "$G/gpu/"
    find "$G/src" -name __pycache__ -prune -exec rm -rf {} +
    du -sh "$G" "$G"/*; ls "$G"/parts "$G"/whl
    ;;
start)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    df -hT 2>/dev/null | grep -v -E 'proc|sysfs|cgroup'
    nproc; free -g
    base=$(pick_dir); W="${base%/}/g8b"; mkdir -p "$W/parts" "$W/site" && echo "$W" > $STATE
    echo "work dir $W"
    cp "$G"/parts/* "$W/parts/"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$G"/whl/*.whl
    cp "$G/gpu/sitecustomize.py" "$W/site/"
    rm -rf "$W/g" && cp -r "$G" "$W/g" && G="$W/g"
    export PYTHONPATH="$W/site:$G/src"
    python3 -c "import sys, numpy, cupy, torch, onnx, onnx_ir, onnxprec; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__, 'onnx', onnx.__version__, 'onnx_ir', onnx_ir.__version__, onnxprec.__file__)"
    G="$G" setsid nohup bash "$G/gpu/run_8b.sh" pipeline > "$W/pipeline.log" 2>&1 < /dev/null &
    if [ "${PYTEST:-0}" = 1 ]; then
        timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" "$G/src/onnxprec/_array_test.py" \
            "$G/src/onnxprec/quantization/algorithms/backend_test.py" 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
    fi
    sleep 5; tail -5 "$W/pipeline.log"
    ;;
part)
    W=$(cat $STATE); cp "$2"/part* "$W/parts/"; ls -la "$W/parts"
    [ -e "$2/LAST" ] && touch "$W/parts/COMPLETE"
    tail -3 "$W/pipeline.log"
    ;;
pipeline)
    W=$(cat $STATE); cd "$W" || exit 1
    mkdir -p "$W/tmp"
    # the GPTQ results spilled during the walk and the activations carried between segments go to the work disk
    export PYTHONPATH="$W/site:$G/src" PYTHONUNBUFFERED=1 TMPDIR="$W/tmp"
    deadline=$((SECONDS + ${BUDGET_S:-1100}))  # the device time this pipeline may take, all steps together
    step() {  # step NAME CAP_S [--phases SPEC] -- COMMAND...: measured, at most CAP_S s and never past the deadline
        local name=$1 cap=$2; shift 2
        local left=$((deadline - SECONDS)); [ "$left" -lt "$cap" ] && cap=$left
        if [ "$cap" -lt 60 ]; then echo "== $name skipped: ${left}s of the budget left"; return; fi
        echo "== $name $(date -u +%T) (at most ${cap}s)"
        local phases=(); [ "$1" = --phases ] && phases=(--phases "$2") && shift 2
        shift  # --
        python3 "$G/gpu/measure.py" "$name" "$W/results" "${phases[@]}" -- timeout "$cap" "$@"
    }
    wants() { [[ " ${STEPS:-int4} " == *" $1 "* ]]; }
    step export 600 -- python3 "$G/gpu/make_llama.py" "$W/fp32" --exporter torchscript
    echo "== waiting for the onnxruntime-gpu parts $(date -u +%T)"
    while [ ! -e "$W/parts/COMPLETE" ]; do sleep 2; done
    cat "$W"/parts/part* > "$W/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/ort" "$W"/onnxruntime_gpu-*.whl
    export PYTHONPATH="$W/ort:$W/site:$G/src" G8B_PRELOAD=1
    nv=$(python3 -c "import glob, site; print(':'.join(glob.glob(site.getsitepackages()[0] + '/nvidia/*/lib') + glob.glob(site.getsitepackages()[0] + '/nvidia/*/*/lib')))")
    export LD_LIBRARY_PATH="$nv:${LD_LIBRARY_PATH:-}"
    python3 "$G/gpu/check_ort_cuda.py" || echo "onnxruntime CUDA check failed"
    mkdir -p "$W/int4" "$W/fp16" "$W/ortrtn"
    if wants int4; then
        step int4_default_cuda "${INT4_CAP:-840}" --phases "$INT4_PHASES" -- python3 -m onnxprec.quantization.int4 \
            --onnx_path "$W/fp32/model.onnx" --output_path "$W/int4/model.onnx" \
            --calibration_eps cuda --log_level INFO --report_json "$W/results/int4_report.json"
        du -sb "$W/int4" > "$W/results/int4_size.txt"; rm -rf "$W/int4"
    fi
    if wants autocast; then
        step autocast_fp16_cuda 480 -- python3 -m onnxprec.autocast \
            --onnx_path "$W/fp32/model.onnx" --output_path "$W/fp16/model.onnx" --providers cuda --log_level INFO \
            --report_json "$W/results/autocast_report.json"
        du -sb "$W/fp16" > "$W/results/fp16_size.txt"; rm -rf "$W/fp16"
    fi
    if wants ortrtn; then
        step ort_matmulnbits_rtn 480 -- python3 -m onnxruntime.quantization.matmul_nbits_quantizer \
            --input_model "$W/fp32/model.onnx" --output_model "$W/ortrtn/model.onnx" --quant_method default \
            --block_size 128 --symmetric True --accuracy_level 4 --nodes_to_exclude /lm_head/MatMul
        du -sb "$W/ortrtn" > "$W/results/ortrtn_size.txt"
    fi
    echo "== done $(date -u +%T)"
    touch "$W/results/DONE"
    ;;
wait)
    W=$(cat $STATE); G="$W/g"; end=$((SECONDS + $2))
    while [ $SECONDS -lt $end ] && [ ! -e "$W/results/DONE" ]; do sleep 5; done
    cat "$W/pipeline.log"; ls -la "$W/results"; df -h "$W" | tail -1
    mkdir -p "$OUT/r"
    cp "$W/pipeline.log" "$OUT/"
    python3 "$G/gpu/collect.py" "$W/results" "$OUT/r/results.json"
    for f in "$W"/results/*.log; do tail -c 60000 "$f" > "$OUT/r/$(basename "$f")"; done 2>/dev/null
    cp "$W"/results/*.rss.tsv "$OUT/r/" 2>/dev/null
    grep -h -A8 '^{"name"' "$W/pipeline.log"  # each step's numbers and the INT4 phases, last in the output
    ;;
esac
