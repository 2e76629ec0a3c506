/* The check both C test programs use: a failed expectation is printed with librdaq's last
 * error and counted in `failures`, which the program's exit status reports. */
#ifndef RDAQ_TEST_EXPECT_H
#define RDAQ_TEST_EXPECT_H

#include <stdio.h>

#include "rdaq.h"

static int failures = 0;

#define EXPECT(cond, ...)                                  \
    do {                                                   \
        if (!(cond)) {                                     \
            fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                  \
            fprintf(stderr, " (last error: %s)\n", rdaq_last_error()); \
            failures++;                                    \
        }                                                  \
    } while (0)

#endif
