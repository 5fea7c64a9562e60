/* Small helpers of the communication layer: clocks, environment numbers, rank lists. */
#include "comm/comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

double cm_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t cm_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double cm_env_double(const char *name, double dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    double d = strtod(v, &end);
    return (*end || d != d) ? dflt : d;
}

long cm_env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long d = strtol(v, &end, 10);
    return *end ? dflt : d;
}

void cm_format_ranks(char *buf, size_t cap, const int *ranks, int n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len + 16 < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", ranks[i]);
    if (n == 0) snprintf(buf, cap, "none");
}
