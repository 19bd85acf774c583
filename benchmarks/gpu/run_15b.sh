#!/bin/bash
# Issue 26 on one H200 with the REAL Qwen2.5-Coder-1.5B-Instruct: the device has no network and each call carries at
# most 64 MiB, so the 1.1 GB Q4_K_M GGUF the FP32 ONNX was built from travels in parts and the FP32 model is rebuilt
# there exactly as ../shared/zoo/bigllm/build.sh did (gguf2hf with the gguf package, then onnxruntime-genai 0.18's
# builder, -p fp32 -e cpu). Then, each under measure.py (wall time, host peak RSS, GPU memory): onnxprec's calibrated
# INT4 default on CUDA, ONNX Runtime's MatMulNBitsQuantizer RTN and k_quant (block 32), ModelOpt 0.47 awq_lite, and
# the held-out perplexity of each result (llm15.py ppl, CPU ONNX Runtime, windows 8-15 of ids15.npy).
# STEPS=genai: FP16 and BF16 on onnxruntime-genai-cuda 0.18.0 (its own --target dir, W/gcuda, on the PYTHONPATH of
# the generation step only: the builder keeps the CPU onnxruntime-genai of whl/): the builder's own -p fp16 / -p bf16
# -e cuda (from the Hugging Face folder, before it is removed: the pipeline only) and onnxprec's AutoCast FP16 / BF16
# of the rebuilt FP32 (`onnxprec autocast ... --providers cuda --genai_provider cuda`: its reference run and check on
# CUDA, which BF16 needs (ONNX Runtime's CPU has no BF16 MatMul: exit 2 there); config and tokenizer carried, provider
# cuda),
# then llm15.py genai: each model generates 128 tokens greedily after each of data/prompts15.npy's 2x256-token
# prompts, a warm-up round then GENAI_ROUNDS (3): median prefill ms and decode tokens/s, first 20 ids.
#
#   run_15b.sh stage [GGUF]  (development machine, repository root; STAGE=/work/main by default) writes STAGE/.g15
#                            (src/onnxprec, gpu/ = this folder, zoo/_bigllm_venv.py, whl/ = WHL's wheels: gguf,
#                            onnxruntime-genai 0.18 (CPU, the builder), onnx_ir, ModelOpt 0.47 and what the device
#                            lacks for it: lief, polygraphy, onnx_graphsurgeon, onnxslim, onnxconverter_common,
#                            cppimport 26.4.17 (wheel built from PyPI's sdist) + mako 1.4.3 (ModelOpt's export
#                            compiles its round-and-pack extension with them), data/ids15.npy + calib15 +
#                            prompts15.npy (PROMPTS),
#                            MANIFEST, and the first pieces) and STAGE/.g15_p01.. (pieces of <= PART_MIB MiB: the GGUF
#                            first, then onnxruntime-gpu 1.31.1's wheel, found at ORT_WHL or cut from .gpu8b's parts)
#   run_15b.sh refresh       (development machine) refreshes STAGE/.g15's code and whl/ (WHL's wheels added), keeping
#                            the pieces; stage and refresh also write STAGE/.g15_pgenai: onnxruntime-genai-cuda
#                            0.18.0's wheel (GENAI_WHL, 16.7 MB: no room in .g15; ignored as .g15_p*), one more `part`
#                            for STEPS=genai (fits in one call with .g15_p24)
#   run_15b.sh start         environment, wheels, then the pipeline in the background (from a copy of .g15 on the
#                            roomiest disk, recorded in /root/g15_dir: later calls use /root/g15/gpu/run_15b.sh)
#   run_15b.sh part DIR      moves DIR's pieces into the work dir (the pipeline goes on once MANIFEST's are there;
#                            it waits PIECES_WAIT_S s, default 1200, for each file's pieces, then names the missing
#                            ones and stops)
#   run_15b.sh again         the tools again (STEPS, BUDGET_S...) on the FP32 model already rebuilt, in the background
#   run_15b.sh wait SECS     follows the pipeline for at most SECS s; copies the results to $OUT
# The pipeline: GGUF reassembled and its sha256 checked (a mismatch stops it), FP32 rebuilt and model.onnx.data's
# sha256 compared with the development machine's (a mismatch is reported, the run goes on), then STEPS (default
# "int4 ortrtn modelopt"; "kquant" adds ORT's k_quant, numpy on the CPU, slow) in that order within BUDGET_S (default
# 600 s after the rebuild). Without a GPU (the local test) the calibration runs on the CPU and onnxruntime-gpu is
# neither waited for nor installed.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
G=${G:-$PWD/.g15}
STATE=${STATE:-/root/g15_dir}
LINK=${LINK:-/root/g15}
PY=${PY:-python3}
PART_MIB=${PART_MIB:-54}
GGUF_NAME=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
# sha256 of the development machine's files (sha256sum, 2026-11-29)
GGUF_SHA=${GGUF_SHA:-cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046}
DATA_SHA=${DATA_SHA:-380880223315a1aeb75af8b5de58e845385aebb0e2d1f71cd5644c93c347d237}
ORT_WHL_NAME=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
GENAI_WHL=${GENAI_WHL:-$HOME/.cache/onnxprec/gpu/onnxruntime_genai_cuda-0.18.0-cp312-cp312-manylinux_2_28_x86_64.whl}

