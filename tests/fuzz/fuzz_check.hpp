#pragma once
// A failed property must end the run the way a sanitizer report does (abort), so
// libFuzzer saves the input as a crash artifact; assert() would vanish under NDEBUG.

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, ...)                                                                                          \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            std::fprintf(stderr, "%s:%d: property violated: %s\n  ", __FILE__, __LINE__, #cond);                       \
            std::fprintf(stderr, __VA_ARGS__);                                                                         \
            std::fputc('\n', stderr);                                                                                  \
            std::abort();                                                                                              \
        }                                                                                                              \
    } while (0)
