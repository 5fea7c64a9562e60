"""Issue 20, items 8, 9 and 11: data that ctorch changed without a word, messages that did not
name the input and the rule, and real Hugging Face files that did not load.

Item 8 (refuse what would silently change data, as PyTorch / safetensors / PEFT / tokenizers
keep or refuse it): tensor names and paths holding NUL (ctypes cut them), a pickle STACK_GLOBAL
module holding NUL (looked up as its prefix), float and out-of-int32 token ids (truncated and
wrapped), a sharded checkpoint's index dtype (ignored), NaN and integer LoRA adapters (merged).
Item 9: the messages of a rank-1001 raw entry, `train --resume` of a finished run, a shard name
holding a newline, an added-token id collision, an integer bos_token, `decode --ids "-1 5"`.
Item 11: Meta's Llama 3 tokenizer_config.json (model_max_length 1e30 written as an integer),
Qwen2.5's, and config.json of Llama 3 / 3.1, Qwen2.5, Mistral and GPT-2 as transformers 5.25
writes them with the real models' values (oracles: transformers' own tokenizer and config)."""
import ctypes
import json
import os
import re
import shutil
import struct
import zipfile

import numpy as np
import pytest
import safetensors.torch
import tokenizers as hf_tokenizers
import torch
import transformers

from conftest import ROOT, cli_path, ctorch  # noqa: F401
import hf_reference as ref

from ctorch import io as cio  # noqa: E402
from ctorch import models  # noqa: E402
from ctorch import tokenizers as ctt  # noqa: E402
from ctorch._lib import CtorchError, check, lib  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
DEPS = os.environ.get("CTORCH_TEST_DEPS", os.path.join(ROOT, "build", "test-deps"))


def dep(*parts):
    p = os.path.join(DEPS, *parts)
    assert os.path.isfile(p), f"{p} is missing: run bash scripts/fetch_test_deps.sh (scripts/test.sh does)"
    return p


# ---- item 8: names and paths holding NUL ----------------------------------------------------

def test_names_holding_nul_are_refused_not_cut(tmp_path):
    t = torch.arange(4, dtype=torch.float32)
    # the oracle keeps "a\0b" and "a" as two names: cutting at the NUL changes the data
    ref_path = tmp_path / "ref.safetensors"
    safetensors.torch.save_file({"a\0b": t, "a": t + 1}, str(ref_path))
    assert sorted(safetensors.torch.load_file(str(ref_path))) == ["a", "a\0b"]
    p = tmp_path / "x.safetensors"
    for call in (lambda: cio.save(p, {"a\0b": t.numpy()}),
                 lambda: cio.save_pt(tmp_path / "x.pt", {"a\0b": t.numpy()}),
                 lambda: cio.save(p, {"a": t.numpy()}, metadata={"k\0ey": "v"}),
                 lambda: cio.save(p, {"a": t.numpy()}, metadata={"key": "v\0w"})):
        with pytest.raises(ValueError, match="NUL byte at offset"):
            call()
    assert not p.exists() and not (tmp_path / "x.pt").exists()
    # a path holding NUL: ValueError as Python's own open() raises (C would open "y")
    with pytest.raises(ValueError):
        open(str(tmp_path / "y\0z"), "wb")
    with pytest.raises(ValueError, match="embedded null byte"):
        cio.save(str(tmp_path / "y\0z"), {"a": t.numpy()})
    assert not (tmp_path / "y").exists()
    # looking a name up: "a\0b" is not "a"
    cio.save(p, {"a": t.numpy()})
    f = cio.SafetensorsFile(p)
    assert f.info("a")["shape"] == [4]
    with pytest.raises(ValueError, match="NUL"):
        f.info("a\0b")
    f.close()


def _pickle4_checkpoint(path, module_bytes):
    """torch.save (pickle protocol 4: STACK_GLOBAL) with the "collections" module string
    replaced by module_bytes (the frame length adjusted)."""
    torch.save({"w": torch.arange(4.0)}, str(path), pickle_protocol=4)
    z = zipfile.ZipFile(path)
    names = z.namelist()
    pk = [n for n in names if n.endswith("data.pkl")][0]
    data = z.read(pk)
    old = b"\x8c\x0bcollections"
    assert data.count(old) == 1 and data[2] == 0x95  # SHORT_BINUNICODE in the first FRAME
    new = b"\x8c" + bytes([len(module_bytes)]) + module_bytes
    data = data.replace(old, new)
    n = struct.unpack("<Q", data[3:11])[0] + len(new) - len(old)
    data = data[:3] + struct.pack("<Q", n) + data[11:]
    out = path.with_name(path.stem + "-edited.pt")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as w:
        for name in names:
            w.writestr(z.getinfo(name), data if name == pk else z.read(name))
    return out


