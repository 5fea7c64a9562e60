"""Tokenizers: ctorch's own byte-level BPE and those of real models (Hugging Face
``tokenizer.json`` of the GPT-2 / Llama 3 / Qwen2 kind, GPT-2's ``encoder.json`` + ``vocab.bpe``),
through libctorch (include/ctorch/tokenizer.h, docs/tokenizers.md).

    tok = ctorch.tokenizers.load("path/to/model_dir")   # or a tokenizer file
    ids = tok.encode("Hello world")                      # list[int], BOS first if the model wants it
    text = tok.decode(ids)                               # str
"""
import ctypes
import operator

from ._lib import check, cpath, lib

_vp = ctypes.c_void_p
_i32p = ctypes.POINTER(ctypes.c_int32)

lib.ct_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(_vp)]
lib.ct_tokenizer_from_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_vp)]
lib.ct_tokenizer_free.argtypes = [_vp]
lib.ct_tokenizer_free.restype = None
lib.ct_tokenizer_vocab_size.argtypes = [_vp]
lib.ct_tokenizer_vocab_size.restype = ctypes.c_int64
for _f in (lib.ct_tokenizer_bos, lib.ct_tokenizer_eos):
    _f.argtypes = [_vp]
    _f.restype = ctypes.c_int32
for _f in (lib.ct_tokenizer_add_bos, lib.ct_tokenizer_add_eos):
    _f.argtypes = [_vp]
    _f.restype = ctypes.c_bool
lib.ct_tokenizer_format.argtypes = [_vp]
lib.ct_tokenizer_format.restype = ctypes.c_char_p
lib.ct_tokenizer_encode.argtypes = [_vp, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_i32p),
                                    ctypes.POINTER(ctypes.c_int64)]
lib.ct_tokenizer_decode.argtypes = [_vp, _i32p, ctypes.c_int64, ctypes.POINTER(_vp),
                                    ctypes.POINTER(ctypes.c_size_t)]
lib.ct_tokenizer_token_bytes.argtypes = [_vp, ctypes.c_int32, ctypes.POINTER(_vp),
                                         ctypes.POINTER(ctypes.c_size_t)]
lib.ct_tokenizer_save.argtypes = [_vp, ctypes.c_char_p]
lib.ct_free.argtypes = [_vp]
lib.ct_free.restype = None


def _token_id(i, vocab):
    """A token id as Hugging Face tokenizers takes it (an unsigned 32-bit int): a float is a
    TypeError and a negative or >= 2^32 id an OverflowError, never truncated or wrapped; ids in
    [2^31, 2^32), past any vocabulary and past int32, are refused here as the library refuses
    ids in [vocab, 2^31)."""
    i = operator.index(i)  # TypeError for 2.0, 2.7, "2"
    if i < 0:
        raise OverflowError(f"token id {i}: number too small to fit in target type (ids are "
                            "unsigned)")
    if i >= 1 << 32:
        raise OverflowError(f"token id {i}: number too large to fit in target type (ids are "
                            "unsigned 32-bit)")
    if i >= 1 << 31:
        raise ValueError(f"ctorch.tokenizers: token id {i} is outside the vocabulary [0, {vocab})")
    return i


class Tokenizer:
    """A loaded tokenizer (immutable; safe to share between threads)."""

    def __init__(self, handle):
        self._h = handle

    def __del__(self):
        if getattr(self, "_h", None):
            lib.ct_tokenizer_free(self._h)
            self._h = None

    @property
    def vocab_size(self):
        return int(lib.ct_tokenizer_vocab_size(self._h))

    @property
    def bos_id(self):
        """BOS id, or None when the tokenizer has none."""
        v = lib.ct_tokenizer_bos(self._h)
        return None if v < 0 else int(v)

    @property
    def eos_id(self):
        """EOS id, or None when the tokenizer has none."""
        v = lib.ct_tokenizer_eos(self._h)
        return None if v < 0 else int(v)

    @property
    def add_bos(self):
        """Whether encode() puts BOS first (the model's post-processor / add_bos_token)."""
        return bool(lib.ct_tokenizer_add_bos(self._h))

    @property
    def format(self):
        """"ctorch-bpe", "hf-bpe" or "gpt2-bpe"."""
        return lib.ct_tokenizer_format(self._h).decode()

    def encode(self, text, add_special_tokens=True):
        """Token ids of ``text`` (str, or bytes for any byte string). With
        ``add_special_tokens`` (the default, as in Hugging Face), BOS / EOS are added where the
        tokenizer says the model expects them."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ids = _i32p()
        n = ctypes.c_int64()
        check(lib.ct_tokenizer_encode(self._h, data, len(data), ctypes.byref(ids), ctypes.byref(n)))
        try:
            out = ids[:n.value]
        finally:
            lib.ct_free(ctypes.cast(ids, _vp))
        if add_special_tokens:
            if lib.ct_tokenizer_add_bos(self._h):
                out.insert(0, int(lib.ct_tokenizer_bos(self._h)))
            if lib.ct_tokenizer_add_eos(self._h):
                out.append(int(lib.ct_tokenizer_eos(self._h)))
        return out

    def decode_bytes(self, ids):
        """The bytes of ``ids`` (a token may hold part of a UTF-8 character)."""
        ids = [_token_id(i, self.vocab_size) for i in ids]
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        out = _vp()
        n = ctypes.c_size_t()
        check(lib.ct_tokenizer_decode(self._h, arr, len(ids), ctypes.byref(out), ctypes.byref(n)))
        try:
            return ctypes.string_at(out, n.value)
        finally:
            lib.ct_free(out)

    def decode(self, ids):
        """The text of ``ids`` (str; bytes that are not UTF-8 become U+FFFD, as in Hugging Face)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id):
        b = _vp()
        n = ctypes.c_size_t()
        check(lib.ct_tokenizer_token_bytes(self._h, _token_id(token_id, self.vocab_size), ctypes.byref(b), ctypes.byref(n)))
        return ctypes.string_at(b, n.value)

    def save(self, path):
        """Write the tokenizer as JSON (atomically)."""
        check(lib.ct_tokenizer_save(self._h, cpath(path)))


def load(path):
    """A tokenizer from a file or a model folder (tokenizer.json, or encoder.json + vocab.bpe, or a
    ctorch-bpe file)."""
    h = _vp()
    check(lib.ct_tokenizer_load(cpath(path), ctypes.byref(h)))
    return Tokenizer(h)


def from_json(text):
    """A tokenizer from its JSON text (ctorch-bpe, or a Hugging Face tokenizer.json)."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    h = _vp()
    check(lib.ct_tokenizer_from_json(data, len(data), ctypes.byref(h)))
    return Tokenizer(h)


__all__ = ["Tokenizer", "load", "from_json"]
