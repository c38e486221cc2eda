# Builds the libFuzzer targets with clang++ and runs each one for a bounded time.
#
#   cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch dir> [-DFUZZ_SECONDS=20] [-DFUZZ_CXX=clang++]
#         [-DFUZZ_TARGETS=event_id;billing_decode;cloud_event] [-DNLOHMANN_INCLUDE=<dir>] -P tests/fuzz/run.cmake
#
# clang++ is used whatever compiler builds the rest of the project: libFuzzer and its
# instrumentation only exist there. FUZZ_CXX (or the environment variable
# IDEMKAFKA_FUZZ_CXX) names another one. A missing clang++ is an error, not a skip: a
# green run must mean the fuzzers ran.
cmake_minimum_required(VERSION 3.16)

foreach(var SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake needs -D${var}=...")
  endif()
endforeach()
if(NOT FUZZ_SECONDS)
  set(FUZZ_SECONDS 20)
endif()
if(NOT FUZZ_TARGETS)
  set(FUZZ_TARGETS event_id billing_decode cloud_event)
endif()
set(fuzz_dir ${SOURCE_DIR}/tests/fuzz)

if(NOT FUZZ_CXX AND NOT "$ENV{IDEMKAFKA_FUZZ_CXX}" STREQUAL "")
  set(FUZZ_CXX "$ENV{IDEMKAFKA_FUZZ_CXX}")
endif()
if(NOT FUZZ_CXX)
  # A result variable of its own: an empty -DFUZZ_CXX= would otherwise stop the search.
  find_program(found_clangxx NAMES clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14)
  if(found_clangxx)
    set(FUZZ_CXX ${found_clangxx})
  endif()
endif()
if(NOT FUZZ_CXX)
  message(FATAL_ERROR
    "fuzz: clang++ not found. The fuzz test builds its libFuzzer targets with clang++, "
    "independently of the compiler of the main build. Install clang (Debian: "
    "apt-get install clang; scripts/lib.sh installs it) or point IDEMKAFKA_FUZZ_CXX at a clang++.")
endif()
execute_process(COMMAND ${FUZZ_CXX} --version OUTPUT_VARIABLE cxx_version RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0 OR NOT cxx_version MATCHES "clang")
  message(FATAL_ERROR "fuzz: ${FUZZ_CXX} is not a working clang++ (libFuzzer needs clang)")
endif()
string(REGEX REPLACE "\n.*" "" cxx_version "${cxx_version}")
message(STATUS "fuzz: ${FUZZ_CXX} (${cxx_version}), ${FUZZ_SECONDS} s per target")

# -O1 keeps the runs fast enough to matter while leaving the stack traces usable;
# -fno-sanitize-recover turns every UBSan finding into a crash libFuzzer records.
set(flags -std=c++17 -O1 -g -fno-omit-frame-pointer
          -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
          -I${SOURCE_DIR}/include -I${SOURCE_DIR}/src -I${SOURCE_DIR}/examples/billing -I${fuzz_dir})
# An explicit -isystem /usr/include would break libstdc++'s #include_next.
if(NLOHMANN_INCLUDE AND NOT NLOHMANN_INCLUDE MATCHES "^/usr(/local)?/include/?$")
  list(APPEND flags -isystem ${NLOHMANN_INCLUDE})
endif()

set(event_id_sources ${SOURCE_DIR}/src/api/event_id.cpp ${fuzz_dir}/fuzz_event_id.cpp)
# Long enough to reach the abbreviation of over-long ids in error messages.
set(event_id_options -max_len=128)
set(billing_decode_sources ${SOURCE_DIR}/src/api/event_id.cpp ${SOURCE_DIR}/examples/billing/order_confirmed.cpp
                           ${fuzz_dir}/fuzz_billing_decode.cpp)
set(billing_decode_options -max_len=4096 -dict=${fuzz_dir}/billing_decode.dict)
set(cloud_event_sources ${SOURCE_DIR}/src/api/event_id.cpp ${SOURCE_DIR}/src/api/cloud_events.cpp
                        ${fuzz_dir}/fuzz_cloud_event.cpp)
set(cloud_event_options -max_len=4096 -dict=${fuzz_dir}/cloud_event.dict)
# The private headers a target's sources include, for the staleness check.
set(cloud_event_depends ${SOURCE_DIR}/src/core/sha1.hpp ${SOURCE_DIR}/src/api/record_headers.hpp)

file(GLOB headers ${SOURCE_DIR}/include/idemkafka/*.hpp ${SOURCE_DIR}/examples/billing/*.hpp ${fuzz_dir}/*.hpp)

# UBSan prints no stack by default, and the report alone rarely says which input path led there.
set(ENV{UBSAN_OPTIONS} "print_stacktrace=1:$ENV{UBSAN_OPTIONS}")

# Debian's clang only recommends the package with the sanitizer and libFuzzer runtimes,
# so a clang installed without recommends compiles but cannot link a fuzzer. Saying
# so beats a page of linker errors.
function(probe_runtime)
  get_property(done GLOBAL PROPERTY idemkafka_fuzz_probed)
  if(done)
    return()
  endif()
  set(probe ${WORK_DIR}/probe)
  file(WRITE ${probe}.cpp
    "#include <cstddef>\n#include <cstdint>\n"
    "extern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
  execute_process(COMMAND ${FUZZ_CXX} -fsanitize=fuzzer,address,undefined ${probe}.cpp -o ${probe}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  file(REMOVE ${probe} ${probe}.cpp)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR
      "fuzz: ${FUZZ_CXX} cannot link -fsanitize=fuzzer,address,undefined, so the libFuzzer/sanitizer "
      "runtime is missing (Debian: apt-get install libclang-rt-dev, or libclang-rt-<version>-dev):\n${out}")
  endif()
  set_property(GLOBAL PROPERTY idemkafka_fuzz_probed TRUE)
endfunction()

# The billing target takes half a minute to compile under the sanitizers, so a binary
# is reused while it is newer than everything it is built from and the command is unchanged.
function(build_fuzzer name)
  set(exe ${WORK_DIR}/fuzz_${name})
  set(command ${FUZZ_CXX} ${flags} ${${name}_sources} -o ${exe})
  string(REPLACE ";" " " command_line "${command}")
  set(stamp ${exe}.command)
  set(stale TRUE)
  if(EXISTS ${exe} AND EXISTS ${stamp})
    file(READ ${stamp} previous)
    if(previous STREQUAL "${command_line}\n${cxx_version}")
      set(stale FALSE)
      foreach(dep ${${name}_sources} ${${name}_depends} ${headers} ${CMAKE_CURRENT_LIST_FILE})
        if("${dep}" IS_NEWER_THAN "${exe}")
          set(stale TRUE)
        endif()
      endforeach()
    endif()
  endif()
  if(NOT stale)
    message(STATUS "fuzz: ${name}: up to date")
    return()
  endif()
  probe_runtime()
  message(STATUS "fuzz: building ${name}")
  file(REMOVE ${exe} ${stamp})
  execute_process(COMMAND ${command} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fuzz: building ${name} failed (${rc}):\n  ${command_line}")
  endif()
  file(WRITE ${stamp} "${command_line}\n${cxx_version}")
endfunction()

function(run_fuzzer name)
  set(exe ${WORK_DIR}/fuzz_${name})
  # New inputs go to the first directory only: the seeds in the tree stay as they are,
  # and what a run discovers is kept in the build tree for the next one.
  set(corpus ${WORK_DIR}/corpus/${name})
  set(artifacts ${WORK_DIR}/artifacts/${name})
  file(MAKE_DIRECTORY ${corpus})
  file(REMOVE_RECURSE ${artifacts})
  file(MAKE_DIRECTORY ${artifacts})
  message(STATUS "fuzz: running ${name} for ${FUZZ_SECONDS} s")
  execute_process(
    COMMAND ${exe} -max_total_time=${FUZZ_SECONDS} -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -print_funcs=0
            -artifact_prefix=${artifacts}/ ${${name}_options} ${corpus} ${fuzz_dir}/corpus/${name}
    RESULT_VARIABLE rc)
  if(rc EQUAL 0)
    return()
  endif()
  file(GLOB found ${artifacts}/*)
  set(report "")
  foreach(artifact ${found})
    file(READ ${artifact} bytes HEX LIMIT 512)
    string(APPEND report "\n  ${artifact}\n    hex: ${bytes}\n    reproduce: ${exe} ${artifact}")
  endforeach()
  if(NOT report)
    set(report "\n  (no artifact written; see the output above)")
  endif()
  set(failures "${failures}\nfuzz: ${name} failed (${rc}):${report}" PARENT_SCOPE)
endfunction()

file(MAKE_DIRECTORY ${WORK_DIR})
foreach(name ${FUZZ_TARGETS})
  if(NOT DEFINED ${name}_sources)
    message(FATAL_ERROR "fuzz: unknown target '${name}' (known: event_id billing_decode cloud_event)")
  endif()
  build_fuzzer(${name})
endforeach()
# One target's crash must not hide another's: all of them run before the verdict.
set(failures "")
foreach(name ${FUZZ_TARGETS})
  run_fuzzer(${name})
endforeach()
if(failures)
  message(FATAL_ERROR "${failures}")
endif()
