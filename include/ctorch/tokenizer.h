/*
 * ctorch/tokenizer.h - byte-level BPE tokenizers: ctorch's own (trained on any text, saved as
 * JSON), and those of real models read from their files: Hugging Face `tokenizer.json` (GPT-2,
 * Llama 3, Qwen2 styles) and GPT-2's `encoder.json` + `vocab.bpe`. docs/tokenizers.md has the
 * details; every format encodes any bytes and decode(encode(x)) == x.
 *
 * ctorch-bpe (the format ct_tokenizer_train makes). Token ids: 0 .. 255 are the bytes,
 * 256 .. 256+M-1 the M learned merges in the order they were learned (merge i joins two
 * earlier tokens into token 256 + i), and the last id, 256 + M, is the end-of-text token EOS,
 * written "<|endoftext|>" in text. It has no BOS (ct_tokenizer_bos is -1).
 *
 * Pre-tokenisation (merges never cross a piece boundary): the text is split at each
 * "<|endoftext|>" (which becomes EOS), then into pieces, each optionally preceded by ONE space:
 * a run of letters (ASCII letters and every byte >= 0x80, so UTF-8 letters of any script stay
 * together), a run of digits, or a run of other printable characters; whitespace that does not
 * precede such a piece forms pieces of its own (a run of spaces leaves its last space to the
 * next piece, as GPT-2 does; line breaks are kept apart from spaces).
 *
 * Training (Sennrich et al. 2016 on the piece counts): repeatedly merge the most frequent
 * adjacent pair of tokens, ties broken by the smaller (left, right) ids, until the vocabulary
 * is full or no pair occurs min_frequency times. Deterministic: the same text and options give
 * the same merges on every machine. Encoding applies, inside each piece, the merge of lowest
 * rank among the adjacent pairs until none applies (the GPT-2 procedure).
 *
 * File format (JSON): {"format": "ctorch-bpe", "version": 1, "vocab_size": N,
 * "eos": "<|endoftext|>", "merges": [[left, right], ...]}.
 *
 * Hugging Face and GPT-2 files (formats "hf-bpe", "gpt2-bpe"): ids are the file's; added and
 * special tokens are matched in the text first (longest at the leftmost place), the rest is
 * cut by the pre-tokenizer's split regex (GPT-2's, Llama 3's or Qwen2's, matched exactly),
 * each piece's bytes are mapped to tokens and merged by rank. BOS / EOS come from the
 * post-processor template, tokenizer_config.json (bos_token, eos_token, add_bos_token) when it
 * sits beside tokenizer.json, or a special token named <|endoftext|>, <|end_of_text|>, </s> or
 * <|im_end|>. ct_tokenizer_encode never adds BOS / EOS itself: ct_tokenizer_add_bos says
 * whether the model expects BOS first.
 */
#ifndef CTORCH_TOKENIZER_H
#define CTORCH_TOKENIZER_H

#include "ctorch/core.h"
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Bounds on what a tokenizer file may describe (CT_EFORMAT past them): the bytes of one token,
 *  and of all tokens together. */
#define CT_TOKENIZER_MAX_TOKEN_BYTES 4096
#define CT_TOKENIZER_MAX_TOTAL_BYTES (64 << 20)
/** The largest tokenizer file (or JSON text) read: 256 MiB. */
#define CT_TOKENIZER_MAX_FILE_BYTES (256 << 20)

/** The text of the end-of-text token. */
#define CT_TOKENIZER_EOS_TEXT "<|endoftext|>"

/** A trained tokenizer (opaque, immutable: usable from several threads at once). */
typedef struct ct_tokenizer ct_tokenizer;

/** Options of ct_tokenizer_train. */
typedef struct ct_bpe_options {
    int64_t vocab_size;    /**< target size including the 256 bytes and EOS: 257 .. 1048576;
                                default 4096 */
    int64_t min_frequency; /**< stop when the best pair occurs fewer times; >= 1, default 2 */
} ct_bpe_options;

/** The defaults listed above. */
CT_API ct_bpe_options ct_bpe_options_default(void);

/** Learn merges from len bytes of text (any bytes; text may be NULL when len == 0). opt NULL:
 *  the defaults. The vocabulary can end smaller than asked when the text runs out of pairs.
 *  CT_EINVAL (bad option), CT_ENOMEM. *out is NULL on failure; free with ct_tokenizer_free. */
CT_API ct_status ct_tokenizer_train(const char *text, size_t len, const ct_bpe_options *opt,
                                    ct_tokenizer **out);

/** Free a tokenizer. NULL is a no-op. */
CT_API void ct_tokenizer_free(ct_tokenizer *t);

/** Vocabulary size: the number of ids (ctorch-bpe: 256 + merges + 1). */
CT_API int64_t ct_tokenizer_vocab_size(const ct_tokenizer *t);

/** Id of the end-of-text token (ctorch-bpe: the last id), -1 when the tokenizer has none. */
CT_API int32_t ct_tokenizer_eos(const ct_tokenizer *t);

