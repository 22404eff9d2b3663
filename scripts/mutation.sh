#!/usr/bin/env bash
# Mutation testing (mutmut 3) of the modules that carry a guarantee. Not part of CI: it takes
# minutes per module. Scores and the survivors' reasons are recorded in docs/quality.md; each
# module's score, commit and date also go into docs/quality.json (record() below writes its
# row there, or into $QUALITY_JSON, when the measured tree is a clean commit), from which
# scripts/make_benchmarks_doc.py writes quality.md's staleness table (commits that touched the
# mutated files or their tests since).
#
#   scripts/mutation.sh                 # every module below
#   scripts/mutation.sh parity lint     # some of them
#   MAX_CHILDREN=2 MUTATION_DIR=/tmp/zoo-mutation scripts/mutation.sh weights
#   QUALITY_JSON=/elsewhere/docs/quality.json scripts/mutation.sh lint   # measured in a clone
#
# Why a staging tree: the repository keeps train/, deploy/ and cli/ beside zoo/, and setuptools'
# package-dir installs them as zoo.train, zoo.deploy and zoo.cli. mutmut 3 names each mutant
# after its file's path (deploy/export/parity.py -> deploy.parity.x_compare__mutmut_1) and records the
# functions a test reaches by their __module__ (zoo.deploy.export.parity), so on the repository layout
# the two never meet and every mutant reads "no tests". It also puts its mutated copy
# (mutants/) first on sys.path, which only wins if that copy has the installed layout. So each
# module runs in its own staging folder that has exactly the installed layout:
#
#   $MUTATION_DIR/<module>/zoo/            <- zoo/
#   $MUTATION_DIR/<module>/zoo/train/      <- train/     (likewise deploy/, cli/)
#   $MUTATION_DIR/<module>/tests/          <- tests/
#   $MUTATION_DIR/<module>/pyproject.toml  <- ours + a [tool.mutmut] section for that module
#
# There mutmut's source_paths = ["zoo"], its mutants/zoo/... is imported as zoo.* (the editable
# install's finder sits after sys.path's PathFinder, so the mutated copy wins), and mutant
# names and recorded names agree. Each module selects only its fast unit tests
# (tests/test_gates_*.py): mutmut runs, per mutant, the selected tests that reach the mutated
# function, so slow end-to-end tests would turn every mutant into a timeout.
#
# A module may also name function globs: only those functions' mutants are run and counted
# (e.g. the lock parts of zoo/hub.py, not its download plumbing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
"$PY" -c 'import mutmut' 2>/dev/null || { echo "mutmut is not installed: pip install 'mutmut>=3.8'" >&2; exit 1; }
OUT=${MUTATION_DIR:-${TMPDIR:-/tmp}/zoo-mutation}
# the commit measured (the staging copies have no .git); "+dirty" when a staged file differs
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=all -- zoo train deploy cli tests 2>/dev/null)" ]; then
  COMMIT="$COMMIT+dirty"
fi
export ZOO_MUTATION_COMMIT=$COMMIT
CHILDREN=${MAX_CHILDREN:-2}
QUALITY_JSON=${QUALITY_JSON:-$ROOT/docs/quality.json}

