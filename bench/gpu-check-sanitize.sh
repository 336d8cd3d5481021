# Sourced by bench/gpu-check (step 3): sanitize TOOL CAP [suite arguments...] runs one
# compute-sanitizer tool over the CUDA suite and turns what it printed into a row of the
# table, a failure or an "incomplete" note. It reads gpu-check's dry, cs, cuda_tests,
# sanitizer_log and step_limit/now/log, and appends to rows, incomplete and failed.
# tests/tools/gpu_check_sanitize.sh checks its verdicts against a fake compute-sanitizer.
sanitize() {
  local tool="$1" cap="$2" t0 lim rc line nerr result section records
  shift 2
  t0=$(now)
  lim="$(step_limit "$cap")"
  if ((dry)); then
    result="skipped (dry run: no GPU)"
  elif [ -z "$cs" ]; then
    result="skipped (no compute-sanitizer)"
    incomplete+=("$tool: no compute-sanitizer")
  elif [ ! -x "$cuda_tests" ]; then
    result="not run (locus_cuda_tests not built)"
    failed=1
  elif [ "$lim" -lt "${sanitize_min_s:-15}" ]; then  # too little time to start the suite
    result="not run: out of time"
    incomplete+=("$tool: not run, out of time")
  else
    log "$tool: $cs --tool $tool $cuda_tests $* (limit ${lim}s)"
    # API errors are not reported: locus checks every CUDA call itself, and tests may
    # provoke failing calls on purpose. The tools are here for bad accesses, shared-memory
    # races and misused barriers.
    section="$(mktemp)"
    {
      echo "# $cs --tool $tool --report-api-errors no --error-exitcode 86 $cuda_tests $*"
      timeout -k 10 "$lim" "$cs" --tool "$tool" --report-api-errors no --error-exitcode 86 \
        --print-limit 50 "$cuda_tests" "$@" 2>&1
      echo "# exit status: $?"
    } >"$section" 2>&1
    rc="$(sed -n 's/^# exit status: //p' "$section" | tail -1)"
    line="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$section" | tail -1 | sed 's/^=* *//')"
    # memcheck, synccheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H
    # hazards displayed (E errors, W warnings)": its errors count, its warnings do not.
    nerr="$(sed -n -e 's/.*RACECHECK SUMMARY:.*(\([0-9]*\) errors\{0,1\}.*/\1/p' \
                   -e 's/.*ERROR SUMMARY: \([0-9]*\) errors\{0,1\}.*/\1/p' <<<"$line" | head -1)"
    # Error records the tool printed before any summary (a run cut short has none).
    records="$(grep -c -E '^=+ +(Invalid |Error|Barrier error|Program hit|Out-of-range|Misaligned|Address )' "$section" || true)"
    if grep -q -i 'Device not supported' "$section"; then
      result="unsupported here (compute-sanitizer: Device not supported; a gVisor machine?)"
      incomplete+=("$tool: device not supported")
    elif [ -n "$nerr" ] && [ "$nerr" -gt 0 ]; then
      result="FAIL: $line"
      failed=1
    elif [ -n "$nerr" ]; then  # a summary with no errors decides (an exit 86 then means warnings)
      if [ "$rc" = 0 ] || [ "$rc" = 86 ]; then
        result="pass: $line"
      elif [ "$rc" = 77 ]; then
        result="skipped (the suite found no usable CUDA device under the sanitizer)"
        incomplete+=("$tool: no usable CUDA device under the sanitizer")
      else
        result="FAIL: no errors ($line), but the suite exited $rc"
        failed=1
      fi
    elif [ "$records" -gt 0 ]; then
      result="FAIL: $records error record(s) before the run ended (exit $rc; see compute-sanitizer.log)"
      failed=1
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      result="INCOMPLETE: cut short after ${lim}s with no error reported before"
      incomplete+=("$tool: cut short after ${lim}s")
    else
      result="FAIL: no summary line (exit $rc; see compute-sanitizer.log)"
      failed=1
    fi
    cat "$section" >>"$sanitizer_log"
    rm -f "$section"
  fi
  echo "# $tool: $result" >>"$sanitizer_log"
  rows+=("$tool (locus_cuda_tests)|$result|$(($(now) - t0))")
  log "$tool: $result"
}