def test_pickle_global_module_holding_nul_is_refused(tmp_path):
    # PyTorch 2.13's weights_only loader has no FRAME opcode: the full unpickler is the oracle
    # (on files this test made), and it resolves the whole module string
    good = _pickle4_checkpoint(tmp_path / "a.pt", b"collections")
    assert torch.equal(torch.load(str(good), weights_only=False)["w"], torch.arange(4.0))
    assert cio.load(good)[0]["w"].tolist() == [0, 1, 2, 3]
    bad = _pickle4_checkpoint(tmp_path / "b.pt", b"collections\0evil")
    with pytest.raises(ModuleNotFoundError, match=r"collections\\x00evil"):
        torch.load(str(bad), weights_only=False)
    with pytest.raises(CtorchError, match=r"STACK_GLOBAL module 'collections\\x00evil' holds a NUL"):
        cio.load(bad)


# ---- item 8: token ids --------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama():
    cfg = ref.llama_config()
    w = ref.random_weights(cfg, seed=4)
    m = models.Model(ref.ctorch_config(cfg))
    m.set_weights(ref.to_ctorch(cfg, w))
    return cfg, w, m, ref.hf_model(cfg, w)


def test_forward_refuses_float_and_wrapping_ids(llama):
    cfg, _, m, hf = llama
    ids = torch.tensor([[1, 5, 7, 9]])
    assert torch.allclose(m.forward(ids.to(torch.int32)), ref.logits(hf, ids), atol=1e-4)
    cases = [(torch.tensor([[1.7, 5.2]]), RuntimeError, "Long, Int"),     # was truncated to 1, 5
             (torch.tensor([[1, 2 ** 32 + 5]]), IndexError, "out of range"),  # was wrapped to 5
             (torch.tensor([[1, -1]]), IndexError, "out of range"),
             (torch.tensor([[1, cfg["vocab_size"]]]), IndexError, "out of range"),
             (torch.tensor([[1, 2]], dtype=torch.uint8), RuntimeError, "Long, Int")]
    for bad, exc, msg in cases:
        with pytest.raises(exc, match=msg):  # transformers' model (F.embedding) raises the same
            ref.logits(hf, bad)
        with pytest.raises(exc, match=msg):
            m.forward(bad)
        with pytest.raises(exc, match=msg):
            m.loss_and_grads(torch.cat([bad, bad], 1))


def test_tokenizer_decode_takes_ids_as_hf_tokenizers(tmp_path):
    path = dep("gpt2-hf", "tokenizer.json")
    oracle = hf_tokenizers.Tokenizer.from_file(path)
    tok = ctt.load(path)
    assert tok.decode([15496, 995]) == oracle.decode([15496, 995]) == "Hello world"
    for ids, exc in (([1.5], TypeError), ([15496.0], TypeError), ([-1], OverflowError),
                     ([2 ** 32 + 15496], OverflowError)):  # was 15496 after the int32 cast
        with pytest.raises(exc):
            oracle.decode(ids)
        with pytest.raises(exc):
            tok.decode(ids)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([2 ** 31 + 3])


# ---- item 8: the sharded checkpoint's dtype ----------------------------------------------

TRAIN = ["--vocab", 256, "--classes", 8, "--sentence", 5, "--repeats", 3, "--layers", 1,
         "--d-model", 16, "--heads", 2, "--kv-heads", 1, "--ffn", 24, "--context", 16,
         "--batch", 4, "--threads", 1, "--quiet"]


