#!/usr/bin/env bash
# Re-measure the CPU benchmarks one after the other, then regenerate docs/benchmarks.md.
#
#   bench/run_all.sh                  # refuses on a busy machine (see below)
#   bench/run_all.sh --allow-busy     # records anyway: every JSON says "busy": true
#   bench/run_all.sh --only serve_peers,deploy_bench
#   bench/run_all.sh --group timing   # or accuracy (seeds; the load does not change them)
#   bench/run_all.sh --dry-run        # the commands and the estimated minutes, nothing run
#
# Busy: the 1-minute load average above LOAD_PER_CPU (0.5) times the usable CPUs when it
# starts. Each script also samples, before it starts, the share of the CPUs that others keep
# busy (bench/provenance.py: "cpu_busy_before", "busy"); the load average cannot tell that
# apart from the previous script of this run.
#
# The arguments below are chosen to fit the timing group in about 30 minutes on 2 cores
# (estimates from each script's last recorded duration, scaled to these arguments; the run
# prints the real ones). Every script keeps its method (alternation, medians, seeds): fewer
# or smaller cases, never a skipped comparison. GPU figures come from bench/run_gpu_checks.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
LOAD_PER_CPU=${LOAD_PER_CPU:-0.5}
LOGS=${LOGS:-${TMPDIR:-/tmp}/zoo-bench-logs}

# name | group | estimated seconds | arguments
SUITE=(
  "cli_startup|timing|60|--rounds 20"
  "deploy_bench|timing|260|--seconds 2 --digits-epochs 3"
  "openvino_bench|timing|300|--seconds 1.5"
  "quantize_defaults|timing|200|"
  "serve_load|timing|130|--soak 30 --window 3"
  "serve_peers|timing|240|--window 3 --rounds 4 --concurrency 8,32"
  "predict_throughput|timing|150|--per-class 100 --mem-sizes 1000,5000 --ceiling-seconds 3 --kills 3"
  "trainer_overhead|timing|310|--rounds 2"
  "loader_cache|timing|260|--rounds 3 --images 512 --trainer-per-class 60"
  "feature_cache|timing|300|--rounds 2 --size 96 --epochs 4"
  "cache_accuracy|accuracy|600|--seeds 0,1,2"
  "imbalance|accuracy|560|--seeds 0,1,2 --epochs 5"
)

allow_busy=0 dry=0 only="" group=all
while [ $# -gt 0 ]; do
  case $1 in
    --allow-busy) allow_busy=1 ;;
    --dry-run) dry=1 ;;
    --only) only=${2:?--only needs NAME[,NAME...]}; shift ;;
    --group) group=${2:?--group needs timing, accuracy or all}; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "bench/run_all.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $group in timing|accuracy|all) ;; *) echo "--group must be timing, accuracy or all, not '$group'" >&2; exit 2 ;; esac

known=" $(for row in "${SUITE[@]}"; do printf '%s ' "${row%%|*}"; done)"
for name in ${only//,/ }; do
  [[ "$known" == *" $name "* ]] || { echo "unknown benchmark '$name' in --only; one of:$known" >&2; exit 2; }
done
selected=()
total=0
for row in "${SUITE[@]}"; do
  IFS='|' read -r name grp est _args <<<"$row"
  if [ -n "$only" ] && [[ ! ",$only," == *",$name,"* ]]; then continue; fi
  if [ -z "$only" ] && [ "$group" != all ] && [ "$group" != "$grp" ]; then continue; fi
  [ -f "$ROOT/bench/$name.py" ] || { echo "bench/$name.py does not exist" >&2; exit 2; }
  selected+=("$row")
  total=$((total + est))
done

if [ $dry -eq 1 ]; then
  for row in "${selected[@]}"; do
    IFS='|' read -r name grp est args <<<"$row"
    printf '%-20s %-8s ~%4ss  python bench/%s.py %s\n' "$name" "$grp" "$est" "$name" "$args"
  done
  echo "estimated total: $((total / 60)) min"
  exit 0
fi

cpus=$(nproc)
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" -v c="$cpus" -v k="$LOAD_PER_CPU" 'BEGIN { exit !(l > k * c) }'; then
  if [ $allow_busy -eq 0 ]; then
    echo "the machine is busy: load average $load on $cpus CPUs (more than $LOAD_PER_CPU per CPU)." >&2
    echo "Figures measured now would be provisional. Wait for a quiet machine, or pass" >&2
    echo "--allow-busy to record them marked busy." >&2
    exit 1
  fi
  echo "busy machine (load $load on $cpus CPUs): recording with busy=true (--allow-busy)" >&2
  export ZOO_BENCH_BUSY=1
fi
if [[ " ${selected[*]} " == *"serve_peers|"* ]] && ! "$PY" -c 'import litserve, aiohttp' 2>/dev/null; then
  echo "serve_peers needs the bench extra: pip install -e '.[bench]'" >&2
  exit 1
fi

mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
failed=()
started=$SECONDS
echo "estimated: $((total / 60)) min; logs in $LOGS" >&2
for row in "${selected[@]}"; do
  IFS='|' read -r name grp est args <<<"$row"
  t0=$SECONDS
  echo "== $name (~${est}s): python bench/$name.py $args" >&2
  # shellcheck disable=SC2086
  if (cd "$ROOT" && "$PY" "bench/$name.py" $args) >"$LOGS/$name.log" 2>&1; then
    echo "   done in $((SECONDS - t0))s" >&2
  else
    echo "   FAILED after $((SECONDS - t0))s: tail of $LOGS/$name.log:" >&2
    tail -15 "$LOGS/$name.log" >&2
    failed+=("$name")
  fi
done
echo "all in $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s" >&2
(cd "$ROOT" && "$PY" scripts/make_benchmarks_doc.py)
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]} (their JSON files were not rewritten)" >&2
  exit 1
fi
