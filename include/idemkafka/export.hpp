#pragma once
/// \file
/// IDEMKAFKA_API marks what the library exports. The library is compiled with
/// hidden visibility, so everything else (its internals under src/) stays
/// inside it when it is built as a shared library.
///
/// Static and shared builds use the same header: with GCC and Clang the
/// attribute only matters for a shared library. On Windows a static build
/// defines IDEMKAFKA_STATIC (the CMake target and idemkafka.pc pass it on)
/// and the library's own sources define IDEMKAFKA_BUILDING.
///
/// \def IDEMKAFKA_API
/// Marks a class or function the library exports.

#if defined(_WIN32) || defined(__CYGWIN__)
#if defined(IDEMKAFKA_STATIC)
#define IDEMKAFKA_API
#elif defined(IDEMKAFKA_BUILDING)
#define IDEMKAFKA_API __declspec(dllexport)
#else
#define IDEMKAFKA_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define IDEMKAFKA_API __attribute__((visibility("default")))
#else
#define IDEMKAFKA_API
#endif

/// IDEMKAFKA_LOCAL keeps a class nested in an exported one (a pimpl's Impl)
/// hidden, with its members and the templates instantiated over it.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(_WIN32) && !defined(__CYGWIN__)
#define IDEMKAFKA_LOCAL __attribute__((visibility("hidden")))
#else
#define IDEMKAFKA_LOCAL
#endif
