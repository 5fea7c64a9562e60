/* The built-in corpus: its documented structure, exact entropies against empirical ones on a
 * small source, determinism, prefix stability, spelling, bad options; the random numbers. */
#include "test_util.h"

static double plugin_entropy(const int64_t *count, size_t k, int64_t total)
{
    double h = 0;
    for (size_t i = 0; i < k; i++)
        if (count[i]) {
            double p = (double)count[i] / (double)total;
            h -= p * log(p);
        }
    return h;
}

/* A source small enough to count every sentence: 6 words in 2 classes, sentences of 3 words
 * (216 possible), 2 copies. The plug-in entropies of many generated documents must match the
 * closed forms. */
static void test_entropy_small(void)
{
    ct_corpus_options o = ct_corpus_options_default();
    o.vocab_size = 7;
    o.classes = 2;
    o.successors = 2;
    o.zipf = 1.0;
    o.sentence = 3;
    o.repeats = 2;
    o.seed = 5;
    ct_corpus *c;
    CHECK_OK(ct_corpus_create(&o, &c));
    ct_corpus_entropy e;
    CHECK_OK(ct_corpus_entropy_compute(c, &e));
    CHECK(e.doc_len == 7);
    CHECK(fabs(e.rate - e.sentence / 7.0) < 1e-12);
    int64_t docs = 200000, n = docs * 7;
    int32_t *x = malloc((size_t)n * sizeof *x);
    CHECK_OK(ct_corpus_generate(c, 0, n, x));
    int64_t *sent = calloc(7 * 7 * 7, sizeof *sent), tok[7] = {0};
    bool structure = true;
    for (int64_t d = 0; d < docs; d++) {
        const int32_t *p = x + d * 7;
        structure &= p[6] == 0 && p[3] == p[0] && p[4] == p[1] && p[5] == p[2];
        structure &= p[0] > 0 && p[1] > 0 && p[2] > 0;
        sent[(p[0] * 7 + p[1]) * 7 + p[2]]++;
    }
    for (int64_t i = 0; i < n; i++)
        tok[x[i]]++;
    CHECK(structure);
    double hs = plugin_entropy(sent, 343, docs), h1 = plugin_entropy(tok, 7, n);
    if (fabs(hs - e.sentence) > 0.02 || fabs(h1 - e.unigram) > 0.01) {
        fprintf(stderr, "  sentence entropy %.5f (empirical %.5f), unigram %.5f (empirical %.5f)\n",
                e.sentence, hs, e.unigram, h1);
        CHECK(0);
    }
    free(sent);
    free(x);
    ct_corpus_free(c);
}

static void test_default_corpus(void)
{
    ct_corpus_options o = ct_corpus_options_default();
    ct_corpus *c;
    CHECK_OK(ct_corpus_create(&o, &c));
    ct_corpus_entropy e;
    CHECK_OK(ct_corpus_entropy_compute(c, &e));
    CHECK(e.doc_len == 64);
    CHECK(e.rate > 1.0 && e.rate < e.unigram && e.unigram < log(32768.0));
    /* determinism, prefix stability, distinct streams, every word in range */
    int32_t a[1000], b[300], s1[300];
    CHECK_OK(ct_corpus_generate(c, 0, 1000, a));
    CHECK_OK(ct_corpus_generate(c, 0, 300, b));
    CHECK_OK(ct_corpus_generate(c, 1, 300, s1));
    CHECK(!memcmp(a, b, sizeof b));
    CHECK(memcmp(a, s1, sizeof s1) != 0);
    bool ok = true;
    for (int i = 0; i < 1000; i++)
        ok &= a[i] >= 0 && a[i] < 32768 && ((i % 64 == 63) == (a[i] == 0));
    CHECK(ok);
    ct_corpus *c2;
    o.seed = 2;
    CHECK_OK(ct_corpus_create(&o, &c2));
    CHECK_OK(ct_corpus_generate(c2, 0, 300, b));
    CHECK(memcmp(a, b, sizeof b) != 0);
    CHECK_OK(ct_corpus_generate(c2, 0, 0, NULL));
    CHECK_STATUS(ct_corpus_generate(c2, 0, -1, b), CT_EINVAL);
    ct_corpus_free(c2);
    ct_corpus_free(c);
}

static void test_bad_options(void)
{
    ct_corpus *c;
    ct_corpus_options o = ct_corpus_options_default();
    o.classes = 0;
    CHECK_STATUS(ct_corpus_create(&o, &c), CT_EINVAL);
    CHECK(c == NULL);
    o = ct_corpus_options_default();
    o.vocab_size = 64; /* needs classes + 1 */
    CHECK_STATUS(ct_corpus_create(&o, &c), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "vocab_size") != NULL);
    o = ct_corpus_options_default();
    o.zipf = -1;
    CHECK_STATUS(ct_corpus_create(&o, &c), CT_EINVAL);
    o = ct_corpus_options_default();
    o.successors = 17;
    CHECK_STATUS(ct_corpus_create(&o, &c), CT_EINVAL);
    o = ct_corpus_options_default();
    o.sentence = 0;
    CHECK_STATUS(ct_corpus_create(&o, &c), CT_EINVAL);
    o = ct_corpus_options_default();
    o.repeats = 0;
    CHECK_STATUS(ct_corpus_create(&o, &c), CT_EINVAL);
    CHECK_STATUS(ct_corpus_create(NULL, &c), CT_EINVAL);
}

static void test_spelling(void)
{
    char w[16];
    int32_t ids[] = {0, 1, 31, 32, 1000, 32767, 32768, 500000, (1 << 20) - 1};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        int32_t back = -1;
        ct_corpus_token_text(ids[i], w);
        CHECK_OK(ct_corpus_token_parse(w, &back));
        CHECK(back == ids[i]);
        CHECK(strlen(w) == (ids[i] == 0 ? 1u : ids[i] < 32768 ? 6u : 8u));
    }
    ct_corpus_token_text(-1, w);
    CHECK(!strcmp(w, "?"));
    int32_t t;
    CHECK_STATUS(ct_corpus_token_parse("hello", &t), CT_EINVAL);
    CHECK_STATUS(ct_corpus_token_parse("bababa", &t), CT_EINVAL);   /* 0 is EOS, spelled "." */
    CHECK_STATUS(ct_corpus_token_parse("babababa", &t), CT_EINVAL); /* 4 syllables below 32768 */
    CHECK_STATUS(ct_corpus_token_parse("baxaba", &t), CT_EINVAL);
}

static void test_rng(void)
{
    ct_rng a, b;
    ct_rng_seed(&a, 42);
    ct_rng_seed(&b, 42);
    bool same = true, range = true;
    double s = 0, s2 = 0;
    for (int i = 0; i < 100000; i++) {
        double u = ct_rng_uniform(&a);
        same &= u == ct_rng_uniform(&b);
        range &= u >= 0 && u < 1;
        float z = ct_rng_normal(&a);
        ct_rng_normal(&b);
        s += z, s2 += (double)z * z;
    }
    CHECK(same && range);
    CHECK(fabs(s / 1e5) < 0.02 && fabs(s2 / 1e5 - 1) < 0.03);
    ct_rng_seed(&a, 0);
    CHECK((a.s[0] | a.s[1] | a.s[2] | a.s[3]) != 0);
}

int main(void)
{
    test_entropy_small();
    test_default_corpus();
    test_bad_options();
    test_spelling();
    test_rng();
    return t_report("test_model_corpus");
}
