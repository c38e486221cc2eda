# Switches for the parts of the build that need packages beyond the library's own
# dependencies (the tests need Catch2, the API reference Doxygen, the billing example's
# /metrics endpoint cpp-httplib). Each switch is AUTO, ON or OFF:
#   AUTO  built when what it needs is found; otherwise skipped, with one status line that
#         names the missing package
#   ON    required: a missing package stops the configure with an error naming it (what
#         -D<switch>=ON on the command line asks for, and what scripts/test.sh passes, so
#         that CI fails loudly instead of skipping)
#   OFF   not built
# A tri-state rather than option(): a cached ON cannot tell "asked for" from "defaulted",
# so a first configure without Catch2 followed by -DIDEMKAFKA_BUILD_TESTS=ON would skip
# silently.
include_guard(GLOBAL)

# idemkafka_part_option(<switch> <default> <doc>): declares the cache entry. A normal
# variable of that name set by a parent project wins, as it does for option().
function(idemkafka_part_option name default doc)
  if(DEFINED ${name} AND NOT DEFINED CACHE{${name}})
    set(default ${${name}})
  endif()
  set(${name} ${default} CACHE STRING "${doc} (AUTO, ON or OFF)")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
endfunction()

# idemkafka_part_resolve(<switch> <what> <found> <missing>): sets <switch> to ON or OFF in
# the caller's scope (a normal variable over the cache entry), so that if(<switch>) reads
# as "is built" from there on. <found> is the find result (e.g. "${Catch2_FOUND}"),
# <missing> names the package to install.
function(idemkafka_part_resolve name what found missing)
  string(TOUPPER "${${name}}" mode)
  if(mode STREQUAL "AUTO")
    if(found)
      set(${name} ON PARENT_SCOPE)
    else()
      message(STATUS "${what}: skipped, ${missing} not found (-D${name}=ON makes it required)")
      set(${name} OFF PARENT_SCOPE)
    endif()
  elseif(${name})
    if(NOT found)
      message(FATAL_ERROR "${what}: ${missing} not found, and ${name}=${${name}} requires it. "
                          "Install it, or configure with -D${name}=AUTO (build without it) or OFF.")
    endif()
    set(${name} ON PARENT_SCOPE)
  else()
    set(${name} OFF PARENT_SCOPE)
  endif()
endfunction()