def test_sharded_index_dtype_is_checked(tmp_path):
    out = tmp_path / "run"
    ctorch("train", *TRAIN, "--steps", 2, "--out", out, "--fsdp", "--nproc", 2)
    latest = out / "checkpoint-2"
    ctorch("checkpoint", "consolidate", latest, tmp_path / "ok.safetensors")
    # (item 9) resuming the finished sharded run: every rank stops, rank 0 says why
    metrics = (out / "metrics.jsonl").read_bytes()
    r = ctorch("train", "--resume", "--out", out, "--fsdp", "--nproc", 2, "--quiet")
    assert "is at step 2 of 2: the run is complete" in r.stderr, r.stderr
    assert (out / "metrics.jsonl").read_bytes() == metrics
    assert sorted(os.listdir(out)) == ["checkpoint-2", "latest", "loss.svg", "metrics.jsonl"]

    def edited(name, change):
        d = tmp_path / name
        shutil.copytree(latest, d)
        idx = json.loads((d / "index.json").read_text())
        change(d, idx)
        (d / "index.json").write_text(json.dumps(idx))
        return d

    def retype(d, idx):  # the shard holds BF16 where the index says F32
        f = d / idx["tensors"]["norm.weight"]["shards"][0]["file"]
        t = safetensors.torch.load_file(str(f))
        meta = safetensors.safe_open(str(f), "pt").metadata()
        t["norm.weight"] = t["norm.weight"].to(torch.bfloat16)
        safetensors.torch.save_file(t, str(f), metadata=meta)

    cases = [(edited("bf16", lambda d, i: i["tensors"]["norm.weight"].update(dtype="BF16")),
              r"gives 'norm.weight' dtype \"BF16\""),
             (edited("none", lambda d, i: i["tensors"]["norm.weight"].pop("dtype")),
              r"gives 'norm.weight' dtype \(none\)"),
             (edited("data", retype), r"of 'norm.weight' as BF16; the index says F32")]
    for d, msg in cases:
        r = ctorch("inspect", d, ok=False)
        assert r.returncode == 1 and re.search(msg, r.stderr), r.stderr
        r = ctorch("checkpoint", "consolidate", d, tmp_path / "x.safetensors", ok=False)
        assert r.returncode == 1 and re.search(msg, r.stderr), r.stderr
        assert not (tmp_path / "x.safetensors").exists()  # was written, the dtype ignored


# ---- item 8: LoRA adapters ---------------------------------------------------------------

def test_lora_merge_refuses_nan_and_integer_adapters(tmp_path, llama):
    cfg, w, _, _ = llama
    ref.peft_model(ref.hf_model(cfg, w), rank=2, alpha=4, targets="q,v").save_pretrained(str(tmp_path))
    st = tmp_path / "adapter_model.safetensors"
    good = safetensors.torch.load_file(str(st))
    b = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    ids = torch.tensor([[3, 1, 4, 1, 5]])

    def fresh():
        m = models.Model(ref.ctorch_config(cfg))
        m.set_weights(ref.to_ctorch(cfg, w))
        return m

    m = fresh()
    before = m.forward(ids)
    nan = dict(good)
    nan[b] = good[b].clone()
    nan[b][3, 1] = float("nan")
    safetensors.torch.save_file(nan, str(st))
    # PEFT's safe merge refuses it too
    with pytest.raises(ValueError, match="NaN"):
        ref.load_adapter(ref.hf_model(cfg, w), tmp_path).merge_and_unload(safe_merge=True)
    with pytest.raises(CtorchError, match=r"holds NaN at \[3, 1\]"):
        m.merge_lora(tmp_path)
    assert torch.equal(m.forward(ids), before)  # nothing merged, not even the adapters before it
    inf = dict(good)
    inf[a] = good[a].clone()
    inf[a][0, 0] = float("inf")
    safetensors.torch.save_file(inf, str(st))
    with pytest.raises(CtorchError, match="holds an infinity"):
        m.merge_lora(tmp_path)
    # finite adapters whose product overflows: PEFT's safe merge refuses the merged weight
    big = dict(good)
    big[b] = good[b] * 1e20
    big[b.replace("lora_B", "lora_A")] = good[b.replace("lora_B", "lora_A")] * 1e20
    safetensors.torch.save_file(big, str(st))
    with pytest.raises(ValueError, match="NaN"):
        ref.load_adapter(ref.hf_model(cfg, w), tmp_path).merge_and_unload(safe_merge=True)
    with pytest.raises(CtorchError, match=r"would make 'layers.1.attention.wv.weight' non-finite"):
        m.merge_lora(tmp_path)
    assert torch.equal(m.forward(ids), before)
    ints = dict(good)
    ints[a] = (good[a] * 10).round().to(torch.int32)
    safetensors.torch.save_file(ints, str(st))
    with pytest.raises(CtorchError, match="is I32: LoRA adapters must hold floats"):
        m.merge_lora(tmp_path)
    assert torch.equal(m.forward(ids), before)
    safetensors.torch.save_file(good, str(st))
    assert m.merge_lora(tmp_path) == 4
    merged = ref.load_adapter(ref.hf_model(cfg, w), tmp_path).merge_and_unload()
    assert torch.allclose(m.forward(ids), ref.logits(merged, ids), atol=1e-4)


