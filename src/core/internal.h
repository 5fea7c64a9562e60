/* Private helpers shared by every module of libctorch. */
#ifndef CT_CORE_INTERNAL_H
#define CT_CORE_INTERNAL_H

#include "ctorch/core.h"
#include <stdbool.h>

/* Record a message for ct_last_error() and return `s`, so callers can write
 * `return ct_error(CT_EINVAL, "h: expected 2 dims, got %d", nd);`. */
ct_status ct_error(ct_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prefix this thread's current message (the cause a callee recorded) with a formatted
 * context and return `s`: the message becomes "<context>: <cause>" (just "<context>" when
 * there is no cause). Use it instead of ct_error(s, "...: %s", ct_last_error()), which
 * formats the message buffer into itself (undefined behaviour). The cause is truncated
 * first when the whole does not fit the 1 KiB buffer. */
ct_status ct_error_wrap(ct_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Propagate a failing status. */
#define CT_TRY(expr)                                                                       \
    do {                                                                                   \
        ct_status ct_try_s_ = (expr);                                                      \
        if (ct_try_s_ != CT_OK) return ct_try_s_;                                          \
    } while (0)

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool ct_mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool ct_add_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

#if defined(__aarch64__)
/* svcntb() (src/core/cpu_sve.c, built with SVE enabled): call only when the CPU has SVE. */
size_t ct_sve_cntb(void);
#endif
/* The kernel table of a family for the active instruction set: tab[ct_active_isa()], where
 * the family fills every slot (an instruction set without bodies points at the next one
 * down). Chosen by index, so ct_set_isa() re-selects every family at once. */
#define CT_KERNELS(tab) ((tab)[ct_active_isa()])


#endif
