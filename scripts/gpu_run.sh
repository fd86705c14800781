#!/usr/bin/env bash
# Runs on the lent GPU machine (no network, no Go): assembles the mlx-cuda-13 runtime that
# was carried in parts (.gpu/p1, .gpu/p1b, …, .gpu/p2, see docs/gpu.md), points it at the NVIDIA
# libraries of the machine's Python, and runs the prebuilt test binaries and benchmarks.
# Results go to $OUT. Usage: bash scripts/gpu_run.sh STAGE
# (STAGE: one of $STAGES below; docs/gpu.md)
# GPU_RUN_DRY=1 (scripts/gpurun_test.go): a dry run on any machine. The binaries already sit
# in $GPU_RUN_ROOT/bin (stubs), no runtime is assembled and no NVIDIA library is looked
# for; GPU_STAGE_DIR, GPU_WORK and GPU_PYLIB move the staged parts, the stages' work
# folders and mlx-lm's install away from /tmp.
set -uo pipefail
STAGE="${1:-all}"
STAGES="setup all tests cmd mlxcbench engine bench graphs ab abbin diag inmodel tune prof sweep mlxlm"
case " $STAGES " in
  *" $STAGE "*) ;;
  *) echo "unknown stage '$STAGE' (one of: $STAGES)" >&2; exit 2 ;;
esac
X="${GPU_RUN_ROOT:-/tmp/mlxcuda}"
STG="${GPU_STAGE_DIR:-/tmp/stage}"
W="${GPU_WORK:-/tmp}"
OUT="${OUT:-/tmp/out}"
DRY="${GPU_RUN_DRY:-}"
mkdir -p "$X/mlx/lib" "$OUT" "$STG"
log() { echo "== $*"; }
# The runtime's parts overwrite staged ones of the same name (another bundle may split
# the library at other sizes).
for d in .gpu/p1 .gpu/p1?; do
  if [ -d "$d" ]; then cp -f "$d"/* $STG/ 2>/dev/null || true; fi
done
if [ -d .gpu/p2 ]; then
  # A new build's binaries replace the staged ones (a warm machine keeps $STG).
  if [ -f .gpu/p2/bin.tar.xz ] && ! cmp -s .gpu/p2/bin.tar.xz $STG/bin.tar.xz; then
    cp .gpu/p2/bin.tar.xz $STG/bin.tar.xz && rm -rf "$X/bin" "$X/base"
  fi
  if [ -f .gpu/p2/base.tar.xz ] && ! cmp -s .gpu/p2/base.tar.xz $STG/base.tar.xz; then
    cp .gpu/p2/base.tar.xz $STG/base.tar.xz && rm -rf "$X/base"
  fi
  cp -n .gpu/p2/* $STG/ 2>/dev/null || true
fi
if [ -d .gpu/p3 ]; then cp -n .gpu/p3/* $STG/ 2>/dev/null || true; fi
if [ "$STAGE" = setup ] && [ -n "$DRY" ]; then ls -la "$STG"; exit 0; fi
if [ "$STAGE" = setup ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import nvidia,os;p=list(nvidia.__path__)[0];print(p);print(sorted(os.listdir(p)))"
  ls -la $STG; df -h /tmp | tail -1
  exit 0
fi
if [ -z "$DRY" ]; then
  if [ ! -f "$X/mlx/lib/libmlx.so" ]; then
    # Every part must be here (a machine given back in between loses the staged ones: run
    # setup with each .gpu/p1* again); the library goes into place only whole, so a failed
    # call leaves nothing half made. .gpu/p2's libmlx.parts lists them (older bundles: aa, ab).
    parts="libmlx.so.xz.part-aa libmlx.so.xz.part-ab"
    [ -f $STG/libmlx.parts ] && parts="$(cat $STG/libmlx.parts)"
    for part in $parts; do
      [ -f "$STG/$part" ] || { echo "libmlx part $part missing (run setup with each .gpu/p1* first): $(ls $STG)"; exit 3; }
    done
    log "assembling libmlx.so"
    (cd $STG && cat $parts) | xz -d > "$X/mlx/lib/libmlx.so.tmp" || { echo "libmlx parts corrupt: $(ls $STG)"; exit 3; }
    mv "$X/mlx/lib/libmlx.so.tmp" "$X/mlx/lib/libmlx.so"
    tar -xJf $STG/include.tar.xz -C "$X/mlx"
    tar -xJf $STG/libs.tar.xz -C "$X"
  fi
  [ -x "$X/bin/dflash-mlx" ] || tar -xJf $STG/bin.tar.xz -C "$X"
  if [ -f $STG/testdata.tar.xz ] && [ ! -d "$X/third_party/testdata" ]; then
    mkdir -p "$X/third_party" && tar -xJf $STG/testdata.tar.xz -C "$X/third_party"
  fi
  NV="$(python3 -c 'import nvidia;print(list(nvidia.__path__)[0])')"
  if [ -f $STG/crt.tar.xz ] && [ ! -d "$NV/cu13/include/crt" ] && [ ! -d /tmp/nv/cu13 ]; then
    # The machine's CUDA headers lack crt/ (MLX's quantized kernels include <mma.h>): a copy
    # of its nvidia/ tree made of links, with crt/ from nvidia-cuda-crt added.
    mkdir -p /tmp/nv && for d in "$NV"/*; do ln -sfn "$d" "/tmp/nv/$(basename "$d")"; done
    rm /tmp/nv/cu13 && mkdir -p /tmp/nv/cu13/include && for d in "$NV"/cu13/*; do [ "$(basename "$d")" = include ] || ln -sfn "$d" "/tmp/nv/cu13/$(basename "$d")"; done
    for f in "$NV"/cu13/include/*; do ln -sfn "$f" "/tmp/nv/cu13/include/$(basename "$f")"; done
    tar -xJf $STG/crt.tar.xz -C /tmp/nv/cu13/include
  fi
  [ -d /tmp/nv/cu13 ] && NV=/tmp/nv
  ln -sfn "$NV" "$X/nvidia"   # recreate the pip layout libmlx's RPATH and NVRTC expect
  LIBS="$(ls -d "$NV"/*/lib 2>/dev/null | tr '\n' ':')"
  export LD_LIBRARY_PATH="$X/mlx/lib:$LIBS${LD_LIBRARY_PATH:-}"
  [ -d "$NV/cu13/include" ] && export CUDA_HOME="$NV/cu13"
  [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda/include ] && export CUDA_HOME=/usr/local/cuda
  export MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
