/* The string-keyed index of strmap.h. */
#include "core/strmap.h"

#include "core/internal.h"

#include <string.h>

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static uint64_t hash_of(uint64_t seed, const char *k, size_t n)
{
    uint64_t h = seed ^ (n * 0x9e3779b97f4a7c15ull);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, k + i, 8);
        h = mix(h ^ w) + 0x9e3779b97f4a7c15ull;
    }
    uint64_t w = 0;
    for (size_t j = 0; i + j < n; j++)
        w |= (uint64_t)(uint8_t)k[i + j] << (8 * j);
    return mix(h ^ w ^ 0x2545f4914f6cdd1dull);
}

static ct_status alloc_slots(ct_strmap *m, size_t cap)
{
    ct_strmap_slot *s;
    size_t bytes;
    if (!ct_mul_size(cap, sizeof *s, &bytes))
        return ct_error(CT_EOVERFLOW, "ct_strmap: %zu slots overflow", cap);
    CT_TRY(ct_calloc((void **)&s, bytes));
    m->slot = s;
    m->cap = cap;
    return CT_OK;
}

ct_status ct_strmap_init(ct_strmap *m, size_t expect)
{
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap / 2 < expect && cap < ((size_t)1 << 58))
        cap *= 2;
    CT_TRY(alloc_slots(m, cap));
    m->seed = mix((uint64_t)(uintptr_t)m->slot ^ 0x6a09e667f3bcc909ull);
    return CT_OK;
}

void ct_strmap_free(ct_strmap *m)
{
    if (!m) return;
    ct_free(m->slot);
    memset(m, 0, sizeof *m);
}

static size_t probe(const ct_strmap *m, uint64_t h, const char *key, size_t len, bool *hit)
{
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    for (;; i = (i + 1) & mask) {
        const ct_strmap_slot *s = &m->slot[i];
        if (!s->key) {
            *hit = false;
            return i;
        }
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) {
            *hit = true;
            return i;
        }
    }
}

bool ct_strmap_get(const ct_strmap *m, const char *key, size_t len, size_t *val)
{
    if (!m->slot) return false;
    bool hit;
    size_t i = probe(m, hash_of(m->seed, key, len), key, len, &hit);
    if (hit && val) *val = m->slot[i].val;
    return hit;
}

ct_status ct_strmap_put(ct_strmap *m, const char *key, size_t len, size_t val, bool *found,
                        size_t *val_there)
{
    if (!m->slot) CT_TRY(ct_strmap_init(m, 8));
    uint64_t h = hash_of(m->seed, key, len);
    bool hit;
    size_t i = probe(m, h, key, len, &hit);
    if (found) *found = hit;
    if (hit) {
        if (val_there) *val_there = m->slot[i].val;
        return CT_OK;
    }
    if (m->n + 1 > m->cap / 2) { /* grow: rehash every key under the same seed */
        ct_strmap old = *m;
        CT_TRY(alloc_slots(m, old.cap * 2));
        for (size_t k = 0; k < old.cap; k++) {
            const ct_strmap_slot *s = &old.slot[k];
            if (!s->key) continue;
            size_t mask = m->cap - 1, j = (size_t)s->hash & mask;
            while (m->slot[j].key)
                j = (j + 1) & mask;
            m->slot[j] = *s;
        }
        ct_free(old.slot);
        i = probe(m, h, key, len, &hit);
    }
    ct_strmap_slot *s = &m->slot[i];
    s->key = key;
    s->len = len;
    s->val = val;
    s->hash = h;
    m->n++;
    return CT_OK;
}
