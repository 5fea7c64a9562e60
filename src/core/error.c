#include "core/internal.h"

#include <stdarg.h>
#include <stdio.h>

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

ct_status ct_error(ct_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ct_err_buf, sizeof ct_err_buf, fmt, ap);
    va_end(ap);
    return s;
}

const char *ct_version(void)
{
    return "0.1.0";
}