else
  NV="$X/nvidia"
fi
B="$X/bin"
# mlx-lm from the carried wheels (.gpu/p3, gpu_bundle.sh --mlx-lm) into $P, run on our CUDA
# libmlx: the mlxlm stage and any cmd that compares with mlx-lm call it.
P="${GPU_PYLIB:-/tmp/pylib}"
install_mlxlm() {
  [ -f $STG/pywheels.tar ] || { echo "pywheels.tar missing: carry .gpu/p3"; return 3; }
  [ -d "$P/mlx_lm" ] && return 0
  log "installing mlx-lm from wheels"
  tar -xf $STG/pywheels.tar -C /tmp
  if ! python3 -m pip install --quiet --no-index --no-deps --target "$P" /tmp/pywheels/*.whl; then
    # No pip in this Python: wheels are zip files, unpacking them is an install for our use.
    mkdir -p "$P" && for w in /tmp/pywheels/*.whl; do python3 -m zipfile -e "$w" "$P" || return 4; done
  fi
  rm -rf "$P/mlx/lib"
  ln -sfn "$X/mlx/lib" "$P/mlx/lib"          # the CUDA libmlx.so next to mlx's core module
  ln -sfn "$NV" "$P/nvidia"                   # its RPATH: ../../nvidia/...
  ln -sfn "$X/mlx_cuda_13.libs" "$P/mlx_cuda_13.libs"
}
log "version"; "$B/dflash-mlx" version 2>&1 | tee "$OUT/version.txt"
if [ "$STAGE" = all ] || [ "$STAGE" = tests ]; then
  log "mlxc tests on CUDA"
  ( cd mlxc && timeout 300 "$B/mlxc.test" -test.v -test.count=1 2>&1 ) > "$OUT/mlxc_cuda_tests.txt"; echo "exit $?" >> "$OUT/mlxc_cuda_tests.txt"
  grep -E "^(--- FAIL|--- PASS: TestCUDAKernel|ok|FAIL|PASS|exit)" "$OUT/mlxc_cuda_tests.txt" | head -20
  log "mlxc overhead benchmark on CUDA"
  ( cd mlxc && timeout 120 "$B/mlxc.test" -test.run XXX -test.bench . -test.benchtime 2000x 2>&1 ) > "$OUT/mlxc_cuda_bench.txt"; grep ns/op "$OUT/mlxc_cuda_bench.txt"
fi
if [ "$STAGE" = cmd ]; then
  # Any command ($CMD) in this script's environment ($B: the binaries, $OUT: results).
  eval "${CMD:?CMD is empty}"
fi
if [ "$STAGE" = mlxcbench ]; then
  # Host cost per graph node: MLX Adds against custom CUDA kernels (MLXC_BENCH pattern).
  ( cd mlxc && timeout 200 "$B/mlxc.test" -test.run XXX -test.bench "${MLXC_BENCH:-Overhead}" -test.benchtime "${MLXC_BENCHTIME:-5000x}" 2>&1 ) | tee "$OUT/mlxc_bench.txt" | grep -E "ns/op|FAIL|panic"
fi
if [ "$STAGE" = engine ]; then
  log "engine exactness tests on CUDA"
  # GPU-exact mode: a verify row rounds like the decode step (default mode may flip near-ties).
  ( cd engine && env ${TESTS_ENV:-DFLASH_GPU_EXACT=1} timeout 400 "$B/engine.test" -test.count=1 -test.run 'TestDFlashGreedyEqualsPlain|TestRunAhead|TestDFlashScripted|TestDFlashCaches|TestStopRules|TestVerifyDecodeFlips' 2>&1 ) > "$OUT/engine_cuda_tests.txt"; echo "exit $?" >> "$OUT/engine_cuda_tests.txt"
  grep -E "^(--- FAIL|ok|FAIL|PASS)|flips" "$OUT/engine_cuda_tests.txt" | head -30
fi
if [ "$STAGE" = all ] || [ "$STAGE" = bench ]; then
  N="${BENCH_TOKENS:-256}"
  for err in 0.14 0; do
    log "bench qwen3-4b shape, replayed acceptance err $err"
    timeout 240 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n "$N" --num-prompts 2 --repeats 2 --replay-drafts "$err" --bandwidth --json > "$OUT/bench_4b_err$err.json" 2> "$OUT/bench_4b_err$err.err"
    tail -2 "$OUT/bench_4b_err$err.err"; python3 -c "import json,sys;r=json.load(open(sys.argv[1]));print({k:r[k] for k in ['median_plain_tok_s','median_dflash_tok_s','median_speedup','median_tau','copy_bandwidth_gb_s','roofline_plain_tok_s']});[print(x) for x in r['rows']]" "$OUT/bench_4b_err$err.json"
  done
  log "bench qwen3-4b shape, real random drafter (no replay)"
  timeout 120 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n 128 --num-prompts 1 --repeats 1 --json > "$OUT/bench_4b_random_drafter.json" 2>&1; python3 -c "import json,sys;r=json.load(open(sys.argv[1]));[print(x) for x in r['rows']]" "$OUT/bench_4b_random_drafter.json"
  log "verify vs decode flips on the 4B shape"
  timeout 200 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n 128 --num-prompts 2 --flips --json > "$OUT/flips_4b.json" 2>&1
  python3 -c "import json,sys;r=json.load(open(sys.argv[1]));[print(x['positions'],len(x['flips'] or []),x['max_abs_logprob_diff'],x['median_decode_gap'],(x['flips'] or [])[:8]) for x in r['reports']]" "$OUT/flips_4b.json"
fi
if [ "$STAGE" = graphs ]; then
  # Host-side cost per kernel: plain decoding with MLX's CUDA graphs on and off.
  "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n 8 --num-prompts 1 --repeats 1 --warmup 0 --json > /dev/null 2>&1
  for g in 1 0; do
    log "MLX_USE_CUDA_GRAPHS=$g"
    MLX_USE_CUDA_GRAPHS=$g timeout 100 "$B/dflash-mlx" run --target-model /tmp/r4b/target --no-draft --no-chat-template --ignore-eos --prompt "hello world" -n 128 --stats -q 2>&1 >/dev/null | tee "$OUT/plain_graphs$g.txt" | grep -E "generation|time split"
    MLX_USE_CUDA_GRAPHS=$g timeout 150 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n 256 --num-prompts 1 --repeats 2 --replay-drafts 0.14 --json > "$OUT/bench_graphs$g.json" 2>/dev/null
    python3 -c "import json,sys;r=json.load(open(sys.argv[1]));print({k:round(r[k],2) for k in ['median_plain_tok_s','median_dflash_tok_s','median_speedup','median_tau']});print({k:round(v,2) for k,v in r['rows'][0].items() if k.endswith('ms') or k.endswith('cycle')})" "$OUT/bench_graphs$g.json"
  done
fi
if [ "$STAGE" = ab ]; then
  # Side-by-side variants of the τ≈6.5 benchmark (AB_VARIANTS: ';'-separated env settings,
  # "-" for none), then τ=16 (TAU16_ENV), flips (FLIPS_ENV) and the exactness tests
  # (BENCH_ARGS: extra bench flags, e.g. --compare-run-ahead; TESTS_ENV: settings for the
  # engine tests, default DFLASH_GPU_EXACT=1; TESTS_RUN their -test.run pattern,
  # TESTS_TIMEOUT seconds). Results: $OUT/<RES folder>.tgz.
  R="${RES:-$W/res}"; mkdir -p "$R"
  summary() { python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); x=r['rows'][0]
print({k:round(r[k],2) for k in ['median_plain_tok_s','median_dflash_tok_s','median_speedup','median_tau']})
print('runs plain', [round(v) for v in x['plain_runs_tok_s']], 'dflash', [round(v) for v in x['dflash_runs_tok_s']], 'tau', [round(v, 2) for v in x.get('dflash_runs_tau') or []])
print({k:round(v,2) for k,v in x.items() if isinstance(v,float) and (k.endswith('ms') or 'nodes' in k or k.endswith('cycle'))})
print('pipelined', x.get('pipelined'))
if x.get('other_loop'): print('other loop', x['other_loop'], round(x['other_loop_tok_s']), [round(v) for v in x['other_loop_runs_tok_s']])
for part in ['plain_step_ops','draft_ops_per_cycle','verify_ops_per_cycle']:
  ops=x.get(part) or {}
  print(part, sorted(((round(v,1),k) for k,v in ops.items()), reverse=True)[:12])
" "$1"; }
  log "mlxc quantized-product tests on CUDA (MLX's JIT-compiled qmv/qmm)"
  ( cd mlxc && timeout "${MLXC_TIMEOUT:-200}" "$B/mlxc.test" -test.count=1 -test.v -test.run "${MLXC_RUN:-TestQuantized|TestCUDAKernel}" 2>&1 ) > "$R/mlxc_cuda_tests.txt"; echo "exit $?" >> "$R/mlxc_cuda_tests.txt"
  grep -E "^(--- |ok|FAIL|PASS|exit)|quant_test" "$R/mlxc_cuda_tests.txt" | head -20
  if [ -x "$B/model.test" ] && [ -z "${SKIP_MODEL_TESTS:-}" ]; then
    log "model kernel tests on CUDA"
    ( cd model && timeout 120 "$B/model.test" -test.count=1 -test.v -test.run "Skinny|Merged|FewQuery|Fused|Absent" 2>&1 ) > "$R/model_cuda_tests.txt"; echo "exit $?" >> "$R/model_cuda_tests.txt"
    grep -E "^(--- |ok|FAIL|PASS|exit)|skinny_test|error" "$R/model_cuda_tests.txt" | head -20
  fi
  # AB_SHAPE: the random shape of the variants (qwen3-4b; qwen3-4b-thin measures the host).
  SHAPE="${AB_SHAPE:-qwen3-4b}"; SD=/tmp/r4b; [ "$SHAPE" = qwen3-4b ] || SD="/tmp/r-$SHAPE"
  "$B/dflash-mlx" bench --random "$SHAPE" --dir "$SD" -n 8 --num-prompts 1 --repeats 1 --warmup 0 --json > /dev/null 2>&1
  IFS=';' read -ra VS <<< "${AB_VARIANTS:--}"
  i=0
  for v in "${VS[@]}"; do
    i=$((i+1)); [ "$v" = "-" ] && v=""
    log "variant $i: ${v:-defaults}: replayed error rate ${AB_ERR:-0.14}"
    env $v timeout 200 "$B/dflash-mlx" bench --random "$SHAPE" --dir "$SD" -n 256 --num-prompts "${AB_PROMPTS:-1}" --repeats 3 --replay-drafts "${AB_ERR:-0.14}" ${BENCH_ARGS:-} --json > "$R/ab_$i.json" 2> "$R/ab_$i.err"
    echo "$v" > "$R/ab_$i.env"
    summary "$R/ab_$i.json" || tail -3 "$R/ab_$i.err"
  done
  if [ -z "${SKIP_EXTRA:-}" ]; then
  log "${TAU16_ENV:-defaults}: replayed τ=16"
  env ${TAU16_ENV:-} timeout 120 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n 256 --num-prompts 1 --repeats 3 --replay-drafts 0 --bandwidth --json > "$R/tau16.json" 2> "$R/tau16.err"
  summary "$R/tau16.json" || tail -3 "$R/tau16.err"
  python3 -c "import json,sys;r=json.load(open(sys.argv[1]));print({k:r.get(k) for k in ['copy_bandwidth_gb_s','roofline_plain_tok_s','plain_of_roofline']})" "$R/tau16.json"
  log "flips with the default (padded) verify"
  env ${FLIPS_ENV:-} timeout 120 "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n 128 --num-prompts 2 --flips --json > "$R/flips.json" 2> "$R/flips.err"
  python3 -c "import json,sys;r=json.load(open(sys.argv[1]));[print(x['positions'],len(x['flips'] or []),x['max_abs_logprob_diff'],x['median_decode_gap'],(x['flips'] or [])[:6]) for x in r['reports']]" "$R/flips.json"
  fi
  if [ -z "${SKIP_TESTS:-}" ]; then
    log "engine and draft tests on CUDA"
    ( cd engine && env ${TESTS_ENV:-DFLASH_GPU_EXACT=1} timeout "${TESTS_TIMEOUT:-400}" "$B/engine.test" -test.count=1 -test.run "${TESTS_RUN:-TestDFlashGreedyEqualsPlain|TestDFlashCaches|TestVerifyDecodeFlips|TestDFlashScripted}" 2>&1 ) > "$R/engine_cuda_tests.txt"; echo "exit $?" >> "$R/engine_cuda_tests.txt"
    grep -E "^(--- FAIL|ok|FAIL|PASS|exit)" "$R/engine_cuda_tests.txt" | head -20
    ( cd draft && timeout 60 "$B/draft.test" -test.count=1 -test.v -test.run 'Padded|Fused' 2>&1 ) > "$R/draft_cuda_tests.txt"; tail -2 "$R/draft_cuda_tests.txt"
  fi
  tar -czf "$OUT/$(basename "$R").tgz" -C "$R" .
fi
if [ "$STAGE" = abbin ]; then
  # The τ≈6.5 benchmark with two builds side by side on one machine: the carried base.tar.xz
  # (bin/dflash-base, made by gpu_bundle.sh --base REV) and this build, alternating
  # ABBIN_ROUNDS times (default 2), on the random shape ABBIN_SHAPE (qwen3-4b) at the
  # replayed error rate ABBIN_ERR (0.14: τ ≈ 6.5) with ABBIN_TOKENS (256) a run. Results:
  # $OUT/abbin-SHAPE.tgz and a summary line per run.
  [ -f $STG/base.tar.xz ] || { echo "no base.tar.xz carried"; exit 3; }
  mkdir -p "$X/base" && tar -xJf $STG/base.tar.xz -C "$X/base"
  SHAPE="${ABBIN_SHAPE:-qwen3-4b}"; SD=/tmp/r4b; [ "$SHAPE" = qwen3-4b ] || SD="/tmp/r-$SHAPE"
  R="$W/abbin-$SHAPE"; rm -rf "$R"; mkdir -p "$R"
  "$B/dflash-mlx" bench --random "$SHAPE" --dir "$SD" -n 8 --num-prompts 1 --repeats 1 --warmup 0 --json > /dev/null 2>&1
  for i in $(seq "${ABBIN_ROUNDS:-2}"); do
    for which in base new; do
      bin="$B/dflash-mlx"; [ "$which" = base ] && bin="$X/base/bin/dflash-base"
      timeout 200 "$bin" bench --random "$SHAPE" --dir "$SD" -n "${ABBIN_TOKENS:-256}" --num-prompts 1 --repeats 3 --replay-drafts "${ABBIN_ERR:-0.14}" --json > "$R/${which}_$i.json" 2> "$R/${which}_$i.err"
      python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); x=r['rows'][0]; p=x.get('pipelined') or {}
print(sys.argv[2], 'plain', round(r['median_plain_tok_s']), 'dflash', round(r['median_dflash_tok_s']), 'x%.2f' % r['median_speedup'], 'tau', round(r['median_tau'],2),
  'runs', [round(v) for v in x['dflash_runs_tok_s']], 'nodes', round(x['draft_nodes_per_cycle']+x['verify_nodes_per_cycle']),
  'build+enc %.2f+%.2f' % (x['cycle_construct_ms'], x['cycle_encode_ms']), 'pipe %.2f (host %.2f)' % (p.get('cycle_ms',0), p.get('host_ms',0)))
" "$R/${which}_$i.json" "$which $i" || tail -3 "$R/${which}_$i.err"
    done
  done
  tar -czf "$OUT/abbin-$SHAPE.tgz" -C "$R" .
fi
if [ "$STAGE" = diag ]; then
  # Chosen test binaries with chosen settings, one after another (DIAG: ';'-separated
  # "package|-test.run pattern|env settings" entries, a "," in a pattern standing for the
  # regular expression's "|"; DIAG_TIMEOUT seconds each).
  IFS=';' read -ra DS <<< "${DIAG:?DIAG is empty}"
  R=$W/diag; rm -rf "$R"; mkdir -p "$R"
  i=0
  for d in "${DS[@]}"; do
    i=$((i+1)); IFS='|' read -r pkg pat envs <<< "$d"; pat="${pat//,/|}"
    log "diag $i: $pkg -run '$pat' ${envs:-}"
    ( cd "$pkg" && env ${envs:-} timeout "${DIAG_TIMEOUT:-150}" "$B/$pkg.test" -test.count=1 -test.v -test.run "$pat" 2>&1 ) > "$R/diag_$i.txt"; echo "exit $?" >> "$R/diag_$i.txt"
    grep -E "^(--- FAIL|--- PASS|ok|FAIL|PASS|exit)|_test.go" "$R/diag_$i.txt" | head -"${DIAG_LINES:-12}"
  done
  tar -czf "$OUT/diag.tgz" -C "$R" .
fi
if [ "$STAGE" = inmodel ]; then
  # Launch rules of the tensor-core kernel timed inside the random 4B-shape model (verify
  # blocks back to back, rules alternating); DFLASH_TC_INMODEL_RULES overrides the list.
  [ -d /tmp/r4b/target ] || "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n 8 --num-prompts 1 --repeats 1 --warmup 0 --json > /dev/null 2>&1
  ( cd model && DFLASH_TC_INMODEL=/tmp/r4b/target timeout 400 "$B/model.test" -test.run TCInModelSweep -test.v -test.count=1 2>&1 ) > "$OUT/tc_inmodel.txt"
  grep -E "ms per verify|FAIL|ok|error" "$OUT/tc_inmodel.txt"
fi
if [ "$STAGE" = tune ]; then
  # One call: the tensor-core kernel's tests, its launch rules timed in the model
  # (TUNE_RULES: ';'-separated DFLASH_TC_RULE values), then the τ≈6.5 benchmark with the
  # defaults against the fastest rule (and TUNE_EXTRA, more ';'-separated env settings).
  R=$W/tune; rm -rf "$R"; mkdir -p "$R"
  log "model kernel tests on CUDA"
  ( cd model && timeout "${TUNE_TEST_TIMEOUT:-150}" "$B/model.test" -test.count=1 -test.v -test.run "${TUNE_TESTS:-TestSkinnySplitMatchesMatmul|TestSkinnyGEMMMatchesMatmul}" 2>&1 ) > "$R/model_cuda_tests.txt"; echo "exit $?" >> "$R/model_cuda_tests.txt"
  grep -E "^(--- |ok|FAIL|PASS|exit)|skinny_test" "$R/model_cuda_tests.txt" | head -20
  [ -d /tmp/r4b/target ] || "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n 8 --num-prompts 1 --repeats 1 --warmup 0 --json > /dev/null 2>&1
  log "launch rules in the model"
  ( cd model && DFLASH_TC_INMODEL=/tmp/r4b/target DFLASH_TC_INMODEL_RULES="${TUNE_RULES:?}" timeout "${TUNE_SWEEP_TIMEOUT:-240}" "$B/model.test" -test.run TCInModelSweep -test.v -test.count=1 2>&1 ) > "$R/tc_inmodel.txt"
  grep -E "ms per verify|FAIL|ok|error" "$R/tc_inmodel.txt"
  BEST="$(grep -E 'ms per verify' "$R/tc_inmodel.txt" | sed -E 's/^.*_test\.go:[0-9]+: *//' | grep -v -E '^(default|sweep)' | head -1 | awk '{print $1}')"
  echo "fastest rule: ${BEST:-none}"
  VARS="-"
  [ -n "$BEST" ] && VARS="-;DFLASH_TC_RULE=$BEST"
  [ -n "${TUNE_EXTRA:-}" ] && VARS="$VARS;$TUNE_EXTRA"
  cp "$R"/*.txt "$OUT/" 2>/dev/null
  RES=$W/tuneab AB_VARIANTS="$VARS" SKIP_EXTRA=1 SKIP_TESTS=1 SKIP_MODEL_TESTS=1 MLXC_RUN=XXX bash "$0" ab
fi
if [ "$STAGE" = prof ]; then
  # Device time per kernel launch, read by Nsight Compute (ncu: one metric, clocks and
  # caches left alone) in a DFlash run on the random 4B shape, per PROF_VARIANTS entry
  # (';'-separated env settings, "-" for none; "nodraft" in an entry runs plain decoding).
  # Launches PROF_SKIP.. PROF_SKIP+PROF_COUNT (steady state). Results: $OUT/prof.tgz (CSV).
  NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
  [ -n "$NCU" ] || { echo "no ncu"; exit 3; }
  "$NCU" --version | tail -1
  R=$W/prof; rm -rf "$R"; mkdir -p "$R"
  # "base" in an entry runs the carried base build (base.tar.xz, as abbin) instead.
  if [ -f $STG/base.tar.xz ] && [ ! -x "$X/base/bin/dflash-base" ]; then mkdir -p "$X/base" && tar -xJf $STG/base.tar.xz -C "$X/base"; fi
  [ -d /tmp/r4b/target ] || "$B/dflash-mlx" bench --random qwen3-4b --dir /tmp/r4b -n 8 --num-prompts 1 --repeats 1 --warmup 0 --json > /dev/null 2>&1
  IFS=';' read -ra PV <<< "${PROF_VARIANTS:--}"
  i=0
  for v in "${PV[@]}"; do
    i=$((i+1)); [ "$v" = "-" ] && v=""
    draft="--draft-model /tmp/r4b/draft"
    case "$v" in *nodraft*) draft="--no-draft"; v="${v//nodraft/}";; esac
    bin="$B/dflash-mlx"
    case "$v" in *base*) bin="$X/base/bin/dflash-base"; v="${v//base/}";; esac
    log "prof $i: ${v:-defaults} $draft"
    echo "$v $draft" > "$R/prof_$i.env"
    env $v timeout "${PROF_TIMEOUT:-150}" "$NCU" --clock-control none --cache-control none -f -o "$R/prof_$i" \
      --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
      --launch-skip "${PROF_SKIP:-6000}" --launch-count "${PROF_COUNT:-1900}" \
      "$bin" run --target-model /tmp/r4b/target $draft --prompt "hello world" -n "${PROF_TOKENS:-64}" --ignore-eos --no-chat-template -q > "$R/prof_$i.log" 2>&1
    echo "exit $?" >> "$R/prof_$i.log"; tail -2 "$R/prof_$i.log"
    "$NCU" -i "$R/prof_$i.ncu-rep" --csv --page raw > "$R/prof_$i.csv" 2>&1
    rm -f "$R/prof_$i.ncu-rep"
    python3 - "$R/prof_$i.csv" <<'PYEOF'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[0]
ix = {k: hdr.index(k) for k in hdr}
name = ix.get("Kernel Name"); dur = ix.get("gpu__time_duration.sum"); grid = ix.get("launch__grid_size")
unit = rows[1][dur] if len(rows) > 1 else "nsecond"
us = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
agg = collections.defaultdict(lambda: [0, 0.0])
total = 0.0
for r in rows[2:]:
    try:
        d = float(r[dur].replace(",", "")) * us * 1000
    except (ValueError, IndexError):
        continue
    k = (r[name][:60], r[grid])
    agg[k][0] += 1; agg[k][1] += d; total += d
print("launches", sum(a[0] for a in agg.values()), "total us", round(total / 1000, 1))
for k, (n, d) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{d/1000:10.1f} us {n:5d}x {d/n/1000:8.2f} us  grid {k[1]:>7}  {k[0]}")
PYEOF
  done
  tar -czf "$OUT/prof.tgz" -C "$R" .
fi
if [ "$STAGE" = sweep ]; then
  # Launch shapes of the tensor-core few-row kernel: GB/s per shape, values checked first.
  ( cd model && DFLASH_TC_SWEEP=1 timeout 300 "$B/model.test" -test.run TCSweep -test.v -test.count=1 2>&1 ) > "$OUT/tc_sweep.txt"
  grep -E "best|FAIL|ok" "$OUT/tc_sweep.txt"
fi
if [ "$STAGE" = mlxlm ]; then
  # Plain greedy decoding on random targets (MLXLM_SHAPES, space-separated; qwen3-4b by
  # default): ours vs mlx-lm's stream_generate, same weights, prompt and token count,
  # alternating, 3 runs each. Needs .gpu/p3 (gpu_bundle.sh --mlx-lm).
  install_mlxlm || exit $?
  N="${BENCH_TOKENS:-256}"
  PROMPT="Write a short story about a robot learning to paint."
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  PYTHONPATH="$P" python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())" 2>&1 | tee "$OUT/mlxlm_version.txt"
  # MLXLM_SHAPES: the random shapes to compare (space-separated; qwen3-4b by default).
  for SHAPE in ${MLXLM_SHAPES:-qwen3-4b}; do
    SD=/tmp/r4b; [ "$SHAPE" = qwen3-4b ] || SD="/tmp/r-$SHAPE"
    [ -d "$SD/target" ] || "$B/dflash-mlx" bench --random "$SHAPE" --dir "$SD" -n 8 --num-prompts 1 --repeats 1 --warmup 0 --json > /dev/null 2>&1
    ours() { "$B/dflash-mlx" run -q --target-model "$SD/target" --no-draft --ignore-eos -n "$N" --prompt "$PROMPT" --json | python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print("%.1f" % s["generation_tps"])'; }
    ref() { PYTHONPATH="$P" python3 - "$SD/target" "$N" "$PROMPT" <<'PYEOF'
import sys
import mlx.core as mx
from mlx_lm import load, stream_generate
model, tok = load(sys.argv[1])
tok._eos_token_ids = set()
prompt = tok.apply_chat_template([{"role": "user", "content": sys.argv[3]}], add_generation_prompt=True, enable_thinking=False)
last = None
for r in stream_generate(model, tok, prompt, max_tokens=int(sys.argv[2])):
    last = r
print("%.1f" % last.generation_tps, mx.default_device(), file=sys.stdout)
PYEOF
    }
    ours > /dev/null; ref > "$OUT/mlxlm_warmup_$SHAPE.txt" 2>&1   # warm-up (kernel caches); its errors, if any
    for i in 1 2 3; do
      o="$(ours)"; r="$(ref 2>/dev/null)"
      echo "$SHAPE run $i: dflash-mlx $o tok/s, mlx-lm $r" | tee -a "$OUT/mlxlm_vs_ours.txt"
    done
  done
fi