# module | files to mutate (installed paths) | tests | function globs (mutant names; empty: all)
MODULES=(
  "parity|zoo/deploy/export/parity.py zoo/deploy/export/parity_report.py|tests/test_gates_parity.py|"
  "lint|zoo/deploy/export/lint.py|tests/test_gates_lint.py|"
  "weights|zoo/weights.py zoo/hub.py|tests/test_gates_weights.py|zoo.weights.x_sha256_file__mutmut_* zoo.weights.x_verify_file__mutmut_* zoo.weights.x_torchvision_cache_path__mutmut_* zoo.weights.x__fetch_torchvision__mutmut_* zoo.weights.x_hub_errors__mutmut_* zoo.weights.x_hub_download__mutmut_* zoo.weights.x__fetch_hub__mutmut_* zoo.weights.x_fetch_weights__mutmut_* zoo.weights.x_read_state_dict__mutmut_* zoo.weights.x__unreadable__mutmut_* zoo.weights.x_load_weights__mutmut_* zoo.hub.x_lock_path__mutmut_* zoo.hub.x__read_lock__mutmut_* zoo.hub.x_verify_locked__mutmut_* zoo.hub.x_verify_snapshot__mutmut_*"
  "loading|zoo/loading.py|tests/test_gates_loading.py|"
  "quantize|zoo/deploy/quantize/verdict.py zoo/deploy/quantize/calibration.py zoo/deploy/quantize/images.py zoo/deploy/quantize/report.py|tests/test_gates_quantize.py tests/test_quantize_run.py::test_floor_on_accuracy_and_on_agreement tests/test_quantize_run.py::test_int8_does_not_pay_with_few_int8_nodes_or_no_speed_up tests/test_quantize_search.py::test_shared_files_pairs_the_same_content_under_any_name tests/test_quantize_search.py::test_check_disjoint_refuses_a_copy_a_link_or_the_same_file tests/test_quantize_run.py::test_a_photo_in_both_splits_is_left_out_of_the_calibration tests/test_quantize_run.py::test_calibration_from_calib_leaves_the_judged_images_out_and_refuses_when_none_is_left tests/test_quantize_run.py::test_data_in_the_runs_training_split_blames_neither_calib_nor_the_user|zoo.deploy.quantize.verdict.* zoo.deploy.quantize.calibration.xǁCalibReaderǁ* zoo.deploy.quantize.calibration.x_file_digest__mutmut_* zoo.deploy.quantize.calibration.x_shared_files__mutmut_* zoo.deploy.quantize.calibration.x_check_disjoint__mutmut_* zoo.deploy.quantize.images.x_labels_for__mutmut_* zoo.deploy.quantize.images.x_calibration_images__mutmut_* zoo.deploy.quantize.images.x__without__mutmut_* zoo.deploy.quantize.report.xǁLatencyǁ* zoo.deploy.quantize.report.xǁQuantizeReportǁaccuracy_drop__mutmut_* zoo.deploy.quantize.report.xǁQuantizeReportǁfailed__mutmut_*"
  "data|zoo/train/data.py zoo/train/check.py|tests/test_gates_data.py|zoo.train.data.x_* zoo.train.data.xǁSplitsǁ* zoo.train.check.*"
  "protocol|zoo/deploy/serve/protocol.py|tests/test_protocol.py tests/test_gates_protocol.py|"
  "batcher|zoo/deploy/serve/batcher.py|tests/test_batcher.py tests/test_gates_batcher.py|"
  "checkpoint|zoo/train/checkpoint.py zoo/train/resume.py|tests/test_gates_checkpoint.py tests/test_resume.py::test_each_rank_resumes_its_own_running_sums|"
  "durable|zoo/durable.py|tests/test_gates_durable.py tests/test_crash_consistency.py::test_fault_point_kills_at_the_named_side_of_the_named_write|"
  "run_dir|zoo/train/run_dir.py|tests/test_gates_run_dir.py tests/test_crash_consistency.py::test_top_k_is_a_function_of_the_history tests/test_crash_consistency.py::test_metrics_files_are_the_history_rows tests/test_crash_consistency.py::test_recover_redoes_everything_the_last_commit_implies|"
  "fp16|zoo/deploy/export/fp16.py|tests/test_gates_fp16.py|"
  "graph_preprocess|zoo/deploy/export/graph_preprocess.py|tests/test_gates_graph_preprocess.py tests/test_embed_preprocessing.py::test_the_graph_preprocesses_as_python_does tests/test_embed_preprocessing.py::test_an_image_too_thin_to_resize_is_refused_before_it_is_resized tests/test_embed_preprocessing.py::test_what_onnx_resize_cannot_reproduce_is_refused|"
  "store|zoo/deploy/predict/store.py|tests/test_gates_predict.py tests/test_gates_store.py|"
  "search|zoo/deploy/quantize/search.py|tests/test_gates_search.py tests/test_quantize_search.py::test_choose_k_is_the_smallest_measured_k_that_reaches_the_target tests/test_quantize_search.py::test_bisection_finds_the_first_k_of_a_monotone_curve tests/test_quantize_search.py::test_bisection_stops_at_k_0_and_measures_n_when_nothing_else_reaches tests/test_quantize_search.py::test_sensitivity_order_is_highest_score_first_ties_in_graph_order tests/test_quantize_search.py::test_best_calibration_is_the_lowest_logit_error_first_of_equals tests/test_quantize_search.py::test_logit_error_and_top1_agreement tests/test_quantize_search.py::test_cli_prints_the_search|"
  "openvino|zoo/deploy/runtimes/openvino.py zoo/deploy/export/openvino.py|tests/test_gates_openvino.py tests/test_openvino.py::test_every_compile_names_its_precision_threads_and_one_stream tests/test_openvino.py::test_bf16_is_refused_where_the_cpu_would_silently_run_f32 tests/test_openvino.py::test_this_machines_plugin_is_asked_not_assumed tests/test_openvino.py::test_a_broken_ir_is_named_plainly|zoo.deploy.runtimes.openvino.* zoo.deploy.export.openvino.x__calibration__mutmut_*"
  "export|zoo/deploy/export/onnx_export.py|tests/test_gates_export.py|"
  "knn|zoo/knn.py|tests/test_knn.py|"
  "serve|zoo/deploy/serve/app.py zoo/deploy/serve/config.py zoo/deploy/serve/inputs.py|tests/test_gates_serve.py tests/test_gates_protocol.py tests/test_protocol.py::test_server_metadata_and_routing_errors_are_json tests/test_protocol.py::test_a_bug_outside_the_guarded_endpoints_still_answers_json|"
  "auth|zoo/deploy/serve/auth.py|tests/test_gates_serve.py tests/test_serve_auth.py::test_wrong_keys_of_any_length_take_the_same_path|"
  "ref|zoo/ref.py|tests/test_model_ref.py|"
  "image_cache|zoo/train/image_cache.py|tests/test_gates_image_cache.py tests/test_image_cache.py::test_entry_equals_a_fresh_decode_at_the_storage_size tests/test_image_cache.py::test_an_edited_file_is_decoded_again_and_nothing_else tests/test_image_cache.py::test_a_torn_or_foreign_entry_is_never_trusted tests/test_image_cache.py::test_a_broken_file_is_quarantined_as_without_the_cache|zoo.train.image_cache.xǁCacheSpecǁ* zoo.train.image_cache.x_entry_path__mutmut_* zoo.train.image_cache.x_decode__mutmut_* zoo.train.image_cache.x__write__mutmut_* zoo.train.image_cache.x__read__mutmut_* zoo.train.image_cache.xǁImageCacheǁget__mutmut_* zoo.train.image_cache.xǁImageCacheǁmissing__mutmut_*"
)

