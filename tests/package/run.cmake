# Installs the built library into a temporary prefix and builds a separate
# project against it with find_package(idemkafka CONFIG REQUIRED).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "package test step failed (${rc}): ${cmd}")
  endif()
endfunction()

step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f lib/cmake/idemkafka/idemkafkaConfig.cmake lib/cmake/idemkafka/idemkafkaConfigVersion.cmake
          include/idemkafka/consumer.hpp)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
file(GLOB pc ${prefix}/lib*/pkgconfig/idemkafka.pc ${prefix}/lib/*/pkgconfig/idemkafka.pc)
if(NOT pc)
  message(FATAL_ERROR "idemkafka.pc not installed")
endif()
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/project -B ${WORK_DIR}/build
     -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j2)
step(${WORK_DIR}/build/package_smoke)
