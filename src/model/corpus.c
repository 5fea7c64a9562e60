/* The built-in corpus: documents of a Markov sentence written R times, with an exactly known
 * entropy rate (the process and the formulas are documented in include/ctorch/data.h). */
#include "core/internal.h"
#include "ctorch/data.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- random numbers --------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ct_rng_seed(ct_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3])) r->s[0] = 1;
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t ct_rng_next(ct_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double ct_rng_uniform(ct_rng *r)
{
    return (double)(ct_rng_next(r) >> 11) * 0x1.0p-53;
}

float ct_rng_normal(ct_rng *r)
{
    double u1 = ct_rng_uniform(r), u2 = ct_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Uniform integer in [0, n) (n >= 1): the top 53 bits scaled, so the draw is documented by
 * ct_rng_uniform alone. */
static int64_t rng_below(ct_rng *r, int64_t n)
{
    int64_t v = (int64_t)(ct_rng_uniform(r) * (double)n);
    return v < n ? v : n - 1;
}

/* ---- corpus tables ------------------------------------------------------------------------ */

struct ct_corpus {
    ct_corpus_options o;
    int64_t *start;   /* [C + 1]: class c owns members[start[c] .. start[c+1]) */
    int32_t *members; /* [V - 1]: words in rank order within each class */
    double *cdf;      /* [V - 1]: cumulative Zipf probability within the class */
    double *hq;       /* [C]: entropy of the word distribution of each class */
    int32_t *succ;    /* [C * k]: successor classes */
    double w[16];     /* successor weights */
    double wcdf[16];
};

ct_corpus_options ct_corpus_options_default(void)
{
    ct_corpus_options o = {1, 32768, 64, 4, 1.1, 21, 3};
    return o;
}

ct_corpus_options ct_corpus_get_options(const ct_corpus *c)
{
    return c->o;
}

void ct_corpus_free(ct_corpus *c)
{
    if (!c) return;
    ct_free(c->start);
    ct_free(c->members);
    ct_free(c->cdf);
    ct_free(c->hq);
    ct_free(c->succ);
    ct_free(c);
}

static ct_status check_options(const ct_corpus_options *o)
{
    const char *fn = "ct_corpus_create";
    if (o->classes < 1 || o->classes > (1 << 16))
        return ct_error(CT_EINVAL, "%s: classes must be in [1, 65536], got %lld", fn,
                        (long long)o->classes);
    if (o->vocab_size < o->classes + 1 || o->vocab_size > (1 << 20))
        return ct_error(CT_EINVAL,
                        "%s: vocab_size must be in [classes + 1 = %lld, 1048576], got %lld", fn,
                        (long long)(o->classes + 1), (long long)o->vocab_size);
    if (o->successors < 1 || o->successors > 16)
        return ct_error(CT_EINVAL, "%s: successors must be in [1, 16], got %lld", fn,
                        (long long)o->successors);
    if (!(o->zipf >= 0 && o->zipf <= 16))
        return ct_error(CT_EINVAL, "%s: zipf must be in [0, 16], got %g", fn, o->zipf);
    if (o->sentence < 1 || o->sentence > (1 << 20))
        return ct_error(CT_EINVAL, "%s: sentence must be in [1, 2^20] words, got %lld", fn,
                        (long long)o->sentence);
    if (o->repeats < 1 || o->repeats > (1 << 20) || o->sentence * o->repeats > (1 << 24))
        return ct_error(CT_EINVAL,
                        "%s: repeats must be >= 1 with sentence * repeats <= 2^24, got %lld", fn,
                        (long long)o->repeats);
    return CT_OK;
}

ct_status ct_corpus_create(const ct_corpus_options *opt, ct_corpus **out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_corpus_create: out must not be NULL");
    *out = NULL;
    if (!opt) return ct_error(CT_EINVAL, "ct_corpus_create: opt must not be NULL");
    CT_TRY(check_options(opt));
    ct_corpus *c;
    CT_TRY(ct_calloc((void **)&c, sizeof *c));
    c->o = *opt;
    int64_t V = opt->vocab_size, C = opt->classes, k = opt->successors, W = V - 1;
    ct_status s;
    if ((s = ct_alloc((void **)&c->start, (size_t)(C + 1) * sizeof(int64_t))) ||
        (s = ct_alloc((void **)&c->members, (size_t)W * sizeof(int32_t))) ||
        (s = ct_alloc((void **)&c->cdf, (size_t)W * sizeof(double))) ||
        (s = ct_alloc((void **)&c->hq, (size_t)C * sizeof(double))) ||
        (s = ct_alloc((void **)&c->succ, (size_t)(C * k) * sizeof(int32_t)))) {
        ct_corpus_free(c);
        return s;
    }
    ct_rng r;
    ct_rng_seed(&r, opt->seed);
    /* Deal a Fisher-Yates permutation of the words 1 .. V-1 into the classes: class c gets
     * perm[c], perm[c + C], ... in that (rank) order. */
    int32_t *perm;
    if ((s = ct_alloc((void **)&perm, (size_t)W * sizeof(int32_t)))) {
        ct_corpus_free(c);
        return s;
    }
    for (int64_t i = 0; i < W; i++)
        perm[i] = (int32_t)(i + 1);
    for (int64_t i = W - 1; i > 0; i--) {
        int64_t j = rng_below(&r, i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int64_t pos = 0;
    for (int64_t cl = 0; cl < C; cl++) {
        c->start[cl] = pos;
        int64_t n = 0;
        for (int64_t j = cl; j < W; j += C)
            c->members[pos + n++] = perm[j];
        double z = 0, acc = 0, h = 0;
        for (int64_t i = 0; i < n; i++)
            z += pow((double)(i + 1), -opt->zipf);
        for (int64_t i = 0; i < n; i++) {
            double q = pow((double)(i + 1), -opt->zipf) / z;
            acc += q;
            c->cdf[pos + i] = acc;
            h -= q * log(q);
        }
        if (n) c->cdf[pos + n - 1] = 1.0;
        c->hq[cl] = h;
        pos += n;
    }
    c->start[C] = pos;
    ct_free(perm);
    /* k permutations of the classes (Fisher-Yates each): successor j of class c is
     * sigma_j(c); weights 2^(k-1-j) / (2^k - 1) for j = 0 .. k-1. */
    for (int64_t j = 0; j < k; j++) {
        int32_t *sig = c->succ; /* column j of succ: succ[cl * k + j] */
        for (int64_t cl = 0; cl < C; cl++)
            sig[cl * k + j] = (int32_t)cl;
        for (int64_t i = C - 1; i > 0; i--) {
            int64_t m = rng_below(&r, i + 1);
            int32_t t = sig[i * k + j];
            sig[i * k + j] = sig[m * k + j];
            sig[m * k + j] = t;
        }
    }
    double tot = ldexp(1.0, (int)k) - 1.0, acc = 0;
    for (int64_t j = 0; j < k; j++) {
        c->w[j] = ldexp(1.0, (int)(k - 1 - j)) / tot;
        acc += c->w[j];
        c->wcdf[j] = acc;
    }
    c->wcdf[k - 1] = 1.0;
    *out = c;
    return CT_OK;
}

static double xlogx(double p)
{
    return p > 0 ? p * log(p) : 0.0;
}

ct_status ct_corpus_entropy_compute(const ct_corpus *c, ct_corpus_entropy *out)
{
    if (!c || !out)
        return ct_error(CT_EINVAL, "ct_corpus_entropy_compute: arguments must not be NULL");
    int64_t C = c->o.classes, k = c->o.successors, n = c->o.sentence;
    double ht = 0, hq = 0; /* means over the classes */
    for (int64_t cl = 0; cl < C; cl++) {
        const int32_t *sg = c->succ + cl * k;
        for (int64_t j = 0; j < k; j++) { /* the successor distribution, coinciding ones merged */
            bool first = true;
            double pj = 0;
            for (int64_t i = 0; i < k; i++)
                if (sg[i] == sg[j]) {
                    if (i < j) first = false;
                    pj += c->w[i];
                }
            if (first) ht -= xlogx(pj) / (double)C;
        }
        hq += c->hq[cl] / (double)C;
    }
    double D = (double)(n * c->o.repeats + 1), pe = 1.0 / D;
    out->sentence = log((double)C) + (double)(n - 1) * ht + (double)n * hq;
    out->rate = out->sentence / D;
    out->unigram = -xlogx(pe) - (1.0 - pe) * log((1.0 - pe) / (double)C) + (1.0 - pe) * hq;
    out->doc_len = n * c->o.repeats + 1;
    return CT_OK;
}

/* First index i in [lo, hi) with cdf[i] > u (the cdf ends at 1 > u). */
static int64_t search(const double *cdf, int64_t lo, int64_t hi, double u)
{
    while (lo + 1 < hi) {
        int64_t mid = lo + (hi - lo - 1) / 2;
        if (cdf[mid] > u)
            hi = mid + 1;
        else
            lo = mid + 1;
    }
    return lo;
}

ct_status ct_corpus_generate(const ct_corpus *c, uint64_t stream, int64_t n, int32_t *out)
{
    if (!c) return ct_error(CT_EINVAL, "ct_corpus_generate: c must not be NULL");
    if (n < 0)
        return ct_error(CT_EINVAL, "ct_corpus_generate: n must be >= 0, got %lld", (long long)n);
    if (n && !out) return ct_error(CT_EINVAL, "ct_corpus_generate: out must not be NULL");
    ct_rng r;
    /* Stream s is seeded with seed + (s + 1) * 0xD1B54A32D192ED03 (the tables used seed). */
    ct_rng_seed(&r, c->o.seed + (stream + 1) * 0xD1B54A32D192ED03ull);
    int64_t C = c->o.classes, k = c->o.successors, len = c->o.sentence, R = c->o.repeats;
    int64_t i = 0;
    while (i < n) {
        /* one document: the sentence into out (as far as it fits), then its copies and EOS */
        int64_t s0 = i, cl = 0;
        for (int64_t t = 0; t < len; t++) {
            if (t == 0) {
                cl = rng_below(&r, C);
            } else {
                double u = ct_rng_uniform(&r);
                int64_t j = 0;
                while (j < k - 1 && c->wcdf[j] <= u)
                    j++;
                cl = c->succ[cl * k + j];
            }
            int32_t w =
                c->members[search(c->cdf, c->start[cl], c->start[cl + 1], ct_rng_uniform(&r))];
            if (i < n) out[i++] = w;
        }
        for (int64_t rep = 1; rep < R; rep++)
            for (int64_t t = 0; t < len && i < n; t++)
                out[i] = out[s0 + t], i++;
        if (i < n) out[i++] = 0;
    }
    return CT_OK;
}

/* ---- spelling ------------------------------------------------------------------------------ */

static const char CONS[8] = {'b', 'd', 'g', 'k', 'm', 'n', 'r', 't'};
static const char VOW[4] = {'a', 'e', 'i', 'o'};

void ct_corpus_token_text(int32_t token, char buf[16])
{
    if (token == 0) {
        strcpy(buf, ".");
        return;
    }
    if (token < 0 || token >= (1 << 20)) {
        strcpy(buf, "?");
        return;
    }
    int n = token < 32768 ? 3 : 4;
    for (int i = 0; i < n; i++) {
        int syl = (token >> (5 * (n - 1 - i))) & 31;
        buf[2 * i] = CONS[syl >> 2];
        buf[2 * i + 1] = VOW[syl & 3];
    }
    buf[2 * n] = '\0';
}

ct_status ct_corpus_token_parse(const char *word, int32_t *token)
{
    if (!word || !token)
        return ct_error(CT_EINVAL, "ct_corpus_token_parse: arguments must not be NULL");
    if (!strcmp(word, ".")) {
        *token = 0;
        return CT_OK;
    }
    size_t len = strlen(word);
    if (len != 6 && len != 8)
        return ct_error(CT_EINVAL,
                        "ct_corpus_token_parse: '%s' is not a corpus word (3 or 4 syllables "
                        "of b d g k m n r t + a e i o, or '.')",
                        word);
    int32_t v = 0;
    for (size_t i = 0; i < len; i += 2) {
        const char *cp = memchr(CONS, word[i], sizeof CONS),
                   *vp = memchr(VOW, word[i + 1], sizeof VOW);
        if (!cp || !vp || !word[i + 1])
            return ct_error(CT_EINVAL,
                            "ct_corpus_token_parse: '%s' is not a corpus word (syllable %zu "
                            "is not one of b d g k m n r t + a e i o)",
                            word, i / 2 + 1);
        v = v * 32 + (int32_t)((cp - CONS) * 4 + (vp - VOW));
    }
    if (v == 0 || (len == 8 && v < 32768))
        return ct_error(CT_EINVAL, "ct_corpus_token_parse: '%s' is not the spelling of a word",
                        word);
    *token = v;
    return CT_OK;
}