stage() {  # $1 = folder; the installed layout as plain copies (mutmut copies, never links)
  local dir=$1
  rm -rf "$dir"
  mkdir -p "$dir"
  cp -r "$ROOT/zoo" "$dir/zoo"
  for sub in train deploy cli; do cp -r "$ROOT/$sub" "$dir/zoo/$sub"; done
  cp -r "$ROOT/tests" "$dir/tests"
  find "$dir" -name __pycache__ -prune -exec rm -rf {} +
  cp "$ROOT/pyproject.toml" "$dir/pyproject.toml"
}

mutmut_config() {  # $1 = files, $2 = tests
  local files=$1 tests=$2
  printf '\n[tool.mutmut]\nsource_paths = ["zoo"]\n'
  printf 'only_mutate = [%s]\n' "$(printf '"%s",' $files | sed 's/,$//')"
  printf 'pytest_add_cli_args_test_selection = [%s]\n' "$(printf '"%s",' $tests | sed 's/,$//')"
  printf 'pytest_add_cli_args = ["-p", "no:cacheprovider", "-o", "addopts=--strict-markers"]\n'
  # torch is not fork-safe once used: fork every mutant from a clean server process
  printf 'process_isolation = "forkserver"\n'
  printf 'use_git_change_detection = false\n'
}

summary() {  # $1 = module, $2 = files, $3 = globs; prints one JSON line and the survivors
  "$PY" - "$@" <<'PYEOF'
import datetime, fnmatch, json, os, sys
from pathlib import Path
module, files, globs = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
status = {1: "killed", 3: "killed", 0: "survived", 33: "no tests", 5: "no tests",
          36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout",
          37: "type check", -9: "segfault", -11: "segfault", None: "not checked"}
counts: dict[str, int] = {}
left = []
for f in files:
    meta = json.loads(Path(f"mutants/{f}.meta").read_text())
    for name, code in meta["exit_code_by_key"].items():
        if globs and not any(fnmatch.fnmatch(name, g) for g in globs):
            continue
        s = status.get(code, "suspicious")
        counts[s] = counts.get(s, 0) + 1
        if s not in ("killed", "timeout"):
            left.append(f"{s}: {name}")
total = sum(counts.values())
killed = counts.get("killed", 0)
# a mutant whose tests hang is detected too (the suite would not pass): mutmut's own score
detected = killed + counts.get("timeout", 0)
print(json.dumps({"module": module, "killed": killed, "total": total,
                  "score": round(100 * detected / total, 1) if total else None,
                  "commit": os.environ.get("ZOO_MUTATION_COMMIT"),
                  "date": datetime.date.today().isoformat(), **counts}))
print("\n".join(left))
PYEOF
}

