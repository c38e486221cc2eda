# Packaging checks, run in this order; a failure names its check:
#   install           cmake --install of the build into a temporary prefix, expected files there
#   find_package      tests/package/project: find_package(idemkafka CONFIG REQUIRED), built and run
#   cxx20             the same project with CMAKE_CXX_STANDARD 20: the package asks for C++17 as a
#                     minimum only, the consumer's standard reaches the compiler (checked in main.cpp)
#   readme            the README's <!-- example:minimal --> block compiles and links against the prefix
#   testing           tests/package/testing: find_package(idemkafka CONFIG REQUIRED COMPONENTS testing),
#                     a kit-based handler test (TestBroker, TestDatabase) and the
#                     <!-- example:harness --> block of docs/testing-handlers.md (HandlerHarness)
#                     built and run; and
#                     tests/package/unknown_component: an unknown component fails find_package by name
#   billing           examples/billing built on its own against the prefix (with and without
#                     the /metrics endpoint), --help of both programs runs, its kit-based
#                     tests (examples/billing/tests) run
#   add_subdirectory  tests/package/subproject: idemkafka from source creates only its library
#                     target, a program linked to idemkafka::idemkafka runs
#   fetchcontent      the same through FetchContent from the local source tree
#   minimal           the source tree configured at top level as a user without Catch2, cpp-httplib
#                     and Doxygen would (hidden with CMAKE_DISABLE_FIND_PACKAGE_*): the configure
#                     succeeds and names each skipped part's package in one status line; asking for
#                     such a part (-D...=ON) fails naming its package; then the library and its test
#                     kit build (tools, examples and benchmark off), install into a prefix of their
#                     own, and tests/package/project builds and runs against it
#
# The checks reuse what they can so the label stays quick: the build without the /metrics
# endpoint reconfigures the billing build (only the listener recompiles), and fetchcontent
# reconfigures the add_subdirectory build tree, whose idemkafka binary directory it shares
# (same sources, same flags: the library's objects are up to date, configure and link are new).
# `minimal` builds in that idemkafka binary directory too, as a top-level project with the same
# flags: its configure and install are new, the library's objects are the sub-project's.
#
# -DSOURCE_DIR, -DBUILD_DIR (an idemkafka build with install rules), -DWORK_DIR (scratch, wiped)
# are required; -DGENERATOR and -DCXX_COMPILER make the consumers use the build's own;
# -DCHECKS="readme;billing" runs a subset (install always runs when a later check needs it).
foreach(var SOURCE_DIR BUILD_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CHECKS)
  set(CHECKS install find_package cxx20 readme testing billing add_subdirectory fetchcontent minimal)
endif()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

set(configure_args)
if(GENERATOR)
  list(APPEND configure_args -G ${GENERATOR})
