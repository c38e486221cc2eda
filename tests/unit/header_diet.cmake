# What including one public header drags in: runs the compiler's preprocessor
# (-M) on a file that includes only HEADER and fails when HEADER reaches more
# than MAX_HEADERS other idemkafka headers, more than MAX_PQXX_HEADERS of
# libpqxx's, or any of the FORBIDDEN standard headers. Prints what it found
# either way.
#
# -DCXX=<compiler> -DINCLUDE_DIRS=<dir;...> -DHEADER=idemkafka/consumer.hpp
# -DMAX_HEADERS=<n> -DMAX_PQXX_HEADERS=<n> -DFORBIDDEN=<header;...> -DWORK_DIR=<scratch dir>
foreach(var CXX INCLUDE_DIRS HEADER MAX_HEADERS MAX_PQXX_HEADERS WORK_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "header_diet.cmake: -D${var}=... is required")
  endif()
endforeach()

file(MAKE_DIRECTORY ${WORK_DIR})
string(MAKE_C_IDENTIFIER "${HEADER}" stem)
set(probe ${WORK_DIR}/${stem}.cpp)
file(WRITE ${probe} "#include <${HEADER}>\n")

set(include_args)
foreach(dir IN LISTS INCLUDE_DIRS)
  list(APPEND include_args -I${dir})
endforeach()
execute_process(COMMAND ${CXX} -std=c++17 -M ${include_args} ${probe}
  RESULT_VARIABLE rc OUTPUT_VARIABLE deps ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the preprocessor failed on a file including only <${HEADER}>:\n${err}")
endif()

# Make syntax: "probe.o: a.hpp b.hpp \<newline> c.hpp"; our paths have no spaces.
string(REPLACE "\\\n" " " deps "${deps}")
string(REGEX REPLACE "^[^:]*:" "" deps "${deps}")
string(REGEX REPLACE "[ \t\r\n]+" ";" deps "${deps}")

set(own)
set(pqxx)
set(forbidden_found)
foreach(path IN LISTS deps)
  if(path STREQUAL "" OR path STREQUAL probe)
    continue()
  endif()
  if(path MATCHES "/(idemkafka/.+)$")
    set(name ${CMAKE_MATCH_1})
    if(NOT name STREQUAL HEADER)
      list(APPEND own ${name})
    endif()
  elseif(path MATCHES "/(pqxx/.+)$")
    list(APPEND pqxx ${CMAKE_MATCH_1})
  endif()
  foreach(f IN LISTS FORBIDDEN)
    if(path MATCHES "/${f}$")
      list(APPEND forbidden_found "<${f}> (${path})")
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES own)
list(SORT own)
list(LENGTH own count)
string(REPLACE ";" ", " own_text "${own}")
message(STATUS "<${HEADER}> reaches ${count} other idemkafka headers (at most ${MAX_HEADERS}): ${own_text}")
list(REMOVE_DUPLICATES pqxx)
list(LENGTH pqxx pqxx_count)
message(STATUS "<${HEADER}> reaches ${pqxx_count} libpqxx headers (at most ${MAX_PQXX_HEADERS}; <pqxx/pqxx> is all of them)")

set(failures)
if(count GREATER MAX_HEADERS)
  list(APPEND failures "<${HEADER}> reaches ${count} other idemkafka headers, more than ${MAX_HEADERS}")
endif()
if(pqxx_count GREATER MAX_PQXX_HEADERS)
  list(APPEND failures "<${HEADER}> reaches ${pqxx_count} libpqxx headers, more than ${MAX_PQXX_HEADERS}: include the \
per-class libpqxx headers a declaration needs, not <pqxx/pqxx>")
endif()
if(forbidden_found)
  string(REPLACE ";" ", " text "${forbidden_found}")
  list(APPEND failures "<${HEADER}> reaches ${text}")
endif()
if(failures)
  string(REPLACE ";" "\n" text "${failures}")
  message(FATAL_ERROR "${text}")
endif()