# ---- item 9: messages ---------------------------------------------------------------------

def test_raw_entry_rank_message_gives_the_limit(tmp_path):
    shape = (ctypes.c_int64 * 1001)(*([1] * 1001))
    data = (ctypes.c_float * 1)(1.0)
    e = (cio._SaveEntry * 1)()
    e[0].name, e[0].st_dtype, e[0].ndim = b"x", cio.ST_DTYPES.index("F32"), 1001
    e[0].shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    e[0].data = ctypes.cast(data, ctypes.c_void_p)
    o = lib.ct_save_options_default()
    with pytest.raises(CtorchError) as err:
        check(lib.ct_save_pt_entries(str(tmp_path / "r.pt").encode(), e, 1, ctypes.byref(o)))
    msg = str(err.value)
    assert "1001 dims" in msg and "0 to 64" in msg and not re.search(r"0x[0-9a-f]{6}", msg), msg
    # a rank PyTorch itself saves (64) is written and reads back
    shape64 = (ctypes.c_int64 * 64)(*([1] * 64))
    e[0].ndim, e[0].shape = 64, ctypes.cast(shape64, ctypes.POINTER(ctypes.c_int64))
    check(lib.ct_save_pt_entries(str(tmp_path / "r.pt").encode(), e, 1, ctypes.byref(o)))
    assert torch.load(str(tmp_path / "r.pt"), weights_only=True)["x"].shape == (1,) * 64


def test_resume_of_a_finished_run_says_so_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    ctorch("train", *TRAIN, "--steps", 3, "--out", out)
    files = {f: (out / f).read_bytes() for f in os.listdir(out)}
    assert {"checkpoint.safetensors", "metrics.jsonl", "loss.svg"} <= set(files)
    r = ctorch("train", "--resume", "--out", out)
    assert "is at step 3 of 3: the run is complete, no steps left to train" in r.stderr
    assert "could not write" not in r.stderr
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == files
    other = tmp_path / "other"
    r = ctorch("train", "--resume", out / "checkpoint.safetensors", "--out", other)
    assert "no steps left" in r.stderr and "could not write" not in r.stderr
    assert not (other / "loss.svg").exists()  # was a 0-byte plot
    r = ctorch("train", "--resume", "--out", out, "--stop-at", 2)
    assert "at or past --stop-at 2" in r.stderr
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == files


def test_shard_name_with_a_newline_is_named(tmp_path):
    cfg = ref.llama_config()
    ref.save_hf(tmp_path, cfg, ref.random_weights(cfg), shards=2)
    idx = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    first = sorted(set(idx["weight_map"].values()))[0]
    bad = first.replace("model-", "mod\nel-")
    os.rename(tmp_path / first, tmp_path / bad)
    idx["weight_map"] = {k: bad if v == first else v for k, v in idx["weight_map"].items()}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CtorchError, match="names no shard file: it holds the control character "
                                          "0x0a at byte 3"):
        models.load(tmp_path)


def _gpt2_tokenizer_dir(tmp_path, edit=None, config=None):
    d = tmp_path / "tok"
    d.mkdir(parents=True)
    j = json.loads(open(dep("gpt2-hf", "tokenizer.json"), encoding="utf-8").read())
    if edit:
        edit(j)
    (d / "tokenizer.json").write_text(json.dumps(j), encoding="utf-8")
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


