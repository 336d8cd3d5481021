# Checks one broken program of examples/pitfalls against its folder's README.md (see
# CMakeLists.txt). Inputs:
#   MODE     compile: COMPILER must fail on SOURCE; its first line containing "error:"
#                     (the file:line: prefix cut away) is what the README shows;
#            run-error: EXE must fail (an uncaught locus error); the text after
#                     "what():  " is what the README shows;
#            run-output: EXE must exit 0; its standard output is what the README shows
#                     (the mistakes locus cannot catch: what the program computes).
#   SOURCE   the broken program (its file name names the README block)
#   README   the folder's README.md, holding the block
#              <!-- locus-first-line broken.cpp -->      (compile)
#              <!-- locus-runtime-error broken.cpp -->   (run-error)
#              <!-- locus-output broken.cpp -->          (run-output)
#              ```text
#              ...
#              ```
#              <!-- /locus-... -->
#   COMPILER, INCLUDES (;-list), DEFINES (;-list)   for compile
#   EXE                                             for run-error and run-output
# With the environment variable LOCUS_PITFALLS_UPDATE=1 (or -DUPDATE=ON) the block is
# rewritten with what the program says now instead of failing on a difference
# (examples/pitfalls/regenerate runs every check that way).
get_filename_component(_file "${SOURCE}" NAME)
if(MODE STREQUAL "compile")
  set(_tag "locus-first-line")
elseif(MODE STREQUAL "run-error")
  set(_tag "locus-runtime-error")
elseif(MODE STREQUAL "run-output")
  set(_tag "locus-output")
else()
  message(FATAL_ERROR "check.cmake: unknown MODE '${MODE}'")
endif()
if("$ENV{LOCUS_PITFALLS_UPDATE}" STREQUAL "1")
  set(UPDATE ON)
endif()

# ---- what the program says now --------------------------------------------------------
if(MODE STREQUAL "compile")
  set(_args -std=c++20 -fsyntax-only -fdiagnostics-color=never -fno-diagnostics-show-caret)
  foreach(i IN LISTS INCLUDES)
    list(APPEND _args "-I${i}")
  endforeach()
  foreach(d IN LISTS DEFINES)
    list(APPEND _args "-D${d}")
  endforeach()
  execute_process(COMMAND "${COMPILER}" ${_args} "${SOURCE}"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  set(_all "${_out}${_err}")
  if(_rc EQUAL 0)
    message(FATAL_ERROR "${SOURCE} compiled, but the pitfall is meant to be a compile error")
  endif()
  # (No list splitting: compiler output holds ';' and '[' that CMake lists mangle.)
  string(REGEX MATCH "[^\n]*error:[^\n]*" _first "${_all}")
  if(_first STREQUAL "")
    message(FATAL_ERROR "no line containing 'error:' in the output for ${SOURCE}:\n${_all}")
  endif()
  # path:line:column: error: ...  ->  error: ...
  string(FIND "${_first}" "error:" _at)
  string(SUBSTRING "${_first}" ${_at} -1 _now)
else()
  execute_process(COMMAND "${EXE}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  set(_all "${_out}${_err}")
  if(MODE STREQUAL "run-error")
    if(_rc EQUAL 0)
      message(FATAL_ERROR "${EXE} exited 0, but the pitfall is meant to end in a locus error:\n${_all}")
    endif()
    string(FIND "${_all}" "what():  " _at)
    if(_at EQUAL -1)
      message(FATAL_ERROR "${EXE} failed (${_rc}) without an uncaught exception's what():\n${_all}")
    endif()
    math(EXPR _at "${_at} + 9")
    string(SUBSTRING "${_all}" ${_at} -1 _rest)
    string(REGEX MATCH "^[^\n]*" _now "${_rest}")
  else()
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "${EXE} failed (${_rc}):\n${_all}")
    endif()
    string(REGEX REPLACE "[ \t\n]+$" "" _now "${_out}")
  endif()
endif()

# ---- what the README shows ------------------------------------------------------------
file(READ "${README}" _readme)
set(_open "<!-- ${_tag} ${_file} -->\n```text\n")
set(_close "```\n<!-- /${_tag} -->")
string(FIND "${_readme}" "${_open}" _b)
if(_b EQUAL -1)
  message(FATAL_ERROR "${README} has no block opening with:\n${_open}(the fence included)")
endif()
string(LENGTH "${_open}" _open_len)
math(EXPR _from "${_b} + ${_open_len}")
string(SUBSTRING "${_readme}" ${_from} -1 _tail)
string(FIND "${_tail}" "${_close}" _e)
if(_e EQUAL -1)
  message(FATAL_ERROR "${README}: the ${_tag} block for ${_file} is not closed by:\n${_close}")
endif()
string(SUBSTRING "${_tail}" 0 ${_e} _shown)
string(REGEX REPLACE "\n$" "" _shown "${_shown}")  # the line break before the closing fence

if(_shown STREQUAL _now)
  message(STATUS "${_file}: the README shows what it says now:\n${_now}")
  return()
endif()
if(UPDATE)
  string(SUBSTRING "${_readme}" 0 ${_from} _head)
  string(SUBSTRING "${_tail}" ${_e} -1 _rest)
  file(WRITE "${README}" "${_head}${_now}\n${_rest}")
  message(STATUS "${README}: ${_tag} block for ${_file} rewritten:\n${_now}")
  return()
endif()
message(FATAL_ERROR "${_file} and ${README} have drifted apart.\n--- the README shows:\n${_shown}\n"
                    "--- it says now:\n${_now}\n--- (examples/pitfalls/regenerate writes the new text in)\n"
                    "--- full output:\n${_all}")
