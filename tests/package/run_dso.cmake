# Builds tests/package/dso (a hidden-visibility shared library using locus, and programs
# using locus that call it) and runs its programs: the shared pair, the private pair and
# the shared pair under AddressSanitizer with detect_odr_violation=2. Each program checks
# what is shared and what is per DSO (docs/building.md, "Shared libraries").
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}${err}")
endfunction()

run(${CMAKE_COMMAND} -S "${LOCUS_SOURCE_DIR}/tests/package/dso" -B "${WORK_DIR}/build" -DCMAKE_BUILD_TYPE=Release
    "-DLOCUS_SOURCE_DIR=${LOCUS_SOURCE_DIR}" -DLOCUS_ENABLE_CUDA=OFF)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/program")
run("${WORK_DIR}/build/program_private")
# halt_on_error: an ODR report ends the run; leak detection stays on (the allocators are
# reachable from their statics, so a leak report would be a real leak).
run(${CMAKE_COMMAND} -E env "ASAN_OPTIONS=detect_odr_violation=2:halt_on_error=1:abort_on_error=0"
    "${WORK_DIR}/build/program_asan")