/** Id of the beginning-of-text token, -1 when none (ctorch-bpe has none). */
CT_API int32_t ct_tokenizer_bos(const ct_tokenizer *t);

/** Whether the model expects BOS before each text (Llama 3's post-processor, add_bos_token);
 *  ct_tokenizer_encode does not add it. */
CT_API bool ct_tokenizer_add_bos(const ct_tokenizer *t);

/** Whether the model expects EOS after each text (a template that appends it). */
CT_API bool ct_tokenizer_add_eos(const ct_tokenizer *t);

/** "ctorch-bpe", "hf-bpe" or "gpt2-bpe" (static string; "" for NULL). */
CT_API const char *ct_tokenizer_format(const ct_tokenizer *t);

/** Bytes of token `id` into *bytes / *len (pointers valid while t lives). CT_EINVAL for an id
 *  outside the vocabulary. */
CT_API ct_status ct_tokenizer_token_bytes(const ct_tokenizer *t, int32_t id, const char **bytes,
                                          size_t *len);

/** The id of the token whose bytes are exactly bytes[0..len) (special tokens first) into *id;
 *  CT_EINVAL when no token has them. */
CT_API ct_status ct_tokenizer_token_id(const ct_tokenizer *t, const char *bytes, size_t len,
                                       int32_t *id);

/** Encode len bytes of text into a new array *ids of *n tokens (ct_alloc'ed: release with
 *  ct_free; never NULL on success, even for n == 0). "<|endoftext|>" becomes EOS (ctorch-bpe;
 *  other formats: their added tokens). A tokenizer whose normalizer is NFC (Qwen2) normalizes
 *  the text between added tokens first, as Hugging Face tokenizers does (its Unicode 9.0 data;
 *  bytes that are not UTF-8 are kept). */
CT_API ct_status ct_tokenizer_encode(const ct_tokenizer *t, const char *text, size_t len,
                                     int32_t **ids, int64_t *n);

/** Decode n tokens into a new NUL-terminated string *text of *len bytes (ct_alloc'ed: release
 *  with ct_free). EOS decodes to "<|endoftext|>". CT_EINVAL names an id outside the
 *  vocabulary. */
CT_API ct_status ct_tokenizer_decode(const ct_tokenizer *t, const int32_t *ids, int64_t n,
                                     char **text, size_t *len);

/** Serialise to JSON (ctorch-bpe: its file format; other formats: a tokenizer.json, with the
 *  BOS / EOS settings read from tokenizer_config.json under a "ctorch" key) into a new NUL-terminated string *json
 *  (ct_alloc'ed: release with ct_free). */
CT_API ct_status ct_tokenizer_to_json(const ct_tokenizer *t, char **json);

/** Parse a tokenizer's JSON (len bytes): ctorch-bpe (it has "format") or a Hugging Face
 *  tokenizer.json (it has "model"), told apart by their content. CT_EFORMAT names what is wrong (not JSON,
 *  wrong "format", a merge referring to a later token, a vocab_size that does not match, an
 *  "eos" other than "<|endoftext|>", a token longer than CT_TOKENIZER_MAX_TOKEN_BYTES or
 *  tokens adding up to more than CT_TOKENIZER_MAX_TOTAL_BYTES). */
CT_API ct_status ct_tokenizer_from_json(const char *json, size_t len, ct_tokenizer **out);

/** Write the JSON file at path atomically: a temp file made by mkstemp (O_EXCL) in the
 *  target's folder, fsync, rename over path, fsync of the folder. CT_EIO names the system call
 *  that failed (nothing is left behind then). */
CT_API ct_status ct_tokenizer_save(const ct_tokenizer *t, const char *path);

/** Read a tokenizer from a file or a folder. A folder: its tokenizer.json (a Hugging Face
 *  model folder; tokenizer_config.json beside it is read too), else its encoder.json +
 *  vocab.bpe (GPT-2). A file: ctorch-bpe or tokenizer.json by content; encoder.json or a .bpe
 *  file is read with its partner from the same folder. CT_EIO (cannot read, not a regular file,
 *  nothing to read in the folder), CT_EFORMAT (what is wrong, by name), CT_EUNSUPPORTED (a
 *  setting ctorch cannot honour, by name: another model type, normalizer or split regex). */
CT_API ct_status ct_tokenizer_load(const char *path, ct_tokenizer **out);

/** GPT-2's pair from memory: encoder.json (token -> id) and vocab.bpe (merges by rank, one
 *  "a b" per line after "#version"). Byte-level BPE with GPT-2's split regex; BOS and EOS are
 *  "<|endoftext|>". Errors as ct_tokenizer_load. */
CT_API ct_status ct_tokenizer_from_gpt2(const char *encoder_json, size_t encoder_len,
                                        const char *vocab_bpe, size_t bpe_len, ct_tokenizer **out);

/** Whether len bytes are valid UTF-8 (no overlong forms, surrogates or values past U+10FFFF).
 *  On false, *bad_offset (may be NULL) receives the offset of the first invalid byte. */
CT_API bool ct_utf8_valid(const char *text, size_t len, size_t *bad_offset);

#ifdef __cplusplus
}
#endif
#endif
