# Builds a consumer project against locus and runs it.
#   MODE=find_package: installs the build tree into WORK_DIR/prefix, then builds
#                      tests/package/consumer with find_package(locus CONFIG REQUIRED).
#   MODE=add_subdirectory: builds tests/package/subdir_consumer, which adds the source tree.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} --install "${LOCUS_BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
  set(src "${LOCUS_SOURCE_DIR}/tests/package/consumer")
  set(extra "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
else()
  set(src "${LOCUS_SOURCE_DIR}/tests/package/subdir_consumer")
  set(extra "-DLOCUS_SOURCE_DIR=${LOCUS_SOURCE_DIR}" "-DLOCUS_ENABLE_CUDA=${LOCUS_ENABLE_CUDA}")
endif()
run(${CMAKE_COMMAND} -S "${src}" -B "${WORK_DIR}/build" -DCMAKE_BUILD_TYPE=Release ${extra})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