def test_added_token_id_collision_and_integer_bos_token_are_named(tmp_path):
    def collide(j):  # an added token given byte 0x05's id
        j["added_tokens"].append({"id": 5, "content": "<x>", "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
    with pytest.raises(CtorchError, match=r"added token 1 \('<x>'\) has id 5, which the vocab gives"):
        ctt.load(_gpt2_tokenizer_dir(tmp_path / "a", collide))
    # <|endoftext|> is both a vocab entry and an added token at 50256: one token, accepted
    assert ctt.load(_gpt2_tokenizer_dir(tmp_path / "b")).eos_id == 50256
    with pytest.raises(CtorchError, match="bos_token is the integer 50256, not a token"):
        ctt.load(_gpt2_tokenizer_dir(tmp_path / "c", config={"bos_token": 50256}))
    with pytest.raises(CtorchError, match="eos_token '<nope>' is not one of the tokenizer's added"):
        ctt.load(_gpt2_tokenizer_dir(tmp_path / "d", config={"eos_token": "<nope>"}))


def test_decode_ids_must_be_in_the_vocabulary(tmp_path):
    (tmp_path / "text.txt").write_text("hello world the quick brown fox " * 50)
    tok = tmp_path / "tok.json"
    ctorch("tokenizer", "train", "--data", tmp_path / "text.txt", "--out", tok, "--vocab", 300)
    V = ctt.load(tok).vocab_size
    assert ctorch("tokenizer", "decode", "--tokenizer", tok, "--ids", "104 105").stdout == "hi\n"
    for ids, msg in (("-1 5", f"id -1 is not in [0, {V})"), (f"5 {V}", f"id {V} is not in [0, {V})"),
                     ("1.5 2", "'1.5' is not an integer"), ("5x", "'5x' is not an integer"),
                     ("99999999999999999999", "is not in [0, ")):
        r = ctorch("tokenizer", "decode", "--tokenizer", tok, "--ids", ids, ok=False)
        assert r.returncode == 2 and msg in r.stderr, (ids, r.stderr)


# ---- item 11: real files ------------------------------------------------------------------

# tokenizer_config.json as Meta ships it with Meta-Llama-3-8B (abridged: the first and last
# reserved tokens of added_tokens_decoder; model_max_length is 1e30 written as an integer)
LLAMA3_TOKENIZER_CONFIG = """{
  "added_tokens_decoder": {
    "128000": {"content": "<|begin_of_text|>", "lstrip": false, "normalized": false,
               "rstrip": false, "single_word": false, "special": true},
    "128001": {"content": "<|end_of_text|>", "lstrip": false, "normalized": false,
               "rstrip": false, "single_word": false, "special": true},
    "128255": {"content": "<|reserved_special_token_250|>", "lstrip": false, "normalized": false,
               "rstrip": false, "single_word": false, "special": true}
  },
  "bos_token": "<|begin_of_text|>",
  "clean_up_tokenization_spaces": true,
  "eos_token": "<|end_of_text|>",
  "model_input_names": ["input_ids", "attention_mask"],
  "model_max_length": 1000000000000000019884624838656,
  "tokenizer_class": "PreTrainedTokenizerFast"
}"""

# Qwen2.5-7B's (abridged), with its chat template's shape, nulls and keys ctorch does not use
QWEN25_TOKENIZER_CONFIG = {
    "add_bos_token": False, "add_prefix_space": False,
    "added_tokens_decoder": {"151643": {"content": "<|endoftext|>", "lstrip": False,
                                        "normalized": False, "rstrip": False,
                                        "single_word": False, "special": True}},
    "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
    "chat_template": "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
                     "message.content + '<|im_end|>' + '\\n' }}{%- endfor %}",
    "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "errors": "replace",
    "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
    "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}

TEXTS = ["Hello world", " The quick brown fox jumps over 12345 lazy dogs.\n", "caf\u00e9 \u65e5\u672c",
         "<|begin_of_text|>x<|end_of_text|>"]


@pytest.mark.parametrize("style", ["llama3", "qwen2"])
def test_real_tokenizer_config_loads(tmp_path, style):
    d = tmp_path / style
    d.mkdir()
    shutil.copy(dep(style, "tokenizer.json"), d / "tokenizer.json")
    text = LLAMA3_TOKENIZER_CONFIG if style == "llama3" else json.dumps(QWEN25_TOKENIZER_CONFIG)
    (d / "tokenizer_config.json").write_text(text)
    oracle = transformers.AutoTokenizer.from_pretrained(str(d))  # transformers 5.25 reads both
    if style == "llama3":
        assert oracle.model_max_length == 1000000000000000019884624838656
    tok = ctt.load(d)  # was: "too big integer" for Llama 3
    assert tok.bos_id == oracle.bos_token_id and tok.eos_id == oracle.eos_token_id
    for t in TEXTS:
        assert tok.encode(t) == oracle(t)["input_ids"], t
        assert tok.decode(tok.encode(t, add_special_tokens=False)) == t


def _saved_config(tmp_path, name, cfg, arch):
    cfg.architectures = [arch]
    d = tmp_path / name
    cfg.save_pretrained(str(d))
    return d


def test_real_model_configs(tmp_path):
    """config.json of Llama 3 8B, Llama 3.1 8B, Qwen2.5 7B and Mistral 7B v0.3 with their real
    values, written by transformers 5.25 (rope_parameters, nulls, keys ctorch ignores), read by
    ctorch into the same model; Mistral 7B v0.1's (a 4096 sliding window on every layer) read as
    ctorch's window 4095 (transformers' sliding_window S is S - 1 earlier tokens: test_hf_window);
    GPT-2's refused by name."""
    L3 = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
              rms_norm_eps=1e-5, rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001,
              tie_word_embeddings=False)
    L31 = dict(L3, max_position_embeddings=131072, eos_token_id=[128001, 128008, 128009],
               rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    Q25 = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072,
               rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=131072, max_window_layers=28,
               use_sliding_window=False, bos_token_id=151643, eos_token_id=151643,
               tie_word_embeddings=False)
    M03 = dict(vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
               rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None, bos_token_id=1,
               eos_token_id=2, tie_word_embeddings=False)
    cases = [("llama3", transformers.LlamaConfig(**L3), "LlamaForCausalLM"),
             ("llama31", transformers.LlamaConfig(**L31), "LlamaForCausalLM"),
             ("qwen25", transformers.Qwen2Config(**Q25), "Qwen2ForCausalLM"),
             ("mistral03", transformers.MistralConfig(**M03), "MistralForCausalLM")]
    for name, hc, arch in cases:
        d = _saved_config(tmp_path, name, hc, arch)
        c, bos, eos = models._read_config(str(d / "config.json"), str(d))
        assert (c["vocab_size"], c["d_model"], c["d_ff"], c["n_layer"], c["n_head"], c["n_kv_head"],
                c["context"]) == (hc.vocab_size, hc.hidden_size, hc.intermediate_size,
                                  hc.num_hidden_layers, hc.num_attention_heads,
                                  hc.num_key_value_heads, hc.max_position_embeddings), name
        assert c["head_dim"] == hc.hidden_size // hc.num_attention_heads
        assert c["rope_base"] == hc.rope_parameters["rope_theta"]
        assert np.float32(c["norm_eps"]) == np.float32(hc.rms_norm_eps)
        eos_want = hc.eos_token_id[0] if isinstance(hc.eos_token_id, list) else hc.eos_token_id
        assert (bos, eos) == (hc.bos_token_id, eos_want), name
        assert c.get("qkv_bias", False) == (name == "qwen25") and not c["tied"] and not c["window"]
        if name == "llama31":
            assert (c["rope_scaling"], c["rope_factor"], c["rope_original_context"]) == ("llama3", 8.0, 8192)
    d = _saved_config(tmp_path, "gpt2", transformers.GPT2Config(), "GPT2LMHeadModel")
    with pytest.raises(CtorchError, match='architecture "GPT2LMHeadModel" is not supported'):
        models._read_config(str(d / "config.json"), str(d))  # was: unknown key "activation_function"
    M01 = dict(M03, vocab_size=32000, rope_theta=10000.0, sliding_window=4096)
    d = _saved_config(tmp_path, "mistral01", transformers.MistralConfig(**M01), "MistralForCausalLM")
    assert json.load(open(d / "config.json"))["sliding_window"] == 4096
    c, bos, eos = models._read_config(str(d / "config.json"), str(d))
    assert (c["window"], c["vocab_size"], c["context"], c["rope_base"], c["n_kv_head"], bos, eos) == \
        (4095, 32000, 32768, 10000.0, 8, 1, 2)
