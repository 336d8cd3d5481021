#!/usr/bin/env bash
# The verdicts of bench/gpu-check's compute-sanitizer step (bench/gpu-check-sanitize.sh),
# checked without a GPU: a fake compute-sanitizer prints what the real tools print (their
# summary lines, error records, a run cut short by its time cap) and exits as they do.
# A GPU is lent rarely; a verdict that is wrong there (a failure read as a pass) would
# waste it. Usage: gpu_check_sanitize.sh REPO_ROOT
set -uo pipefail
root="${1:?usage: gpu_check_sanitize.sh REPO_ROOT}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# What gpu-check gives the function.
now() { date +%s; }
log() { :; }
cap_override=""
step_limit() { echo "${cap_override:-$1}"; }
dry=0
cs="$work/compute-sanitizer"
cuda_tests="$work/locus_cuda_tests"
sanitizer_log="$work/compute-sanitizer.log"
sanitize_min_s=2  # gpu-check's 15 s minimum, scaled down with the caps below
. "$root/bench/gpu-check-sanitize.sh"

cat >"$cs" <<'EOF'
#!/bin/sh
# the fake: prints $FAKE_OUT, sleeps $FAKE_SLEEP, exits $FAKE_RC; records its arguments
printf '%s\n' "$*" >"$FAKE_ARGS"
printf '%b' "$FAKE_OUT"
[ -n "$FAKE_SLEEP" ] && sleep "$FAKE_SLEEP"
exit "$FAKE_RC"
EOF
printf '#!/bin/sh\nexit 0\n' >"$cuda_tests"
chmod +x "$cs" "$cuda_tests"
export FAKE_ARGS="$work/args"

passed=0 failures=0
# expect NAME TOOL OUTPUT RC SLEEP CAP WANT_FAILED WANT_INCOMPLETE ROW_PREFIX
expect() {
  local name="$1" tool="$2"
  export FAKE_OUT="$3" FAKE_RC="$4" FAKE_SLEEP="$5"
  cap_override="$6"
  rows=() incomplete=() failed=0
  : >"$sanitizer_log"
  sanitize "$tool" 60 --test-case-exclude='*all 2^32 floats*'
  local row="${rows[0]:-}" result
  result="${row#*|}"
  result="${result%|*}"
  if [ "$failed" = "$7" ] && [ "${#incomplete[@]}" = "$8" ] && [[ $result == "$9"* ]]; then
    passed=$((passed + 1))
  else
    failures=$((failures + 1))
    echo "FAILED: $name: row '$row', failed=$failed (want $7), incomplete=${#incomplete[@]} (want $8), want a result starting '$9'"
  fi
}

S='========= '
expect "memcheck clean" memcheck "${S}COMPUTE-SANITIZER\n${S}ERROR SUMMARY: 0 errors\n" 0 "" "" 0 0 "pass: ERROR SUMMARY: 0 errors"
expect "memcheck error" memcheck "${S}Invalid __global__ read of size 4 bytes\n${S}ERROR SUMMARY: 1 error\n" 86 "" "" 1 0 "FAIL: ERROR SUMMARY: 1 error"
expect "racecheck warnings only (exit 86)" racecheck "${S}RACECHECK SUMMARY: 4 hazards displayed (0 errors, 4 warnings)\n" 86 "" "" 0 0 "pass: RACECHECK SUMMARY"
expect "racecheck error" racecheck "${S}Error: Race reported between Write access at x and Read access at y\n${S}RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n" 86 "" "" 1 0 "FAIL: RACECHECK SUMMARY: 1 hazard"
expect "synccheck barrier error" synccheck "${S}Barrier error detected. Divergent thread(s) in warp\n${S}ERROR SUMMARY: 1 error\n" 86 "" "" 1 0 "FAIL: ERROR SUMMARY: 1 error"
expect "an error, then cut short by the cap" memcheck "${S}Invalid __global__ write of size 4 bytes\n" 0 20 2 1 0 "FAIL: 1 error record"
expect "cut short with nothing reported" synccheck "${S}COMPUTE-SANITIZER\n" 0 20 2 0 1 "INCOMPLETE: cut short after 2s"
expect "no summary line" racecheck "something else\n" 0 "" "" 1 0 "FAIL: no summary line"
expect "suite failed under the tool" memcheck "[doctest] Status: FAILURE!\n${S}ERROR SUMMARY: 0 errors\n" 1 "" "" 1 0 "FAIL: no errors (ERROR SUMMARY: 0 errors), but the suite exited 1"
expect "no device under the tool (77)" memcheck "SKIPPED: no usable CUDA device\n${S}ERROR SUMMARY: 0 errors\n" 77 "" "" 0 1 "skipped (the suite found no usable CUDA device"
expect "gVisor refuses the device" memcheck "${S}Error: Device not supported\n" 1 "" "" 0 1 "unsupported here"
expect "out of time before it starts" memcheck "" 0 "" 1 0 1 "not run: out of time"
# the tool is started with API errors off, an error exit code, and the suite's arguments
FAKE_OUT="${S}ERROR SUMMARY: 0 errors\n" FAKE_RC=0 FAKE_SLEEP="" cap_override="" rows=() incomplete=() failed=0
sanitize racecheck 60 --test-case-exclude='*all 2^32 floats*'
want="--tool racecheck --report-api-errors no --error-exitcode 86 --print-limit 50 $cuda_tests --test-case-exclude=*all 2^32 floats*"
if [ "$(cat "$FAKE_ARGS")" = "$want" ]; then
  passed=$((passed + 1))
else
  failures=$((failures + 1))
  echo "FAILED: arguments: '$(cat "$FAKE_ARGS")', want '$want'"
fi
# a dry run skips without failing or counting as incomplete
dry=1 rows=() incomplete=() failed=0
sanitize memcheck 60
if [ "$failed" = 0 ] && [ "${#incomplete[@]}" = 0 ] && [[ ${rows[0]} == *"skipped (dry run"* ]]; then
  passed=$((passed + 1))
else
  failures=$((failures + 1))
  echo "FAILED: dry run: '${rows[0]:-}'"
fi
echo "$passed passed, $failures failed"
((failures == 0))
