#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for N seconds each (default 60) and prints a summary:
# target, executions, result. Not part of scripts/test.sh (too long); the property tests that
# cover the same inputs run in `cargo test`.
#
#   scripts/fuzz.sh [seconds] [target…]
#
# Installs cargo-fuzz if it is missing. Uses the nightly toolchain when rustup has one, else the
# stable one with RUSTC_BOOTSTRAP=1 (cargo fuzz needs nightly flags). New inputs go to
# fuzz/corpus/<target> (git-ignored) on top of the committed seeds in fuzz/seeds/<target>; a
# crash leaves its input in fuzz/artifacts/<target>/ (replay it with
# `cargo fuzz run <target> <file>`). Exit status 1 when any target crashed or did not build.
set -euo pipefail

secs="${1:-60}"
shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz…" >&2
  cargo install cargo-fuzz --locked
fi

if rustup run nightly rustc --version >/dev/null 2>&1; then
  fuzz=(cargo +nightly fuzz)
else
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <("${fuzz[@]}" list)
fi

dict_for() {
  case "$1" in
    agent_config | agent_script | mailbox_answer) echo "-dict=dicts/yaml.dict" ;;
    *) echo "-dict=dicts/json.dict" ;;
  esac
}

echo "building ${#targets[@]} targets…" >&2
"${fuzz[@]}" build >&2

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
failed=0
rows=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  echo "fuzzing $t for ${secs}s…" >&2
  if "${fuzz[@]}" run "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$secs" "$(dict_for "$t")" -print_final_stats=1 >"$logs/$t" 2>&1; then
    result=ok
  else
    failed=1
    artifact="$(grep -o 'artifacts/[^ ]*' "$logs/$t" | tail -n 1 || true)"
    result="CRASH ${artifact:-(see output above)}"
    tail -n 40 "$logs/$t" >&2
  fi
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t" | grep -o '[0-9]*$' || true)"
  rows+=("$(printf '%-22s %12s  %s' "$t" "${execs:--}" "$result")")
done

printf '\n%-22s %12s  %s\n' TARGET EXECS RESULT
printf '%s\n' "${rows[@]}"
exit "$failed"
