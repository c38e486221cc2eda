# Finds idemkafka's dependencies. Used by the build and by the installed
# idemkafkaConfig.cmake, so a consumer of the package finds them the same way.
# Debian ships only pkg-config files for librdkafka and libpqxx; a CMake config
# package is preferred where one exists (libpqxx 7.x installs one).
include(CMakeFindDependencyMacro)

find_dependency(Threads)
find_dependency(fmt CONFIG)

if(NOT TARGET idemkafka_dep::pqxx)
  find_package(libpqxx CONFIG QUIET)
  if(TARGET libpqxx::pqxx)
    add_library(idemkafka_dep::pqxx INTERFACE IMPORTED)
    set_target_properties(idemkafka_dep::pqxx PROPERTIES INTERFACE_LINK_LIBRARIES libpqxx::pqxx)
  else()
    find_package(PkgConfig REQUIRED)
    pkg_check_modules(IDEMKAFKA_PQXX REQUIRED IMPORTED_TARGET libpqxx)
    add_library(idemkafka_dep::pqxx INTERFACE IMPORTED)
    set_target_properties(idemkafka_dep::pqxx PROPERTIES INTERFACE_LINK_LIBRARIES PkgConfig::IDEMKAFKA_PQXX)
  endif()
endif()

# libpq itself: the library reads a connection's transaction status after user code.
if(NOT TARGET idemkafka_dep::pq)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(IDEMKAFKA_PQ REQUIRED IMPORTED_TARGET libpq)
  add_library(idemkafka_dep::pq INTERFACE IMPORTED)
  set_target_properties(idemkafka_dep::pq PROPERTIES INTERFACE_LINK_LIBRARIES PkgConfig::IDEMKAFKA_PQ)
endif()

if(NOT TARGET idemkafka_dep::rdkafka)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(IDEMKAFKA_RDKAFKA REQUIRED IMPORTED_TARGET rdkafka>=1.9)
  add_library(idemkafka_dep::rdkafka INTERFACE IMPORTED)
  set_target_properties(idemkafka_dep::rdkafka PROPERTIES INTERFACE_LINK_LIBRARIES PkgConfig::IDEMKAFKA_RDKAFKA)
endif()

# nlohmann_json parses librdkafka's statistics inside the library. It is
# header-only and linked as $<BUILD_INTERFACE:...>, so only idemkafka's own
# build looks for it, never a project that finds the installed package.
if(idemkafka_SOURCE_DIR AND NOT TARGET nlohmann_json::nlohmann_json)
  find_package(nlohmann_json 3 REQUIRED)
endif()

# xxHash fingerprints payloads inside the library (ConsumerConfig::payload_fingerprint).
# It is used header-only (XXH_INLINE_ALL), so only idemkafka's own build looks for
# it, never a project that finds the installed package.
if(idemkafka_SOURCE_DIR AND NOT IDEMKAFKA_XXHASH_INCLUDE_DIR)
  find_path(IDEMKAFKA_XXHASH_INCLUDE_DIR xxhash.h)
  if(NOT IDEMKAFKA_XXHASH_INCLUDE_DIR)
    message(FATAL_ERROR "xxhash.h not found: install libxxhash-dev (Debian, Ubuntu) or xxhash-devel (Fedora)")
  endif()
endif()