record() {  # $1 = summary.txt, $2 = files, $3 = tests, $4 = globs: the module's row in $QUALITY_JSON
  "$PY" - "$QUALITY_JSON" "$@" <<'PYEOF'
import json, sys
from pathlib import Path
target, summary, files, tests = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
whole_files = not sys.argv[5].split()  # no function globs: every function of the files
s = json.loads(summary.read_text().splitlines()[0])
if not s["commit"] or "+dirty" in s["commit"] or s["commit"] == "unknown" or not s["total"]:
    print(f"not recorded in {target}: measured at {s['commit']} (a clean commit only)", file=sys.stderr)
    sys.exit(0)
def repo_path(installed: str) -> str:  # zoo/deploy/x.py -> deploy/x.py; zoo/x.py stays
    parts = installed.split("/")
    return "/".join(parts[1:]) if parts[1] in ("train", "deploy", "cli") else installed
mutated = [repo_path(f) for f in files]
row = {"module": s["module"], "mutated": mutated,
       "tests": list(dict.fromkeys(t.split("::")[0] for t in tests)),
       "commit": s["commit"], "date": s["date"], "mutants": s["total"], "score_pct": s["score"],
       "killed": s["killed"], "timeout": s.get("timeout", 0),
       "survived": s["total"] - s["killed"] - s.get("timeout", 0)}
data = json.loads(target.read_text())
rows = [m for m in data["modules"] if m["module"] != row["module"]]
old = [i for i, m in enumerate(data["modules"]) if m["module"] == row["module"]]
rows.insert(old[0] if old else len(rows), row)
data["modules"] = rows
if whole_files:  # a part of a file mutated leaves its "never mutation-tested" row to a person
    data["never_run"] = [x for x in data["never_run"] if not set(x["paths"]) <= set(mutated)]
lines = ",\n".join("    " + json.dumps(m, ensure_ascii=False) for m in data["modules"])
never = ",\n".join("    " + json.dumps(x, ensure_ascii=False) for x in data["never_run"])
target.write_text(
    "{\n" + f'  "about": {json.dumps(data["about"], ensure_ascii=False)},\n'
    + f'  "tool": {json.dumps(data["tool"])},\n'
    + f'  "modules": [\n{lines}\n  ],\n  "never_run": [\n{never}\n  ]\n}}\n'
)
print(f"recorded {row['module']}: {row['score_pct']} % of {row['mutants']} at {row['commit']} in {target}", file=sys.stderr)
PYEOF
}

want=("$@")
for row in "${MODULES[@]}"; do
  IFS='|' read -r name files tests globs <<<"$row"
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " =~ " $name " ]]; then continue; fi
  dir=$OUT/$name
  echo "== $name: $files  <-  $tests" >&2
  stage "$dir"
  mutmut_config "$files" "$tests" >>"$dir/pyproject.toml"
  (
    cd "$dir"
    # shellcheck disable=SC2086
    "$PY" -m mutmut run --max-children "$CHILDREN" $globs >"$dir/mutmut.log" 2>&1 || {
      tail -40 "$dir/mutmut.log" >&2
      exit 1
    }
    summary "$name" "$files" "$globs" | tee "$dir/summary.txt"
    # the diff of every mutant left alive, for docs/quality.md
    { grep -v '^{' "$dir/summary.txt" || true; } | sed 's/^[^:]*: //' | while read -r m; do
      [ -n "$m" ] || continue
      echo "## $m"
      "$PY" -m mutmut show "$m" </dev/null 2>/dev/null | grep '^[-+][^-+]' || true
    done >"$dir/survivors.diff"
  )
  record "$dir/summary.txt" "$files" "$tests" "$globs"
done