pick_dir() {  # the non-tmpfs file system with the most free space
    df -B1G --output=fstype,avail,target 2>/dev/null | tail -n +2 | grep -v -E '^(tmpfs|devtmpfs|proc|sysfs)' \
        | sort -k2 -n | tail -1 | awk '{print $3}'
}
has_gpu() { command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; }
stage_genai() {  # STAGE/.g15_pgenai: the genai-cuda wheel; prompts15.npy into .g15/data
    local S=$1; rm -rf "$S/.g15_pgenai" && mkdir -p "$S/.g15_pgenai" && cp "$GENAI_WHL" "$S/.g15_pgenai/"
    cp "${PROMPTS:-/tmp/prompts15.npy}" "$S/.g15/data/prompts15.npy"
}

INT4_PHASES='load+select=^;written text=An LLM without layer options;calibration walk=Quantizing [0-9]+ weights'
INT4_PHASES+=';after the walk=Reference run: [0-9]+ tensors;save=Model weights exceed|Saving weights|Writing weights'
INT4_PHASES+=';check=>Reference run \(segments\)|INT4 result|ONNX Runtime ran the output|Quantized [0-9]+ weights'

case "$1" in
stage)
    gguf=${2:-$HOME/.cache/bigllm/gguf/$GGUF_NAME}; S=${STAGE:-/work/main}; T="$S/.g15"
    rm -rf "$T" "$S"/.g15_p[0-9]* && mkdir -p "$T/src" "$T/gpu" "$T/zoo" "$T/whl" "$T/data" "$T/parts"
    cp -r src/onnxprec "$T/src/" && cp benchmarks/gpu/* "$T/gpu/" && cp zoo/_bigllm_venv.py "$T/zoo/"
    find "$T/src" -name __pycache__ -prune -exec rm -rf {} +
    cp "${WHL:-$HOME/.cache/onnxprec/gpu/g15_whl}"/*.whl "$T/whl/"
    cp "${IDS:-/tmp/llm15/ids15.npy}" "$T/data/ids15.npy" && cp -r "${CALIB:-/tmp/llm15/calib15}" "$T/data/calib15"
    ort=${ORT_WHL:-}
    if [ -z "$ort" ] && [ -z "${NO_ORT:-}" ]; then  # run_8b.sh's parts of the same wheel
        ort=$(mktemp -d)/$ORT_WHL_NAME && cat "$S"/.gpu8b/parts/part* "$S"/.gpu8b_p*/part* > "$ort"
    fi
    $PY "$HERE/cut15.py" "$T" "$S/.g15_p" $((PART_MIB << 20)) "gguf=$gguf" ${ort:+"ortw=$ort"}
    [ -n "${ORT_WHL:-}" ] || [ -n "${NO_ORT:-}" ] || rm -rf "$(dirname "$ort")"
    stage_genai "$S"
    du -sh "$T" "$S"/.g15_p[0-9]* | tr '\n' ' '; echo
    ;;
