"""Generation with a KV cache: Python ``Model.generate`` and ``ctorch generate``.

Cached greedy generation equals, token for token, transformers 5.25's generate(do_sample=False)
on the same weights (hf_reference.py) and ctorch's own no-cache baseline and Model.forward.
Sampling is reproducible with a seed, its temperature -> top-k -> top-p distribution equals the
one transformers' own logits warpers (TemperatureLogitsWarper, TopKLogitsWarper,
TopPLogitsWarper) give, and bad arguments raise what PyTorch / transformers raise."""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402
from conftest import ctorch as run  # noqa: E402

from ctorch import _generate, models  # noqa: E402

CONFIGS = {
    "llama": ref.llama_config(),
    "qwen2": ref.qwen2_config(),
    "llama-bias-llama3": ref.llama_config(
        attention_bias=True, head_dim=12,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
}


def make(name, seed=3, std=0.3):
    """(config, transformers' model, ctorch's model) holding the same random weights."""
    cfg = CONFIGS[name]
    w = ref.random_weights(cfg, seed=seed, std=std)
    m = models.Model(ref.ctorch_config(cfg))
    m.set_weights(ref.to_ctorch(cfg, w))
    return cfg, ref.hf_model(cfg, w), m


def prompt(cfg, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg["vocab_size"], (B, T), generator=g)


def greedy_ctorch_forward(m, ids, n):
    for _ in range(n):
        ids = torch.cat((ids, m.forward(ids)[:, -1].argmax(-1, keepdim=True)), 1)
    return ids


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_matches_full_forward_references(name):
    cfg, hm, m = make(name)
    ids = prompt(cfg, 3, 7, 1)
    got = m.generate(ids, 30)
    assert got.dtype == torch.int64 and got.shape == (3, 37)
    assert torch.equal(got[:, :7], ids)
    assert torch.equal(got, ref.greedy(hm, ids, 30))
    assert torch.equal(got, greedy_ctorch_forward(m, ids, 30))
    assert torch.equal(got, m.generate(ids, 30, use_cache=False))
    # one sequence given as [T] is a batch of one
    assert torch.equal(m.generate(ids[1], 30), got[1:2])


def test_past_the_context_equals_the_baseline():
    cfg, hm, m = make("llama")
    ctx = cfg["max_position_embeddings"]  # 64
    ids = prompt(cfg, 2, 50, 2)
    a = m.generate(ids, 40, do_sample=True, seed=4)
    assert a.shape == (2, 90)
    assert torch.equal(a, m.generate(ids, 40, do_sample=True, seed=4, use_cache=False))
    # within the context the continuation is the reference's; after it, the last ctx tokens
    g = m.generate(ids, 20)
    assert torch.equal(g[:, :50 + ctx - 50], ref.greedy(hm, ids, ctx - 50))


def test_eos_stops_and_pads():
    cfg, hm, m = make("qwen2")
    ids = prompt(cfg, 4, 5, 3)
    free = m.generate(ids, 12, do_sample=True, seed=9)
    # the EOS: a token row 0 produces at step 2 (the others may produce it elsewhere or never)
    eos = int(free[0, 7])
    got = m.generate(ids, 12, do_sample=True, seed=9, eos_token_id=eos)
    assert got.shape[1] <= 17
    for r in range(4):
        new = got[r, 5:].tolist()
        if eos in new:
            k = new.index(eos)
            assert all(t == eos for t in new[k:])
            assert new[:k] == free[r, 5:5 + k].tolist()
        else:
            assert new == free[r, 5:5 + len(new)].tolist()
    # the run ends early only when every row has ended
    if got.shape[1] < 17:
        assert all(eos in got[r, 5:].tolist() for r in range(4))
    m.eos_token_id = int(free[0, 5])  # the model's own EOS: row 0 stops at once
    g = m.generate(ids[:1], 12, do_sample=True, seed=9)
    assert g.shape == (1, 6) and int(g[0, 5]) == m.eos_token_id


def test_sampling_is_reproducible():
    cfg, hm, m = make("llama", std=0.1)
    ids = prompt(cfg, 2, 4, 5)
    a = m.generate(ids, 25, do_sample=True, temperature=1.2, top_k=20, top_p=0.9, seed=7)
    b = m.generate(ids, 25, do_sample=True, temperature=1.2, top_k=20, top_p=0.9, seed=7)
    c = m.generate(ids, 25, do_sample=True, temperature=1.2, top_k=20, top_p=0.9, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(m.generate(ids, 25, do_sample=True), m.generate(ids, 25, do_sample=True, seed=1))
    # top_k=1 and top_p=0 keep only the most likely token: greedy
    g = m.generate(ids, 25)
    assert torch.equal(m.generate(ids, 25, do_sample=True, top_k=1, seed=3), g)
    assert torch.equal(m.generate(ids, 25, do_sample=True, top_p=0.0, seed=3), g)
    # the same tokens with the cache and without
    assert torch.equal(a, m.generate(ids, 25, do_sample=True, temperature=1.2, top_k=20, top_p=0.9,
                                     seed=7, use_cache=False))


def hf_warped_probs(logits, temperature, top_k, top_p):
    """softmax after transformers' TemperatureLogitsWarper, TopKLogitsWarper and
    TopPLogitsWarper, in generate()'s order."""
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)
    procs = LogitsProcessorList([TemperatureLogitsWarper(float(temperature))])
    if top_k is not None:
        procs.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        procs.append(TopPLogitsWarper(float(top_p)))
    ids = torch.zeros(logits.shape[0], 1, dtype=torch.long)
    return torch.softmax(procs(ids, logits.clone()), -1)


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, None, None), (0.7, 5, None), (1.5, None, 0.9), (1.0, 10, 0.5), (0.5, 3, 0.99),
    (2.0, 200, 0.3), (1.0, 1, None),
])
def test_sampling_distribution_matches_transformers_warpers(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(6, 100, generator=g) * 3
    ours = _generate.sample_probs(logits, temperature, top_k, top_p)
    want = hf_warped_probs(logits, temperature, top_k, top_p)
    assert torch.equal(ours > 0, want > 0)
    assert (ours - want).abs().max().item() <= 1e-6


def test_sampled_tokens_lie_in_the_filtered_set():
    cfg, hm, m = make("llama", std=0.1)
    ids = prompt(cfg, 2, 6, 6)
    got = m.generate(ids, 20, do_sample=True, temperature=0.9, top_k=8, top_p=0.7, seed=2)
    for t in range(6, 26):
        logits = ref.logits(hm, got[:, :t])[:, -1]
        p = hf_warped_probs(logits, 0.9, 8, 0.7)
        for r in range(2):
            assert p[r, got[r, t]] > 0, (r, t)


def test_bad_arguments_raise_like_pytorch():
    cfg, hm, m = make("llama")
    V = cfg["vocab_size"]
    ids = prompt(cfg, 1, 4, 7)
    table = torch.zeros(V, 2)
    # indices outside the vocabulary / of a float dtype: what torch's embedding raises
    for bad in (torch.tensor([[1, V]]), torch.tensor([[-1, 2]]), torch.tensor([[1.0, 2.0]])):
        with pytest.raises(Exception) as theirs:
            torch.nn.functional.embedding(bad, table)
        with pytest.raises(type(theirs.value)):
            m.generate(bad, 3)
    with pytest.raises(TypeError):
        m.generate([[1, 2]], 3)
    with pytest.raises(ValueError):
        m.generate(torch.zeros(1, 2, 3, dtype=torch.long), 3)
    with pytest.raises(ValueError):
        m.generate(torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError):
        m.generate(ids, -1)
    with pytest.raises(TypeError):
        m.generate(ids, 2.5)
    for kw in ({"temperature": 0.0}, {"temperature": -1.0}, {"top_k": 0}, {"top_k": -3},
               {"top_p": 1.5}, {"top_p": -0.1}, {"seed": -1}):
        with pytest.raises(ValueError):
            m.generate(ids, 3, do_sample=True, **kw)
    for kw in ({"top_k": 2.0}, {"temperature": "hot"}, {"seed": 1.5}, {"do_sample": 1}):
        with pytest.raises(TypeError):
            m.generate(ids, 3, **({"do_sample": True} | kw))
    with pytest.raises(ValueError):
        m.generate(ids, 3, eos_token_id=V)
    # greedy ignores the sampling knobs (transformers does the same)
    assert torch.equal(m.generate(ids, 5, temperature=0.0), m.generate(ids, 5))
    assert m.generate(ids, 0).shape == (1, 4)


# ---- the command line ----------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def checkpoint(tiny_run):
    return tiny_run / "checkpoint.safetensors"


def gen_json(ck, *args):
    r = run("generate", "--model", ck, "--json", *args)
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    return json.loads(lines[0])


def test_cli_json_and_cache_equals_baseline(checkpoint):
    a = gen_json(checkpoint, "--prompt-ids", "0 5 9", "--max-new-tokens", 50, "--ignore-eos", "--seed", 4)
    assert list(a) == ["prompt_ids", "new_ids", "text", "prompt_tok_s", "decode_tok_s"]
    assert a["prompt_ids"] == [0, 5, 9] and len(a["new_ids"]) == 50  # 53 tokens: past the context
    assert a["prompt_tok_s"] > 0 and a["decode_tok_s"] > 0 and isinstance(a["text"], str)
    b = gen_json(checkpoint, "--prompt-ids", "0,5,9", "--tokens", 50, "--ignore-eos", "--seed", 4,
                 "--no-cache")
    assert b["new_ids"] == a["new_ids"] and b["text"] == a["text"]
    c = gen_json(checkpoint, "--prompt-ids", "0 5 9", "--tokens", 50, "--ignore-eos", "--seed", 5)
    assert c["new_ids"] != a["new_ids"]


def test_cli_defaults_are_unchanged(checkpoint):
    """64 tokens, temperature 0.8, top-k 40, top-p 1, seed 1 when nothing is said."""
    d = gen_json(checkpoint, "--prompt-ids", "0 5 9", "--ignore-eos")
    e = gen_json(checkpoint, "--prompt-ids", "0 5 9", "--ignore-eos", "--max-new-tokens", 64,
                 "--temperature", 0.8, "--top-k", 40, "--top-p", 1, "--seed", 1)
    assert len(d["new_ids"]) == 64 and d["new_ids"] == e["new_ids"]


def test_cli_greedy_matches_torch(checkpoint, tmp_path):
    # the trained model in PyTorch (bench/torch_train.py, the reference of test_train.py)
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import torch_train
    tensors, meta = torch_train.read_safetensors(str(checkpoint))
    cfg = json.loads(meta["config"])
    eos = json.loads(meta["train"])["eos_token"]
    model = torch_train.GPT(cfg, tensors)
    g = gen_json(checkpoint, "--prompt-ids", "0 17 101", "--max-new-tokens", 20, "--greedy", "--ignore-eos")
    ids = list(g["prompt_ids"])
    with torch.no_grad():
        for _ in range(20):
            t = torch.tensor([ids + [0]])  # GPT.forward wants targets: a dummy last token
            logits = torch_logits(model, t, cfg, eos)
            ids.append(int(logits[0, -1].argmax()))
    assert ids[len(g["prompt_ids"]):] == g["new_ids"]
    # --greedy is --temperature 0 whatever the other knobs say
    t0 = gen_json(checkpoint, "--prompt-ids", "0 17 101", "--tokens", 20, "--temperature", 0, "--ignore-eos",
                  "--top-k", 3, "--top-p", 0.5, "--seed", 9)
    assert t0["new_ids"] == g["new_ids"]
    cp = run("generate", "--checkpoint", checkpoint, "--json", "--prompt-ids", "0 17 101", "--tokens", 20,
             "--greedy", "--ignore-eos")
    assert json.loads(cp.stdout)["new_ids"] == g["new_ids"]


def torch_logits(model, tokens, cfg, eos):
    """Logits of every position of torch_train.GPT's weights (its forward returns the loss):
    the same layers as GPT.forward, stopping before the loss."""
    import torch.nn.functional as F
    c = cfg
    inp = tokens[:, :-1]
    B, T = inp.shape
    H, K, C = c["n_head"], c["n_kv_head"], c["d_model"]
    E = C // H
    import torch_train
    mask = torch_train.attention_mask(inp, c["window"], eos)
    w = model.w
    h = F.embedding(inp, w("tok_embeddings.weight"))
    for l in range(c["n_layer"]):
        pre = f"layers.{l}."
        a = torch_train.rmsnorm(h, w(pre + "attention_norm.weight"), c["norm_eps"])
        q = torch_train.rope((a @ w(pre + "attention.wq.weight").t()).view(B, T, H, E), c["rope_base"])
        k = torch_train.rope((a @ w(pre + "attention.wk.weight").t()).view(B, T, K, E), c["rope_base"])
        v = (a @ w(pre + "attention.wv.weight").t()).view(B, T, K, E)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        k = k.repeat_interleave(H // K, dim=1)
        v = v.repeat_interleave(H // K, dim=1)
        s = (q @ k.transpose(-1, -2)) * (1.0 / E ** 0.5)
        s = s.masked_fill(~mask, float("-inf"))
        o = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * E)
        h = h + o @ w(pre + "attention.wo.weight").t()
        f = torch_train.rmsnorm(h, w(pre + "ffn_norm.weight"), c["norm_eps"])
        gg, u = (f @ w(pre + "feed_forward.w_gate_up.weight").t()).chunk(2, -1)
        h = h + (F.silu(gg) * u) @ w(pre + "feed_forward.w_down.weight").t()
    h = torch_train.rmsnorm(h, w("norm.weight"), c["norm_eps"])
    W = w("tok_embeddings.weight") if c["tied"] else w("output.weight")
    return h @ W.t()


def test_cli_stops_at_eos(checkpoint):
    # the corpus model's EOS is token 0 ('.'): sampling long enough produces it
    a = gen_json(checkpoint, "--tokens", 60, "--seed", 2)
    assert a["new_ids"][-1] == 0 and 0 not in a["new_ids"][:-1]
    b = gen_json(checkpoint, "--tokens", 60, "--seed", 2, "--ignore-eos")
    assert len(b["new_ids"]) == 60 and b["new_ids"][:len(a["new_ids"])] == a["new_ids"]
    # text mode: the prompt, the continuation, and the speeds on stderr
    word = next(w for w in b["text"].split() if w != ".")  # a word of the model's vocabulary
    r = run("generate", "--model", checkpoint, "--prompt", word, "--tokens", 5, "--ignore-eos")
    assert r.stdout.startswith(word + " ") and "tok/s" in r.stderr and "decode 5 tokens" in r.stderr


def test_cli_bad_options(checkpoint):
    cases = [
        (["--prompt-ids", "1 x 2"], 2, "'x'"),
        (["--prompt-ids", "1 99999"], 2, "99999"),
        (["--prompt-ids", "-3"], 2, "-3"),
        (["--prompt", "x", "--prompt-ids", "1"], 2, "not both"),
        (["--top-p", "1.5"], 2, "--top-p"),
        (["--max-new-tokens", "-1"], 2, "--max-new-tokens"),
        (["--temperature", "-1"], 2, "--temperature"),
        (["--bogus"], 2, "--bogus"),
    ]
    for args, code, needle in cases:
        r = run("generate", "--model", checkpoint, *args, ok=False)
        assert r.returncode == code, (args, r.returncode, r.stderr)
        assert needle in r.stderr, (args, r.stderr)
    r = run("generate", ok=False)
    assert r.returncode == 2 and "--model" in r.stderr and "--checkpoint" in r.stderr


def test_bench_generate_runs():
    r = run("bench", "generate", "--context", 48, "--new-tokens", 6, "--layers", 1, "--d-model", 16,
            "--heads", 2, "--kv-heads", 1, "--ffn", 16, "--vocab", 64, "--json")
    j = json.loads(r.stdout)
    assert j["bench"] == "generate" and j["same_tokens"] is True
    assert j["shape"] == {"batch": 1, "context": 48, "prompt_tokens": 42, "new_tokens": 6}
    for way in ("kv_cache", "no_cache"):
        assert j[way]["decode_tok_s"] > 0 and j[way]["prompt_tok_s"] > 0
    assert j["decode_speedup"] > 0
    assert run("bench", "generate", "--help").stdout.startswith("usage: ctorch bench generate")


@pytest.mark.parametrize("name,dtype", [("llama", torch.float32), ("qwen2", torch.bfloat16)])
def test_hf_directory_generate(tmp_path, name, dtype):
    # a Hugging Face directory through models.load and the CLI: the weights are read in place
    # from the mapped file, in their dtype (transformers loads them widened to f32)
    cfg = CONFIGS[name]
    ref.save_hf(tmp_path / "m", cfg, ref.random_weights(cfg, seed=5, std=0.3), dtype=dtype)
    hm = ref.load(tmp_path / "m")
    m = models.load(tmp_path / "m")
    eos = cfg["eos_token_id"]
    assert m.eos_token_id == eos
    ids = prompt(cfg, 2, 6, 8)
    got = m.generate(ids, 12)  # stops rows at config.json's eos_token_id, pads with it
    with torch.no_grad():      # transformers stops and pads the same way
        hf = hm.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=eos,
                         attention_mask=torch.ones_like(ids))
    assert torch.equal(got, hf)
    want = ref.greedy(hm, ids, 12)  # without EOS
    assert torch.equal(m.generate(ids, 12, use_cache=False), got)
    line = " ".join(map(str, ids[0].tolist()))
    a = gen_json(tmp_path / "m", "--prompt-ids", line, "--greedy", "--max-new-tokens", 12,
                 "--ignore-eos")
    assert a["new_ids"] == want[0, 6:].tolist()
    assert a["text"] == "".join(f"{t} " for t in a["new_ids"])  # no tokenizer.json: ids
    r = run("generate", "--model", tmp_path / "m", "--prompt", "hello", ok=False)
    assert r.returncode == 2 and "tokenizer.json" in r.stderr
    # a tokenizer.json ctorch cannot read: ids still work (with a warning), text does not
    (tmp_path / "m" / "tokenizer.json").write_text("{not json")
    b = run("generate", "--model", tmp_path / "m", "--prompt-ids", line, "--greedy", "--tokens", 12,
            "--ignore-eos", "--json")
    assert json.loads(b.stdout)["new_ids"] == a["new_ids"] and "warning" in b.stderr
    r = run("generate", "--model", tmp_path / "m", "--prompt", "hello", ok=False)
    assert r.returncode == 1 and "tokenizer.json" in r.stderr
