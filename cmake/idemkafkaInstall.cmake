include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(IDEMKAFKA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/idemkafka)

install(TARGETS idemkafka EXPORT idemkafkaTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/idemkafka DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/idemkafka/features.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/idemkafka)
install(EXPORT idemkafkaTargets NAMESPACE idemkafka:: DESTINATION ${IDEMKAFKA_CMAKE_DIR})

# The `testing` component: its own export set, loaded by idemkafkaConfig.cmake
# only when find_package() asks for COMPONENTS testing.
install(TARGETS idemkafka_testing EXPORT idemkafkaTestingTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT idemkafkaTestingTargets NAMESPACE idemkafka:: DESTINATION ${IDEMKAFKA_CMAKE_DIR})

configure_package_config_file(cmake/idemkafkaConfig.cmake.in
  ${PROJECT_BINARY_DIR}/idemkafkaConfig.cmake
  INSTALL_DESTINATION ${IDEMKAFKA_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/idemkafkaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/idemkafkaConfig.cmake
  ${PROJECT_BINARY_DIR}/idemkafkaConfigVersion.cmake
  cmake/idemkafkaDependencies.cmake
  DESTINATION ${IDEMKAFKA_CMAKE_DIR})

# export.hpp: a static library's users define IDEMKAFKA_STATIC (it matters on Windows only).
set(IDEMKAFKA_PC_CFLAGS "")
if(IDEMKAFKA_LIBRARY_TYPE STREQUAL "STATIC_LIBRARY")
  set(IDEMKAFKA_PC_CFLAGS " -DIDEMKAFKA_STATIC")
endif()
configure_file(cmake/idemkafka.pc.in ${PROJECT_BINARY_DIR}/idemkafka.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/idemkafka.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
