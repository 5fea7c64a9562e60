"""Hugging Face bf16 / f16 weights read in place for inference (ct_hf_map_model): tiny Llama and
Qwen2 directories saved in bf16 and f16, loaded mapped (models.load, `ctorch generate
--model`) against transformers 5.25 (from_pretrained of the same directory, widened to f32:
logits within 1e-4, generate(do_sample=False) token for token), against the f32-converted load
(mmap=False), the same bits for 1, 2 and 3 threads, and tracked memory showing the weights are
not copied."""
import json
import os
import struct
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402
from conftest import ctorch as run  # noqa: E402

import ctorch  # noqa: E402
from ctorch import models  # noqa: E402

CONFIGS = {
    "llama": ref.llama_config(),
    "qwen2": ref.qwen2_config(),
    # rows of 36 and 45 values (not multiples of 8), an lm_head of several weight panels
    "llama-odd": ref.llama_config(hidden_size=36, intermediate_size=45, vocab_size=700,
                                  attention_bias=True),
    # down_proj rows of 17000 values: panels of 16 rows
    "qwen2-wide": ref.qwen2_config(intermediate_size=17000, num_hidden_layers=1, vocab_size=300),
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def rel_err(ours, want):
    return ((ours - want).abs().max() / want.abs().max()).item()


def tokens(cfg, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg["vocab_size"], (B, T), generator=g)


def build(tmp_path, name, dtype, seed=5, std=0.3):
    """The directory (save_pretrained in dtype), and transformers' model of it in f32."""
    cfg = CONFIGS[name]
    w = ref.random_weights(cfg, seed=seed, std=std)
    ref.save_hf(tmp_path, cfg, w, dtype=DTYPES[dtype])
    return cfg, ref.load(tmp_path)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_mapped_logits_match_reference_and_converted(tmp_path, name, dtype):
    cfg, hm = build(tmp_path, name, dtype)
    mapped, copied = models.load(tmp_path), models.load(tmp_path, mmap=False)
    # the matrices are read in place; norms and biases converted
    assert mapped.mapped_tensors == sum(1 for v in hm.state_dict().values() if v.dim() == 2) - cfg["tie_word_embeddings"]
    for B, T in ((2, 19), (1, 1), (1, 5)):
        ids = tokens(cfg, B, T, 4 + T)
        want = ref.logits(hm, ids)
        got = mapped.forward(ids)
        assert got.shape == want.shape and got.dtype == torch.float32
        assert rel_err(got, want) <= 1e-4, (B, T)
        assert rel_err(got, copied.forward(ids)) <= 1e-5, (B, T)
    # inference only: no loss or gradients from half weights in place
    with pytest.raises(Exception, match="mapped"):
        mapped.loss_and_grads(tokens(cfg, 1, 5, 1))
    with pytest.raises(Exception, match="mapped"):
        models.Lora(mapped, rank=2, targets="q,v", seq=8)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", ["llama", "qwen2", "llama-odd"])
def test_mapped_greedy_generation(tmp_path, name, dtype):
    cfg, hm = build(tmp_path, name, dtype)
    mapped, copied = models.load(tmp_path), models.load(tmp_path, mmap=False)
    mapped.eos_token_id = copied.eos_token_id = None
    ids = tokens(cfg, 2, 6, 8)
    got = mapped.generate(ids, 12)  # the KV cache: prefill panels, then the half GEMV
    assert torch.equal(got, ref.greedy(hm, ids, 12))
    assert torch.equal(got, copied.generate(ids, 12))
    assert torch.equal(got, mapped.generate(ids, 12, use_cache=False))
    # the command line maps the directory the same way
    line = " ".join(map(str, ids[0].tolist()))
    r = run("generate", "--model", tmp_path, "--prompt-ids", line, "--greedy", "--max-new-tokens",
            12, "--ignore-eos", "--json")
    assert json.loads(r.stdout)["new_ids"] == got[0, 6:].tolist()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_mapped_bits_do_not_depend_on_threads(tmp_path, dtype):
    cfg, _ = build(tmp_path, "llama-odd", dtype)
    ids = tokens(cfg, 2, 23, 3)
    before = ctorch.num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            ctorch.set_num_threads(n)
            m = models.load(tmp_path)
            m.eos_token_id = None
            outs.append((m.forward(ids), m.forward(ids[:1, :3]), m.generate(ids[:, :4], 16)))
    finally:
        ctorch.set_num_threads(before)
    for o in outs[1:]:
        for a, b in zip(outs[0], o):
            assert torch.equal(a, b)


def test_mapped_weights_are_not_copied(tmp_path):
    """A model whose weights dominate (a 32000-token vocabulary, untied): the mapped load's
    tracked peak is a small fraction of the weights' f32 size; the converted load's is more."""
    cfg = ref.llama_config(vocab_size=32000, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=1, head_dim=16)
    w = ref.random_weights(cfg, seed=1, std=0.1)
    ref.save_hf(tmp_path, cfg, w, dtype=torch.bfloat16)
    f32_bytes = 4 * sum(v.numel() for v in w.values())
    assert f32_bytes > 16_000_000
    ids = tokens(cfg, 1, 8, 2)

    def peak(mmap):
        ctorch.memory_reset_peak()
        base = ctorch.memory_stats()["current_bytes"]
        m = models.load(tmp_path, mmap=mmap)
        m.eos_token_id = None
        logits = m.forward(ids)
        out = m.generate(ids, 6)
        p = ctorch.memory_stats()["peak_bytes"] - base
        del m
        return p, logits, out

    pm, lm, om = peak(True)
    pc, lc, oc = peak(False)
    # not even the bf16 bytes (f32_bytes / 2) are copied: activations, the cache, panels
    assert pm < f32_bytes / 10, (pm, f32_bytes)
    assert pc > f32_bytes, (pc, f32_bytes)
    assert rel_err(lm, lc) <= 1e-5 and torch.equal(om, oc)


def test_misaligned_file_is_converted(tmp_path):
    """bf16 data at an odd address cannot be read in place: every tensor is converted, and the
    logits are still transformers'."""
    cfg = CONFIGS["llama"]
    w = {k: v.to(torch.bfloat16) for k, v in ref.random_weights(cfg, seed=2).items()}
    ref.save_hf(tmp_path, cfg, w, dtype=torch.bfloat16)
    hm = ref.load(tmp_path)
    # the same tensors rewritten with one byte more of header padding (a hand-made file: no
    # writer puts data at an odd offset)
    header, blobs, off = {}, [], 0
    for k, v in w.items():
        raw = v.view(torch.int16).numpy().tobytes()
        header[k] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8 + 1)  # the data starts at an odd offset
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    m = models.load(tmp_path)
    assert m.mapped_tensors == 0
    ids = tokens(cfg, 2, 9, 1)
    assert rel_err(m.forward(ids), ref.logits(hm, ids)) <= 1e-4


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_bench_generate_mapped_vs_converted(tmp_path, dtype):
    """`ctorch bench generate --dtype` (a random directory it writes) and `--model DIR`
    (timing decides nothing here)."""
    shape = ["--context", 40, "--new-tokens", 6, "--layers", 1, "--d-model", 32, "--heads", 2,
             "--kv-heads", 1, "--ffn", 48, "--vocab", 300]
    j = json.loads(run("bench", "generate", "--dtype", dtype, *shape, "--json", "--repeats", 3).stdout)
    assert j["dtype"] == dtype and j["shape"]["prompt_tokens"] == 34
    m, c = j["mapped"], j["converted_f32"]
    assert m["decode_tok_s"] > 0 and c["decode_tok_s"] > 0 and j["decode_mapped_vs_converted"] > 0
    assert m["weight_bytes"] < c["weight_bytes"] / 10 and m["tensors_in_place"] == 8
    cfg, _ = build(tmp_path, "llama", dtype)
    j = json.loads(run("bench", "generate", "--model", tmp_path, "--context", 20, "--new-tokens", 4,
                       "--json", "--repeats", 3).stdout)
    assert j["directory"] == str(tmp_path) and j["shape"]["context"] == 20
    assert j["mapped"]["tensors_in_place"] == 2 + 7 * cfg["num_hidden_layers"]
    r = run("bench", "generate", "--model", tmp_path, "--layers", 2, ok=False)
    assert r.returncode == 2 and "--model takes its shape" in r.stderr
    r = run("bench", "generate", "--dtype", "f64", ok=False)
    assert r.returncode == 2 and "--dtype" in r.stderr
