#!/usr/bin/env bash
# Fuzzes every decoder that takes bytes from the network or from disk (README "Fuzzing"):
# builds the libFuzzer targets of e2e/fuzz (libfuzzer-sys, with cargo-fuzz's instrumentation
# flags, all stable: no nightly, no tool to install), runs each for a bounded time from its
# corpus, and prints executions and crashes per target.
#
#   bash scripts/fuzz.sh                      # every target, 60 s each
#   bash scripts/fuzz.sh --seconds 600 dns_query tunnel
#   bash scripts/fuzz.sh --quick --seconds 5  # a short pass: a quicker build (opt-level 1)
#   bash scripts/fuzz.sh --merge              # also fold new coverage into e2e/fuzz/corpus
#   bash scripts/fuzz.sh --list
#
# A crash leaves its input in e2e/fuzz/artifacts/<target>/ and makes the script fail; replay it
# with `<binary> <file>` (the script prints the command). Turn it into a fix plus a regression:
# copy the input to e2e/fuzz/regressions/<target>/ (the unit tests replay that directory).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
merge=false
profile=release
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --merge) merge=true; shift ;;
    --quick) profile=fuzz-quick; shift ;;
    --list) ls e2e/fuzz/fuzz_targets | sed 's/\.rs$//'; exit 0 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(ls e2e/fuzz/fuzz_targets | sed 's/\.rs$//')
fi

target_dir="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"
triple=$(rustc -vV | sed -n 's/^host: //p')
# What `cargo fuzz build --sanitizer none` passes: libFuzzer's coverage counters, comparison
# tracing and stack depth. No sanitizer: the code under test is safe Rust, ASan needs
# -Zsanitizer (nightly) and halves the speed; panics, overflows (debug assertions) and stack
# overflows abort, which libFuzzer reports as crashes. `--target` keeps the flags off build
# scripts and proc macros.
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-sanitizer-coverage-stack-depth"
flags+=" -Cllvm-args=-simplifycfg-branch-fold-threshold=0 --cfg fuzzing -Cdebug-assertions"
echo "==> building the fuzz targets (profile $profile) into $target_dir"
RUSTFLAGS="$flags" cargo build --manifest-path e2e/fuzz/Cargo.toml --target "$triple" \
  --profile "$profile" --target-dir "$target_dir" --bins 2>&1 \
  | { grep -vE '^\s+(Compiling|Downloaded|Downloading) ' || true; }
bin_dir="$target_dir/$triple/$profile"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
summary="$work/summary"
failed=()
for t in "${targets[@]}"; do
  [ -x "$bin_dir/$t" ] || { echo "no fuzz target $t (see --list)" >&2; exit 2; }
  # What runs find stays in the target directory (the next run starts from it); the
  # repository keeps small seeds (--merge folds a run's coverage into them).
  found="$target_dir/corpus/$t"
  mkdir -p "$found" "e2e/fuzz/artifacts/$t"
  log="$work/$t.log"
  echo "==> $t: ${seconds} s"
  set +e
  # The first corpus directory gets what the run finds; the repository's stays as it is.
  "$bin_dir/$t" "$found" "e2e/fuzz/corpus/$t" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="e2e/fuzz/artifacts/$t/" >"$log" 2>&1
  status=$?
  set -e
  # (`|| true`: no match is no crash, not a failure of the script.)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$( (grep -oE 'cov: [0-9]+' "$log" || true) | tail -1 | awk '{print $2}')
  crash=$( (grep -oE "e2e/fuzz/artifacts/$t/[a-z]+-[0-9a-f]+" "$log" || true) | head -1)
  if [ "$status" -ne 0 ]; then
    failed+=("$t")
    grep -E 'panicked at|ERROR: libFuzzer|deadly signal|SUMMARY' "$log" | head -5 || true
    cp "$log" "e2e/fuzz/artifacts/$t/last-run.log"
    echo "    replay: $bin_dir/$t ${crash:-<artifact>}"
    printf '%-20s %12s %6s  CRASH %s\n' "$t" "${runs:-?}" "${cov:-?}" "${crash:-(see log)}" >>"$summary"
  else
    printf '%-20s %12s %6s  ok\n' "$t" "${runs:-?}" "${cov:-?}" >>"$summary"
  fi
  if $merge; then
    "$bin_dir/$t" -merge=1 "e2e/fuzz/corpus/$t" "$found" >/dev/null 2>&1
  fi
done

echo
printf '%-20s %12s %6s  %s\n' target executions cov result
cat "$summary"
if [ ${#failed[@]} -ne 0 ]; then
  echo "FUZZING FOUND CRASHES in: ${failed[*]}"
  exit 1
fi
echo "no crashes (${#targets[@]} targets, ${seconds} s each)"