endif()
if(CXX_COMPILER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()

set(current_check "")
set(step_number 0)

function(fail what)
  message(FATAL_ERROR "package check '${current_check}' FAILED: ${what}")
endfunction()

# Runs one command; on failure prints its output and names the check.
function(step)
  math(EXPR n "${step_number} + 1")
  set(step_number ${n} PARENT_SCOPE)
  set(log ${WORK_DIR}/logs/${current_check}-${n}.log)
  string(REPLACE ";" " " cmd "${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  file(WRITE ${log} "$ ${cmd}\n${out}")
  if(NOT rc EQUAL 0)
    message("${out}")
    fail("exit ${rc} from: ${cmd}\n(output above, also in ${log})")
  endif()
endfunction()

# Configures and builds a consumer project: build_project(<name> <source dir> [-D... ...]).
# Builds into ${WORK_DIR}/<name>.
function(build_project name source)
  step(${CMAKE_COMMAND} -S ${source} -B ${WORK_DIR}/${name} ${configure_args} ${ARGN})
  step(${CMAKE_COMMAND} --build ${WORK_DIR}/${name} -j2)
  set(step_number ${step_number} PARENT_SCOPE)
endfunction()

# The consumer in ${WORK_DIR}/<name> must have found the package in the prefix (or in the
# one given), not elsewhere: expect_from_prefix(<name> [<prefix>]).
function(expect_from_prefix name)
  set(where ${prefix})
  if(ARGC GREATER 1)
    set(where ${ARGV1})
  endif()
  file(STRINGS ${WORK_DIR}/${name}/CMakeCache.txt dir REGEX "^idemkafka_DIR:")
  string(REGEX REPLACE "^[^=]*=" "" dir "${dir}")
  string(FIND "${dir}" "${where}/" at)
  if(NOT at EQUAL 0)
    fail("find_package(idemkafka) used '${dir}', not the package installed in ${where}")
  endif()
endfunction()

# Writes the ```cpp block between <!-- example:NAME --> and <!-- /example:NAME --> in the
# Markdown page PAGE (relative to the source tree) to OUT: doc_example(<page> <name> <out>).
function(doc_example page name out)
  set(begin_marker "<!-- example:${name} -->")
  set(end_marker "<!-- /example:${name} -->")
  file(READ ${SOURCE_DIR}/${page} readme)
  string(FIND "${readme}" "${begin_marker}" b)
  string(FIND "${readme}" "${end_marker}" e)
  if(b EQUAL -1 OR e EQUAL -1 OR e LESS b)
    fail("${page} has no '${begin_marker}' ... '${end_marker}' pair around the ${name} example")
  endif()
  math(EXPR len "${e} - ${b}")
  string(SUBSTRING "${readme}" ${b} ${len} block)
  string(FIND "${block}" "```cpp\n" open)
  string(FIND "${block}" "\n```" close REVERSE)
  if(open EQUAL -1 OR close EQUAL -1 OR close LESS open)
    fail("${page}: no ```cpp block between '${begin_marker}' and '${end_marker}'")
  endif()
  math(EXPR from "${open} + 7")
  math(EXPR len "${close} - ${from} + 1")
  string(SUBSTRING "${block}" ${from} ${len} code)
  file(WRITE ${out} "${code}")
endfunction()

function(begin_check name)
  set(current_check ${name} PARENT_SCOPE)
  set(step_number 0 PARENT_SCOPE)
  string(TIMESTAMP t "%s")
  set(check_started ${t} PARENT_SCOPE)
endfunction()

function(end_check)
  string(TIMESTAMP t "%s")
  math(EXPR s "${t} - ${check_started}")
  message(STATUS "package check '${current_check}': ok (${s} s)")
endfunction()

function(wanted name out)
  list(FIND CHECKS ${name} i)
  if(i EQUAL -1)
    set(${out} FALSE PARENT_SCOPE)
  else()
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

set(needs_prefix FALSE)
foreach(c install find_package cxx20 readme testing billing)
  wanted(${c} w)
  if(w)
    set(needs_prefix TRUE)
  endif()
endforeach()

if(needs_prefix)
  begin_check(install)
  step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
  foreach(f lib/cmake/idemkafka/idemkafkaConfig.cmake lib/cmake/idemkafka/idemkafkaConfigVersion.cmake
            lib/cmake/idemkafka/idemkafkaTestingTargets.cmake
            include/idemkafka/consumer.hpp include/idemkafka/testing.hpp)
    if(NOT EXISTS ${prefix}/${f})
      fail("not installed: ${f}")
    endif()
  endforeach()
  file(GLOB pc ${prefix}/lib*/pkgconfig/idemkafka.pc ${prefix}/lib/*/pkgconfig/idemkafka.pc)
  if(NOT pc)
    fail("idemkafka.pc not installed")
  endif()
  end_check()
endif()

wanted(find_package w)
if(w)
  begin_check(find_package)
  build_project(find_package ${SOURCE_DIR}/tests/package/project
                -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
  expect_from_prefix(find_package)
  step(${WORK_DIR}/find_package/package_smoke)
  end_check()
endif()

wanted(cxx20 w)
if(w)
  begin_check(cxx20)
  build_project(cxx20 ${SOURCE_DIR}/tests/package/project
                -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=20)
  expect_from_prefix(cxx20)
  step(${WORK_DIR}/cxx20/package_smoke)
  end_check()
endif()

wanted(readme w)
if(w)
  begin_check(readme)
  doc_example(README.md minimal ${WORK_DIR}/readme-src/minimal.cpp)
  build_project(readme ${SOURCE_DIR}/tests/package/readme
                -DCMAKE_PREFIX_PATH=${prefix} -DEXAMPLE_SOURCE=${WORK_DIR}/readme-src/minimal.cpp)
  expect_from_prefix(readme)
  end_check()
endif()

wanted(testing w)
if(w)
  begin_check(testing)
  # IDEMKAFKA_TEST_PG from the environment when set (CI), else the kit starts its own cluster.
  doc_example(docs/testing-handlers.md harness ${WORK_DIR}/readme-src/harness.cpp)
  build_project(testing ${SOURCE_DIR}/tests/package/testing -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
                -DHARNESS_EXAMPLE=${WORK_DIR}/readme-src/harness.cpp)
  expect_from_prefix(testing)
  step(${WORK_DIR}/testing/kit_smoke)
  step(${WORK_DIR}/testing/readme_harness)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/unknown_component
                          -B ${WORK_DIR}/unknown_component ${configure_args} -DCMAKE_PREFIX_PATH=${prefix}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0 OR NOT out MATCHES "idemkafka has no component 'no_such_component'")
    fail("find_package(idemkafka COMPONENTS no_such_component) did not fail naming it (exit ${rc}):\n${out}")
  endif()
  end_check()
endif()

wanted(billing w)
if(w)
  begin_check(billing)
  build_project(billing ${SOURCE_DIR}/examples/billing -DCMAKE_PREFIX_PATH=${prefix})
  expect_from_prefix(billing)
  step(${WORK_DIR}/billing/billing-listener --help)
  step(${WORK_DIR}/billing/billing-producer --help)
  # Its tests, written with the installed kit (IDEMKAFKA_TEST_PG, else a throwaway cluster).
  if(NOT EXISTS ${WORK_DIR}/billing/tests/billing-tests)
    fail("examples/billing built against the prefix did not build its tests (idemkafka::testing or Catch2 not found)")
  endif()
  step(${WORK_DIR}/billing/tests/billing-tests)
  # Without cpp-httplib the listener still builds and refuses --metrics-port with a reason.
  build_project(billing ${SOURCE_DIR}/examples/billing -DIDEMKAFKA_BILLING_METRICS=OFF)
  execute_process(COMMAND ${WORK_DIR}/billing/billing-listener --metrics-port 9100
                          --brokers localhost:1 --postgres "host=/nonexistent"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0 OR NOT out MATCHES "without cpp-httplib")
    fail("billing-listener built without cpp-httplib accepted --metrics-port (exit ${rc}):\n${out}")
  endif()
  end_check()
endif()

wanted(add_subdirectory w)
if(w)
  begin_check(add_subdirectory)
  # No build type: -O0 keeps this second compile of the library short.
  build_project(subproject ${SOURCE_DIR}/tests/package/subproject -DIDEMKAFKA_SOURCE_DIR=${SOURCE_DIR}
                -DIDEMKAFKA_VIA=add_subdirectory)
  step(${WORK_DIR}/subproject/package_smoke)
  end_check()
endif()

wanted(fetchcontent w)
if(w)
  begin_check(fetchcontent)
  file(REMOVE ${WORK_DIR}/subproject/package_smoke)
  build_project(subproject ${SOURCE_DIR}/tests/package/subproject -DIDEMKAFKA_SOURCE_DIR=${SOURCE_DIR}
                -DIDEMKAFKA_VIA=fetchcontent)
  step(${WORK_DIR}/subproject/package_smoke)
  end_check()
endif()

wanted(minimal w)
if(w)
  begin_check(minimal)
  set(tree ${WORK_DIR}/minimal)
  set(minimal_prefix ${WORK_DIR}/minimal-prefix)
  # Everything optional out of sight; what stays is librdkafka, libpqxx, libpq, fmt,
  # nlohmann_json (and pkg-config, which finds the first three on Debian).
  set(hidden -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON -DCMAKE_DISABLE_FIND_PACKAGE_httplib=ON
             -DCMAKE_DISABLE_FIND_PACKAGE_Doxygen=ON)
  # The configure a user runs, with the defaults (configure only).
  step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${tree} ${configure_args} ${hidden})
  file(READ ${WORK_DIR}/logs/minimal-${step_number}.log out)
  foreach(line
      "idemkafka tests: skipped, Catch2"
      "idemkafka API reference \\(docs target\\): skipped, Doxygen"
      "billing-listener's /metrics endpoint: skipped, cpp-httplib"
      "billing example's tests: skipped, Catch2")
    if(NOT out MATCHES "-- ${line}[^\n]*not found")
      fail("the configure with the optional packages hidden did not say '${line} ... not found':\n${out}")
    endif()
  endforeach()
  # Asked for explicitly, a part whose package is hidden stops the configure, naming it. The
  # -D of a failed configure stays in the cache: the next one puts the part back to AUTO.
  set(back "")
  foreach(ask "IDEMKAFKA_BUILD_TESTS;Catch2" "IDEMKAFKA_BUILD_DOCS;Doxygen" "IDEMKAFKA_BILLING_METRICS;cpp-httplib")
    list(GET ask 0 part)
    list(GET ask 1 package)
    execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${tree} ${back} -D${part}=ON
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(rc EQUAL 0 OR NOT out MATCHES "CMake Error" OR NOT out MATCHES "${package}" OR NOT out MATCHES "${part}=ON")
      fail("-D${part}=ON with ${package} hidden did not fail naming ${package} (exit ${rc}):\n${out}")
    endif()
    set(back -D${part}=AUTO)
  endforeach()
  # The build: the library and its test kit (tools, examples and the benchmark need nothing
  # more, and the build under test has them). It goes into the idemkafka binary directory of
  # the add_subdirectory check's tree, whose objects were compiled from the same sources with
  # the same flags (no build type, no -Werror: the build under test has the warnings), so only
  # configure, archive and install are new; without that check it compiles them.
  set(build_tree ${WORK_DIR}/subproject/idemkafka)
  step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${build_tree} ${configure_args} ${hidden} -DCMAKE_BUILD_TYPE=None
       -DIDEMKAFKA_WERROR=OFF -DIDEMKAFKA_BUILD_TOOLS=OFF -DIDEMKAFKA_BUILD_EXAMPLES=OFF -DIDEMKAFKA_BUILD_BENCH=OFF)
  step(${CMAKE_COMMAND} --build ${build_tree} -j2)
  step(${CMAKE_COMMAND} --install ${build_tree} --prefix ${minimal_prefix})
  foreach(f lib/cmake/idemkafka/idemkafkaConfig.cmake lib/cmake/idemkafka/idemkafkaTestingTargets.cmake
            include/idemkafka/consumer.hpp include/idemkafka/testing.hpp)
    if(NOT EXISTS ${minimal_prefix}/${f})
      fail("not installed from the build with only the library's dependencies: ${f}")
    endif()
  endforeach()
  build_project(minimal_consumer ${SOURCE_DIR}/tests/package/project -DCMAKE_PREFIX_PATH=${minimal_prefix})
  expect_from_prefix(minimal_consumer ${minimal_prefix})
  step(${WORK_DIR}/minimal_consumer/package_smoke)
  end_check()
endif()
