#pragma once
// Catch2 v2 (Debian 12, Ubuntu 22.04) and v3 (newer distributions).
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#else
#include <catch2/catch.hpp>
#endif
