# Fails the build when a doctest case name would break CTest's discovery
# (doctest_discover_tests reads the names as a CMake list): a ';' splits one case into
# two that match nothing, and an unbalanced '[' or ']' glues the following names into
# one add_test line ("add_test called with incorrect number of arguments", and CTest
# runs nothing at all). Input: EXE, the test executable.
execute_process(COMMAND "${EXE}" --list-test-cases --no-version
  OUTPUT_VARIABLE _out RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --list-test-cases failed (${_rc})")
endif()
string(REPLACE ";" "<SEMICOLON>" _out "${_out}")
string(REPLACE "[" "<OPEN>" _out "${_out}")
string(REPLACE "]" "<CLOSE>" _out "${_out}")
string(REPLACE "\n" ";" _lines "${_out}")
set(_bad "")
foreach(line IN LISTS _lines)
  if(line MATCHES "<SEMICOLON>")
    list(APPEND _bad "${line}")
    continue()
  endif()
  string(REGEX MATCHALL "<OPEN>" _o "${line}")
  string(REGEX MATCHALL "<CLOSE>" _c "${line}")
  list(LENGTH _o _no)
  list(LENGTH _c _nc)
  if(NOT _no EQUAL _nc)
    list(APPEND _bad "${line}")
  endif()
endforeach()
if(_bad)
  list(JOIN _bad "\n  " _text)
  string(REPLACE "<SEMICOLON>" ";" _text "${_text}")
  string(REPLACE "<OPEN>" "[" _text "${_text}")
  string(REPLACE "<CLOSE>" "]" _text "${_text}")
  message(FATAL_ERROR "locus: test case names CTest cannot run (a ';', or unbalanced '[' ']': "
                      "doctest_discover_tests reads names as a CMake list); rename:\n  ${_text}")
endif()
