/* Private helpers of the io module (safetensors reader and writer). */
#ifndef CT_IO_INTERNAL_H
#define CT_IO_INTERNAL_H

#include "ctorch/io.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest header a reader accepts (the reference implementation's MAX_HEADER_SIZE). */
#define CT_ST_MAX_HEADER 100000000ull

/* Length of the valid UTF-8 sequence at s (n bytes available): 1..4, or 0 when the bytes
 * there are not valid UTF-8 (stray continuation, overlong form, surrogate, > U+10FFFF,
 * truncated sequence). */
size_t ct_io_utf8_seq(const uint8_t *s, size_t n);

/* True when s[0..n) is valid UTF-8; otherwise *bad (may be NULL) gets the offset of the
 * first invalid byte. */
bool ct_io_utf8_valid(const void *s, size_t n, size_t *bad);

/* Copy a tensor name into buf (cap >= 8) for an error message: control characters become
 * \xNN, and long names are cut at a character boundary with "...". */
const char *ct_io_quote(char *buf, size_t cap, const char *name);

#endif
