#include "core/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char ct_err_buf[1024];

const char *ct_status_name(ct_status s)
{
    switch (s) {
    case CT_OK: return "CT_OK";
    case CT_EINVAL: return "CT_EINVAL";
    case CT_ENOMEM: return "CT_ENOMEM";
    case CT_EOVERFLOW: return "CT_EOVERFLOW";
    case CT_EIO: return "CT_EIO";
    case CT_EFORMAT: return "CT_EFORMAT";
    case CT_EUNSUPPORTED: return "CT_EUNSUPPORTED";
    case CT_ETIMEDOUT: return "CT_ETIMEDOUT";
    case CT_ECANCELLED: return "CT_ECANCELLED";
    case CT_EPEER: return "CT_EPEER";
    case CT_EINTERNAL: return "CT_EINTERNAL";
    }
    return "CT_E?";
}

const char *ct_last_error(void)
{
    return ct_err_buf;
}

void ct_clear_error(void)
{
    ct_err_buf[0] = '\0';
}

/* Format into a local buffer, never into ct_err_buf directly: an argument may point into
 * ct_err_buf (the caller's ct_last_error()), and vsnprintf's source and destination must not
 * overlap. */
static void format_aside(char *out, size_t cap, const char *fmt, va_list ap)
{
    if (vsnprintf(out, cap, fmt, ap) < 0) out[0] = '\0';
}

ct_status ct_error(ct_status s, const char *fmt, ...)
{
    char msg[sizeof ct_err_buf];
    va_list ap;
    va_start(ap, fmt);
    format_aside(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(ct_err_buf, msg, strlen(msg) + 1);
    return s;
}

ct_status ct_error_wrap(ct_status s, const char *fmt, ...)
{
    char ctx[sizeof ct_err_buf], cause[sizeof ct_err_buf];
    memcpy(cause, ct_err_buf, sizeof cause);
    cause[sizeof cause - 1] = '\0';
    va_list ap;
    va_start(ap, fmt);
    format_aside(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    /* ctx ": " cause, cut to the buffer (spelled out: snprintf's truncation warning fires
     * on the two-buffer form at some optimisation levels). */
    size_t cap = sizeof ct_err_buf - 1, n = strlen(ctx);
    memcpy(ct_err_buf, ctx, n);
    if (cause[0]) {
        const char *parts[2] = {": ", cause};
        for (int i = 0; i < 2 && n < cap; i++) {
            size_t k = strlen(parts[i]);
            if (k > cap - n) k = cap - n;
            memcpy(ct_err_buf + n, parts[i], k);
            n += k;
        }
    }
    ct_err_buf[n] = '\0';
    return s;
}

const char *ct_version(void)
{
    return "0.1.0";
}