refresh)  # development machine: STAGE/.g15's code (src/onnxprec, gpu/, zoo/) from the working tree and whl/, pieces kept
    T="${STAGE:-/work/main}/.g15"; rm -rf "$T/src/onnxprec" && cp -r src/onnxprec "$T/src/"
    cp benchmarks/gpu/* "$T/gpu/" && cp zoo/_bigllm_venv.py "$T/zoo/"
    cp "${WHL:-$HOME/.cache/onnxprec/gpu/g15_whl}"/*.whl "$T/whl/"
    find "$T/src" -name __pycache__ -prune -exec rm -rf {} +
    stage_genai "${STAGE:-/work/main}"
    du -sb "$T" "$T"_pgenai  # at most 64 MiB less the repository's tracked files, in the first call
    ;;
start)
    has_gpu && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    df -hT 2>/dev/null | grep -v -E 'proc|sysfs|cgroup'; nproc; free -g
    base=$(pick_dir); W="${WORK:-${base%/}/g15}"; rm -rf "$W"; mkdir -p "$W/parts" "$W/site" "$W/results"
    echo "$W" > "$STATE"; echo "work dir $W"
    rm -rf "$W/g" && cp -r "$G" "$W/g" && mv "$W"/g/parts/* "$W/parts/" 2>/dev/null
    ln -sfn "$W/g" "$LINK"
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$W/site" \
        $(ls "$W"/g/whl/*.whl | grep -v -E "${SKIP_WHL:-^$}")  # SKIP_WHL: the local test's Python 3.11 skips cp312
    export PYTHONPATH="$W/site:$W/g/src${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}"
    $PY -c "import sys, numpy, torch, transformers, onnx, onnx_ir, onnxruntime, gguf, onnxprec; print(sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'onnx', onnx.__version__, 'onnx_ir', onnx_ir.__version__, 'onnxruntime', onnxruntime.__version__, 'gguf', gguf.__version__ if hasattr(gguf, '__version__') else '?', onnxprec.__file__)"
    $PY -c "import cppimport, mako" || echo "== cppimport or mako does not import: ModelOpt's export will fail"
    setsid nohup bash "$W/g/gpu/run_15b.sh" pipeline > "$W/pipeline.log" 2>&1 < /dev/null &
    sleep 3; ls "$W/parts"; tail -3 "$W/pipeline.log"
    ;;
part)
    W=$(cat "$STATE")
    for f in "$2"/*; do cp "$f" "$W/parts/.$(basename "$f").tmp" && mv "$W/parts/.$(basename "$f").tmp" "$W/parts/$(basename "$f")"; done
    ls "$W/parts" | tr '\n' ' '; echo; tail -2 "$W/pipeline.log"
    ;;
again)  # the tools again in the background (after a failure, say), on the rebuilt FP32 model already there
    W=$(cat "$STATE"); rm -f "$W/results/DONE"
    setsid nohup bash "$W/g/gpu/run_15b.sh" tools >> "$W/pipeline.log" 2>&1 < /dev/null &
    sleep 3; tail -3 "$W/pipeline.log"
    ;;
pipeline | tools)
    W=$(cat "$STATE"); cd "$W" || exit 1; G="$W/g"; R="$W/results"; mkdir -p "$W/tmp" "$W/int4" "$W/ortrtn" "$W/mo" "$W/kquant"
    export PYTHONPATH="$W/site:$G/src${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}" PYTHONUNBUFFERED=1 TMPDIR="$W/tmp"
    step() {  # step NAME CAP_S [--phases SPEC] -- COMMAND...: measured, at most CAP_S s and never past the deadline
        local name=$1 cap=$2; shift 2
        local left=$((deadline - SECONDS)); [ "$left" -lt "$cap" ] && cap=$left
        if [ "$cap" -lt 30 ]; then echo "== $name skipped: ${left}s of the budget left"; return 1; fi
        echo "== $name $(date -u +%T) (at most ${cap}s)"
        local phases=(); [ "$1" = --phases ] && phases=(--phases "$2") && shift 2
        shift  # --
        $PY "$G/gpu/measure.py" "$name" "$R" "${phases[@]}" -- timeout "$cap" "$@"
        local rc=$?; [ $rc -ne 0 ] && { echo "== $name FAILED (exit $rc); its last lines:"; tail -25 "$R/$name.log"; }
        return $rc
    }
    ppl() {  # ppl NAME MODEL: the held-out perplexity, appended to ppl.jsonl
        $PY "$G/gpu/llm15.py" ppl "$G/data/ids15.npy" "$2" 2>&1 | tee -a "$R/ppl.log" | grep '^{' \
            | sed "s/^{/{\"name\": \"$1\", /" | tee -a "$R/ppl.jsonl"
    }
    wants() { [[ " ${STEPS:-int4 ortrtn modelopt} " == *" $1 "* ]]; }
    genai_step() {  # onnxruntime-genai-cuda, AutoCast FP16/BF16, then the generation of every model
        local whl end=$((SECONDS + ${GENAI_WAIT:-120})) models=()
        if [ ! -d "$W/gcuda/onnxruntime_genai" ]; then  # the wheel comes with `part .g15_pgenai`
            while [ -z "$(ls "$W"/parts/onnxruntime_genai_cuda-*.whl 2>/dev/null)" ] && [ $SECONDS -lt $end ]; do sleep 2; done
            whl=$(ls "$W"/parts/onnxruntime_genai_cuda-*.whl 2>/dev/null | head -1)
            if [ -z "$whl" ]; then echo "== genai: no onnxruntime_genai_cuda wheel in $W/parts (part .g15_pgenai)"; return 1; fi
            $PY -m pip install -q --no-index --no-deps --no-compile --target "$W/gcuda" "$whl" || return 1
        fi
        echo "== genai $(date -u +%T): $(ls -d "$W"/gcuda/onnxruntime_genai*)"
        for t in ${GENAI_TYPES:-fp16 bf16}; do
            mkdir -p "$W/a_$t"; rm -f "$W/a_$t"/*
            step autocast_$t "${AUTOCAST_CAP:-120}" -- $PY -m onnxprec.cli autocast --onnx_path "$W/fp32/model.onnx" \
                --output_path "$W/a_$t/model.onnx" --low_precision_type $t --providers $eps --genai_provider cuda --log_level INFO \
                --report_json "$R/autocast_${t}_report.json" && du -sb "$W/a_$t" > "$R/autocast_${t}_size.txt"
        done
        for m in b_fp16 b_bf16 a_fp16 a_bf16; do
            [ -e "$W/$m/model.onnx" ] && [ -e "$W/$m/genai_config.json" ] && models+=("$m=$W/$m/model.onnx")
        done
        step genai_cuda "${GENAI_CAP:-180}" -- env PYTHONPATH="$W/gcuda:$PYTHONPATH" $PY "$G/gpu/llm15.py" genai \
            "$R/genai.json" "$G/data/prompts15.npy" "${GENAI_ROUNDS:-3}" "${GENAI_PROVIDER:-cuda}" "${models[@]}"
    }
    missing() {  # missing PREFIX: MANIFEST's pieces of PREFIX not (yet) in the parts folder at their size
        awk -v p="$1." -v d="$W/parts" 'index($1, p) == 1 {cmd = "stat -c %s " d "/" $1 " 2>/dev/null";
             s = ""; cmd | getline s; close(cmd); if (s != $2) print $1}' "$G/MANIFEST" | tr '\n' ' '
    }
    pieces() {  # pieces PREFIX: waits until MANIFEST's pieces of PREFIX are all there, then writes them to stdout;
                # after PIECES_WAIT_S s (default 1200) without them, names the missing ones and returns 1
        local wait_s=${PIECES_WAIT_S:-1200} left; local end=$((SECONDS + wait_s))
        echo "== waiting for the $1 pieces $(date -u +%T) (at most ${wait_s}s)" >&2
        while left=$(missing "$1") && [ -n "$left" ]; do
            if [ $SECONDS -ge $end ]; then
                echo "== the $1 pieces did not all arrive within ${wait_s}s; missing: ${left}(\`run_15b.sh part" \
                     "DIR\` brings them; PIECES_WAIT_S sets the wait)" >&2
                return 1
            fi
            sleep 1
        done
        echo "== $1 pieces complete $(date -u +%T)" >&2
        for f in $(awk -v p="$1." 'index($1, p) == 1 {print $1}' "$G/MANIFEST"); do cat "$W/parts/$f"; rm "$W/parts/$f"; done
    }
    T0=$SECONDS
    if [ "$1" = pipeline ]; then
    pieces gguf > "$W/$GGUF_NAME" || { echo "== no GGUF: stopped"; rm -f "$W/$GGUF_NAME"; touch "$R/DONE"; exit 1; }
    echo "$GGUF_SHA  $W/$GGUF_NAME" | sha256sum -c - || { echo "== GGUF sha256 differs: stopped"; touch "$R/DONE"; exit 1; }
    echo "== gguf reassembled in $((SECONDS - T0)) s since the start"
    deadline=$((SECONDS + ${BUILD_S:-900}))
    step gguf2hf 600 -- $PY "$G/zoo/_bigllm_venv.py" gguf2hf "$W/$GGUF_NAME" "$W/hf" || { touch "$R/DONE"; exit 1; }
    rm -f "$W/$GGUF_NAME"
    fi
    # onnxruntime-gpu 1.31.1 before the builder too: onnxruntime-genai 0.18 asks for onnxruntime >= 1.31 (the device
    # has 1.30); its pieces travel after the GGUF's, while gguf2hf runs
    eps=cpu; meps=cpu
    if has_gpu && [ -z "${NO_ORT:-}" ]; then
        if [ ! -e "$W/ort/sitecustomize.py" ]; then
            pieces ortw > "$W/$ORT_WHL_NAME" || { echo "== no onnxruntime-gpu wheel (the builder needs onnxruntime" \
                ">= 1.31): stopped"; rm -f "$W/$ORT_WHL_NAME"; touch "$R/DONE"; exit 1; }
            $PY -m pip install -q --no-index --no-deps --no-compile --target "$W/ort" "$W/$ORT_WHL_NAME" && rm "$W/$ORT_WHL_NAME"
            cp "$G/gpu/sitecustomize.py" "$W/ort/"
        fi
        export PYTHONPATH="$W/ort:$PYTHONPATH" G8B_PRELOAD=1
        nv=$($PY -c "import glob, site; print(':'.join(glob.glob(site.getsitepackages()[0] + '/nvidia/*/lib') + glob.glob(site.getsitepackages()[0] + '/nvidia/*/*/lib')))")
        export LD_LIBRARY_PATH="$nv:${LD_LIBRARY_PATH:-}"
        $PY "$G/gpu/check_ort_cuda.py" && eps=cuda && meps=cuda:0,cpu || echo "== onnxruntime CUDA check failed: CPU calibration"
    fi
    if [ "$1" = pipeline ]; then
    step builder 600 -- $PY -m onnxruntime_genai.models.builder -i "$W/hf" -o "$W/fp32" -p fp32 -e cpu -c "$W/cache" \
        || { touch "$R/DONE"; exit 1; }
    if wants genai; then  # the builder's own CUDA FP16 and BF16, from the same Hugging Face folder
        for p in ${GENAI_TYPES:-fp16 bf16}; do
            step builder_${p}_cuda 180 -- $PY -m onnxruntime_genai.models.builder -i "$W/hf" -o "$W/b_$p" -p $p \
                -e cuda -c "$W/cache" && du -sb "$W/b_$p" > "$R/builder_${p}_size.txt"
        done
    fi
    rm -rf "$W/hf" "$W/cache"
    sha=$(sha256sum "$W/fp32/model.onnx.data" | cut -d' ' -f1); echo "$sha" > "$R/fp32_data_sha256.txt"
    if [ "$sha" = "$DATA_SHA" ]; then echo "== model.onnx.data identical to the development machine's ($sha)"
    else echo "== model.onnx.data DIFFERS: $sha here, $DATA_SHA there (going on)"; fi
    fi
    deadline=$((SECONDS + ${BUDGET_S:-600}))
    echo "== tools from $(date -u +%T), ${BUDGET_S:-600} s budget"
    [ -n "${NO_FP32_PPL:-}" ] || ppl fp32 "$W/fp32/model.onnx"
    if wants int4; then
        step int4_default_$eps "${INT4_CAP:-300}" --phases "$INT4_PHASES" -- $PY -m onnxprec.quantization.int4 \
            --onnx_path "$W/fp32/model.onnx" --output_path "$W/int4/model.onnx" --calibration_data "$G/data/calib15" \
            --calibration_eps $eps --log_level INFO --report_json "$R/int4_report.json" \
            && du -sb "$W/int4" > "$R/int4_size.txt" && ppl int4_default "$W/int4/model.onnx"
        rm -rf "$W/int4"/*
    fi
    ort_int4() {  # ort_int4 NAME CAP DIR METHOD: ONNX Runtime's MatMulNBitsQuantizer, its size and perplexity
        step "$1" "$2" -- $PY "$G/zoo/_bigllm_venv.py" ort_int4 "$W/fp32/model.onnx" "$W/$3/model.onnx" "$4" \
            && du -sb "$W/$3" > "$R/$3_size.txt" && ppl "$1" "$W/$3/model.onnx"
        rm -rf "$W/$3"/*
    }
    if wants ortrtn; then
        ort_int4 ort_rtn_b32 240 ortrtn rtn
    fi
    if wants modelopt; then
        step modelopt_awq_lite 360 -- $PY "$G/gpu/llm15.py" modelopt "$W/fp32/model.onnx" "$W/mo/model.onnx" \
            "$G/data/ids15.npy" "$meps" && du -sb "$W/mo" > "$R/modelopt_size.txt" && ppl modelopt_awq_lite "$W/mo/model.onnx"
        rm -rf "$W/mo"/*
    fi
    if wants kquant; then
        ort_int4 ort_k_quant_b32 600 kquant k_quant
    fi
    if wants genai; then
        genai_step
    fi
    echo "== done $(date -u +%T)"
    touch "$R/DONE"
    ;;
wait)
    W=$(cat "$STATE"); G="$W/g"; end=$((SECONDS + $2))
    while [ $SECONDS -lt $end ] && [ ! -e "$W/results/DONE" ]; do sleep 5; done
    cat "$W/pipeline.log"; ls -la "$W/results"; df -h "$W" | tail -1
    OUT=${OUT:-$W/out}; mkdir -p "$OUT/r"
    cp "$W/pipeline.log" "$OUT/"
    $PY "$G/gpu/collect.py" "$W/results" "$OUT/r/results.json" > /dev/null
    cat "$W"/results/*.log > "$OUT/r/steps.log" 2>/dev/null
    tail -c 15000000 "$OUT/r/steps.log" > "$OUT/r/steps_tail.log"; rm "$OUT/r/steps.log"
    cp "$W/results/ppl.jsonl" "$OUT/r/" 2>/dev/null
    grep -h -A8 '^{"name"' "$W/pipeline.log"; cat "$W/results/ppl.jsonl" 2>/dev/null
    [ -e "$W/results/genai.json" ] && $PY -c 'import json, sys
for k, v in json.load(open(sys.argv[1]))["models"].items():
    print(k, {x: v.get(x) for x in ("prefill_ms_median", "decode_tokens_per_s_median", "prefill_ms",
          "decode_tokens_per_s", "agreement_with_first", "first_divergence", "first_ids", "error") if x in v})' \
        "$W/results/genai.json"
    ;;
esac
