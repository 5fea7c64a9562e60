#include "core/internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static ct_log_fn log_fn;
static void *log_user;
static ct_log_level log_min = CT_LOG_INFO;

static const char *level_name(ct_log_level l)
{
    switch (l) {
    case CT_LOG_DEBUG: return "debug";
    case CT_LOG_INFO: return "info";
    case CT_LOG_WARN: return "warn";
    case CT_LOG_ERROR: return "error";
    }
    return "?";
}

void ct_log_set_sink(ct_log_fn fn, void *user, ct_log_level min_level)
{
    pthread_mutex_lock(&log_mu);
    log_fn = fn;
    log_user = user;
    log_min = min_level;
    pthread_mutex_unlock(&log_mu);
}

void ct_log(ct_log_level level, const char *component, const char *fmt, ...)
{
    char msg[2048];
    pthread_mutex_lock(&log_mu);
    if (log_fn && level >= log_min) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        log_fn(log_user, level, component, msg);
    }
    pthread_mutex_unlock(&log_mu);
}

void ct_log_sink_text(void *file, ct_log_level level, const char *component, const char *message)
{
    fprintf((FILE *)file, "[%s] %s: %s\n", level_name(level), component, message);
    fflush((FILE *)file);
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void ct_log_sink_json(void *file, ct_log_level level, const char *component, const char *message)
{
    FILE *f = file;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(f, "{\"ts\":%.6f,\"level\":\"%s\",\"component\":", ts.tv_sec + ts.tv_nsec * 1e-9,
            level_name(level));
    json_string(f, component);
    fputs(",\"msg\":", f);
    json_string(f, message);
    fputs("}\n", f);
    fflush(f);
}
