# locus_unity_sources(OUT SOURCES PCH_HEADERS GROUPS DIR PREFIX EXT): writes the grouped
# translation units of LOCUS_TEST_UNITY (tests/CMakeLists.txt), DIR/PREFIX_N.EXT, and sets
# OUT to what the target compiles: the group files, and the files that are compiled alone.
#
# A group file includes, at file scope and in the order the files first name them, every
# header its files include outside #if, then each file inside a namespace of its own:
#
#   #include <locus/locus.hpp>      // (and the others)
#   namespace locus_unity_test_a { #include "/.../test_a.cpp" }
#   namespace locus_unity_test_b { #include "/.../test_b.cpp" }
#
# so each file's own #include lines find their headers already included and add nothing
# inside the namespace. Compiled alone instead: a file with #define or #undef (a macro
# would reach the next file, and one defined before an include changes that header), and
# one that includes under #if a header other than those of PCH_HEADERS (the precompiled
# header holds those: included again, they add nothing), and one with a #pragma other than
# omp or once (a diagnostic pragma would reach the next file). A group makes visible to
# each file the headers its group-mates include: LOCUS_TEST_UNITY=OFF compiles every file
# alone (the check that each includes what it uses). Files go to GROUPS groups by
# size, largest first into the smallest group, so the groups take about equal time.
function(locus_unity_sources out sources pch_headers groups dir prefix ext)
  if(NOT groups MATCHES "^[1-9][0-9]*$")
    message(FATAL_ERROR "locus: LOCUS_TEST_UNITY_GROUPS must be a positive number, not '${groups}'")
  endif()
  # The grouping reads the files: an edit (a new #define or #include) re-runs it.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${sources})
  set(_alone "")
  set(_keyed "")
  foreach(src IN LISTS sources)
    file(STRINGS "${src}" _pp REGEX "^[ \t]*#" ENCODING UTF-8)
    set(_depth 0)
    set(_ok TRUE)
    foreach(l IN LISTS _pp)
      if(l MATCHES "^[ \t]*#[ \t]*if")
        math(EXPR _depth "${_depth} + 1")
      elseif(l MATCHES "^[ \t]*#[ \t]*endif")
        math(EXPR _depth "${_depth} - 1")
      elseif(l MATCHES "^[ \t]*#[ \t]*(define|undef)")
        set(_ok FALSE)
      elseif(l MATCHES "^[ \t]*#[ \t]*pragma" AND NOT l MATCHES "^[ \t]*#[ \t]*pragma[ \t]+(omp|once)")
        set(_ok FALSE)  # a diagnostic pragma would reach the next file
      elseif(l MATCHES "^[ \t]*#[ \t]*include" AND _depth GREATER 0)
        if(NOT l MATCHES "^[ \t]*#[ \t]*include[ \t]*<([^>]+)>")
          set(_ok FALSE)
        elseif(NOT CMAKE_MATCH_1 IN_LIST pch_headers)
          set(_ok FALSE)
        endif()
      endif()
    endforeach()
    if(_ok)
      file(SIZE "${src}" _size)
      string(LENGTH "${_size}" _len)
      math(EXPR _pad "12 - ${_len}")
      string(REPEAT "0" ${_pad} _zeros)
      list(APPEND _keyed "${_zeros}${_size}|${src}")
    else()
      list(APPEND _alone "${src}")
    endif()
  endforeach()
  list(SORT _keyed ORDER DESCENDING)

  # Largest first into the group with the fewest bytes so far.
  math(EXPR _last "${groups} - 1")
  foreach(g RANGE ${_last})
    set(_bytes_${g} 0)
    set(_files_${g} "")
  endforeach()
  foreach(k IN LISTS _keyed)
    string(REGEX MATCH "^0*([0-9]+)[|](.*)$" _m "${k}")
    set(_size "${CMAKE_MATCH_1}")
    set(_src "${CMAKE_MATCH_2}")
    set(_best 0)
    foreach(g RANGE ${_last})
      if(_bytes_${g} LESS _bytes_${_best})
        set(_best ${g})
      endif()
    endforeach()
    math(EXPR _bytes_${_best} "${_bytes_${_best}} + ${_size}")
    list(APPEND _files_${_best} "${_src}")
  endforeach()

  set(_units "")
  foreach(g RANGE ${_last})
    if(NOT _files_${g})
      continue()
    endif()
    list(SORT _files_${g})
    set(_includes "")
    set(_body "")
    foreach(src IN LISTS _files_${g})
      file(STRINGS "${src}" _pp REGEX "^[ \t]*#" ENCODING UTF-8)
      set(_depth 0)
      foreach(l IN LISTS _pp)
        if(l MATCHES "^[ \t]*#[ \t]*if")
          math(EXPR _depth "${_depth} + 1")
        elseif(l MATCHES "^[ \t]*#[ \t]*endif")
          math(EXPR _depth "${_depth} - 1")
        elseif(_depth EQUAL 0 AND l MATCHES "^[ \t]*#[ \t]*include[ \t]*(<[^>]+>|\"[^\"]+\")")
          set(_inc "${CMAKE_MATCH_1}")
          if(_inc MATCHES "^\"(.*)\"$")  # found beside the file first: then by that path
            get_filename_component(_dir "${src}" DIRECTORY)
            get_filename_component(_abs "${CMAKE_MATCH_1}" ABSOLUTE BASE_DIR "${_dir}")
            if(EXISTS "${_abs}")
              set(_inc "\"${_abs}\"")
            endif()
          endif()
          if(NOT _inc IN_LIST _includes)
            list(APPEND _includes "${_inc}")
          endif()
        endif()
      endforeach()
      get_filename_component(_name "${src}" NAME_WE)
      string(MAKE_C_IDENTIFIER "locus_unity_${_name}" _ns)
      string(APPEND _body "namespace ${_ns} {\n#include \"${src}\"\n}  // namespace ${_ns}\n")
    endforeach()
    set(_text "// GENERATED by tests/tools/unity.cmake (LOCUS_TEST_UNITY): these test files as one unit.\n")
    foreach(i IN LISTS _includes)
      string(APPEND _text "#include ${i}\n")
    endforeach()
    string(APPEND _text "${_body}")
    set(_unit "${dir}/${prefix}_${g}.${ext}")
    set(_old "")
    if(EXISTS "${_unit}")
      file(READ "${_unit}" _old)
    endif()
    if(NOT _old STREQUAL _text)  # rewritten only when it changes: no rebuild otherwise
      file(WRITE "${_unit}" "${_text}")
    endif()
    list(APPEND _units "${_unit}")
  endforeach()
  set(${out} ${_units} ${_alone} PARENT_SCOPE)
endfunction()
