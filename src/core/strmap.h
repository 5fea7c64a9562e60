/* A string-keyed index: open addressing over caller-owned keys, each mapped to a size_t (an
 * index into the caller's own table). Lookups and inserts are expected O(1), so the readers
 * that match names against names (storage keys, zip members, shard files, tensor names) stay
 * linear in their input. The hash is seeded per map from the table's address, so a crafted
 * set of keys cannot be built ahead of time to collide. */
#ifndef CT_STRMAP_H
#define CT_STRMAP_H

#include "ctorch/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ct_strmap_slot {
    const char *key; /* NULL: empty */
    size_t len;
    size_t val;
    uint64_t hash;
} ct_strmap_slot;

typedef struct ct_strmap {
    ct_strmap_slot *slot;
    size_t cap, n; /* cap a power of two, n <= cap / 2 */
    uint64_t seed;
} ct_strmap;

/* An empty map sized for about `expect` keys (it grows as needed). */
ct_status ct_strmap_init(ct_strmap *m, size_t expect);
void ct_strmap_free(ct_strmap *m);

/* True (and *val, may be NULL) when key[0..len) is in the map. */
bool ct_strmap_get(const ct_strmap *m, const char *key, size_t len, size_t *val);

/* Insert key[0..len) -> val unless the key is there; *found (may be NULL) says whether it was,
 * and then *val_there (may be NULL) receives its value and the map is unchanged. The key's
 * bytes must outlive the map. */
ct_status ct_strmap_put(ct_strmap *m, const char *key, size_t len, size_t val, bool *found,
                        size_t *val_there);

#endif
