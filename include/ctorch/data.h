/*
 * ctorch/data.h - training data: a built-in synthetic corpus whose entropy is known exactly,
 * and the token streams the trainer reads batches from.
 *
 * The built-in corpus is a stream of documents over a vocabulary of V tokens (token 0 is the
 * end-of-document token EOS, tokens 1 .. V-1 are words). A document is a SENTENCE of n words
 * written R times in a row, then EOS: D = n R + 1 tokens. The sentence comes from a
 * class-based Markov source:
 *   - the words are dealt into C classes by a seeded random permutation (word perm[j] goes to
 *     class j mod C); inside a class, the word of rank r (1-based, in dealing order) has
 *     probability q(r) = r^-s / sum_r' r'^-s (Zipf with exponent s);
 *   - each class c has k successor classes sigma_1(c) .. sigma_k(c), sigma_j a seeded random
 *     permutation of the classes, taken with probabilities w_j = 2^(k-j) / (2^k - 1)
 *     (8/15, 4/15, 2/15, 1/15 for k = 4);
 *   - the first class is uniform, each next class is a successor of the previous one, and
 *     each word is drawn from its class.
 * The class chain is doubly stochastic, so every position's class is uniform, and as a word
 * determines its class the sentence's entropy is exactly
 *   H(S) = log C + (n - 1) mean_c H(w_c) + n mean_c H(q_c)
 * (H(w_c) the entropy of class c's successor distribution, coinciding successors merged;
 * H(q_c) that of its words). The copies and the EOS are determined by the sentence, so the
 * entropy rate of the stream is H = H(S) / D nats per token: the floor of any model's
 * expected loss. The unigram entropy (every token's marginal, what a model without context
 * gets) is -(1/D) log(1/D) - (1 - 1/D) log((1 - 1/D) / C) + (1 - 1/D) mean_c H(q_c).
 * A model gets from the unigram entropy towards the floor by copying earlier sentences
 * (attention, the same skill for every word) and by learning the class chain (per word).
 * With D dividing the training sequence length, packed windows start at document starts.
 *
 * Random numbers: splitmix64 seeds xoshiro256** (ct_rng); uniform doubles take the top 53
 * bits. Every draw is documented by the code in src/model/corpus.c, so a stream is the same
 * on every machine.
 */
#ifndef CTORCH_DATA_H
#define CTORCH_DATA_H

#include "ctorch/core.h"
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- random numbers ------------------------------------------------------------------- */

/** xoshiro256** state (seed it with ct_rng_seed). Plain data: copy it to save it. */
typedef struct ct_rng {
    uint64_t s[4];
} ct_rng;

/** Seed from one 64-bit value through splitmix64 (never all-zero). r must not be NULL. */
CT_API void ct_rng_seed(ct_rng *r, uint64_t seed);
/** Next 64 random bits. */
CT_API uint64_t ct_rng_next(ct_rng *r);
/** Uniform double in [0, 1) from the top 53 bits of ct_rng_next. */
CT_API double ct_rng_uniform(ct_rng *r);
/** Standard normal float (Box-Muller on two uniforms, the cosine branch). */
CT_API float ct_rng_normal(ct_rng *r);

/* ---- the built-in corpus ---------------------------------------------------------------- */

/** Parameters of the synthetic corpus (see the top of this header). */
typedef struct ct_corpus_options {
    uint64_t seed;      /**< seeds the class assignment and the successor permutations */
    int64_t vocab_size; /**< V, including EOS (token 0); default 32768; classes + 1 .. 2^20 */
    int64_t classes;    /**< C >= 1; default 64 */
    int64_t successors; /**< k in 1 .. 16; default 4 */
    double zipf;        /**< s in [0, 16]; default 1.1 */
    int64_t sentence;   /**< n >= 1 words per sentence; default 21 */
    int64_t repeats;    /**< R >= 1 copies of the sentence per document; default 3 */
} ct_corpus_options;

/** The defaults listed above (seed 1). */
CT_API ct_corpus_options ct_corpus_options_default(void);

/** Entropies of the source. */
typedef struct ct_corpus_entropy {
    double rate;     /**< entropy rate, nats per token: the floor of any model's expected loss */
    double unigram;  /**< entropy of the token marginal, nats per token */
    double sentence; /**< H(S), nats per sentence */
    int64_t doc_len; /**< D = n R + 1 tokens per document */
} ct_corpus_entropy;

/** A built corpus: the class tables (opaque; V doubles + C * k ints). */
typedef struct ct_corpus ct_corpus;

/** Build the tables of a corpus. CT_EINVAL names a bad option; CT_ENOMEM. *out is NULL on
 *  failure; free with ct_corpus_free. */
CT_API ct_status ct_corpus_create(const ct_corpus_options *opt, ct_corpus **out);
/** Free a corpus. NULL is a no-op. */
CT_API void ct_corpus_free(ct_corpus *c);
/** The options the corpus was built with. */
CT_API ct_corpus_options ct_corpus_get_options(const ct_corpus *c);
/** Exact entropies of the source into *out (closed forms above, summed in double). */
CT_API ct_status ct_corpus_entropy_compute(const ct_corpus *c, ct_corpus_entropy *out);
/** Generate n >= 0 tokens of the stream `stream` (independent streams for different values:
 *  ctorch train uses 0 for training and 1 for the held-out split) into out[n] (int32).
 *  The stream starts at a document start; generating n tokens gives the first n tokens of any
 *  longer generation of the same stream. */
CT_API ct_status ct_corpus_generate(const ct_corpus *c, uint64_t stream, int64_t n, int32_t *out);

/** Spelling of a built-in token for printing samples and reading prompts: "." for EOS, three
 *  syllables for a word below 32768 ("tobeka"), four up to 2^20, "?" otherwise (syllables are
 *  one of b d g k m n r t followed by one of a e i o, the word's id in base 32). */
CT_API void ct_corpus_token_text(int32_t token, char buf[16]);
/** Parse a word spelled by ct_corpus_token_text ("." gives EOS). CT_EINVAL when it is not one. */
CT_API ct_status ct_corpus_token_parse(const char *word, int32_t *token);

#ifdef __cplusplus
}
#endif
#endif
