# Builds a consumer project against locus and runs it.
#   MODE=find_package: installs the build tree into WORK_DIR/prefix, then builds
#                      tests/package/consumer with find_package(locus CONFIG REQUIRED);
#                      checks the installed documentation (LOCUS_INSTALL_DOCDIR under the
#                      prefix) and builds the installed examples/doctor.cpp.
#   MODE=add_subdirectory: builds tests/package/subdir_consumer, which adds the source tree.
cmake_policy(VERSION 3.25)  # script mode: IN_LIST and the other current behaviours
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
  # The documentation: README.md, docs/*.md, examples/*.{cpp,cu,hpp} and examples/pitfalls/'s
  # sources and READMEs, at their source-tree paths, each byte-equal to the source
  # tree's, and nothing else (no build script).
  set(doc "${WORK_DIR}/prefix/${LOCUS_INSTALL_DOCDIR}")
  file(GLOB docs RELATIVE "${LOCUS_SOURCE_DIR}" "${LOCUS_SOURCE_DIR}/docs/*.md")
  file(GLOB examples RELATIVE "${LOCUS_SOURCE_DIR}" "${LOCUS_SOURCE_DIR}/examples/*.cpp"
       "${LOCUS_SOURCE_DIR}/examples/*.cu" "${LOCUS_SOURCE_DIR}/examples/*.hpp")
  file(GLOB_RECURSE pitfalls RELATIVE "${LOCUS_SOURCE_DIR}" "${LOCUS_SOURCE_DIR}/examples/pitfalls/*.cpp"
       "${LOCUS_SOURCE_DIR}/examples/pitfalls/*.cu" "${LOCUS_SOURCE_DIR}/examples/pitfalls/*.hpp"
       "${LOCUS_SOURCE_DIR}/examples/pitfalls/*.md")
  list(LENGTH docs n_docs)
  list(LENGTH examples n_examples)
  list(LENGTH pitfalls n_pitfalls)
  if(n_docs LESS 1 OR n_examples LESS 1 OR n_pitfalls LESS 10)
    message(FATAL_ERROR "the source tree has too few files to check: ${docs} ${examples} ${pitfalls}")
  endif()
  set(expected README.md ${docs} ${examples} ${pitfalls})  # the source tree's layout
  foreach(f ${expected})
    if(NOT EXISTS "${doc}/${f}")
      message(FATAL_ERROR "the installed documentation lacks ${doc}/${f}")
    endif()
    execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${LOCUS_SOURCE_DIR}/${f}" "${doc}/${f}"
                    RESULT_VARIABLE differ)
    if(NOT differ EQUAL 0)
      message(FATAL_ERROR "${doc}/${f} differs from the source tree's ${f}")
    endif()
  endforeach()
  file(GLOB_RECURSE installed RELATIVE "${doc}" "${doc}/*")
  foreach(f ${installed})
    if(NOT f IN_LIST expected)
      message(FATAL_ERROR "the installed documentation has ${doc}/${f}, which is none of the files it should hold")
    endif()
  endforeach()
  list(LENGTH expected n_expected)
  message(STATUS "installed documentation: ${n_expected} files in ${doc}")
  set(src "${LOCUS_SOURCE_DIR}/tests/package/consumer")
  # The consumer also builds the installed examples/doctor.cpp.
  set(extra "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" "-DLOCUS_INSTALLED_EXAMPLES=${doc}/examples")
else()
  set(src "${LOCUS_SOURCE_DIR}/tests/package/subdir_consumer")
  set(extra "-DLOCUS_SOURCE_DIR=${LOCUS_SOURCE_DIR}" "-DLOCUS_ENABLE_CUDA=${LOCUS_ENABLE_CUDA}")
endif()
run(${CMAKE_COMMAND} -S "${src}" -B "${WORK_DIR}/build" -DCMAKE_BUILD_TYPE=Release ${extra})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
if(MODE STREQUAL "find_package")
  run("${WORK_DIR}/build/doctor")
endif()
