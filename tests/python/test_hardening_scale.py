"""Hostile sizes (issue 20 items 4 and 5): work and memory that grow faster than the input.
Each case runs the real `ctorch` binary in a child with resource limits, never a clock:
RLIMIT_AS bounds memory (an allocation sized from a lie fails, it does not swap), RLIMIT_FSIZE
bounds what it may write, and RLIMIT_CPU is a hang guard set at a size where the quadratic
code needs minutes of CPU and the linear code a second or two (each test says its margin).
The crafted files are built here (torch.save, the safetensors layout, json), nothing big is
committed; PyTorch, transformers and tokenizers are the oracles where a result is compared."""
import collections
import io
import json
import os
import pickle
import resource
import struct
import sys
import subprocess
import zipfile

import pytest
import torch
import transformers

from conftest import cli_path  # noqa: E402  (the one definition)

import tokenizers as hf

import ctorch.tokenizers as ctt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPS = os.environ.get("CTORCH_TEST_DEPS", os.path.join(ROOT, "build", "test-deps"))


def limited(*args, mem=1 << 30, cpu=60, fsize=64 << 20):
    """Run ctorch ARGS under RLIMIT_AS mem, RLIMIT_CPU cpu seconds and RLIMIT_FSIZE fsize."""
    def lim():
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    r = subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True,
                       preexec_fn=lim, timeout=20 * cpu)
    assert r.returncode >= 0, f"ctorch {' '.join(map(str, args))} was killed by signal {-r.returncode} " \
                              f"(SIGXCPU: the CPU guard; SIGXFSZ: the write guard)\n{r.stderr[-2000:]}"
    return r


# ---- item 4: a .pt state dict is checked against its configuration before the model exists ---

def big_llama_config():
    """What transformers writes for a Llama of 8192 wide, 128256 tokens: 15 GB of f32."""
    c = transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=2,
                                 num_attention_heads=64, num_key_value_heads=8, vocab_size=128256)
    c.architectures = ["LlamaForCausalLM"]
    return json.loads(c.to_json_string())


@pytest.mark.parametrize("cmd", ["generate", "convert"])
def test_pt_shapes_checked_before_the_model_is_allocated(tmp_path, cmd):
    p = tmp_path / "sd.pt"
    torch.save({"config": big_llama_config(), "model": {"model.embed_tokens.weight": torch.zeros(4, 4)}}, p)
    assert p.stat().st_size < 64 << 10
    args = ["generate", "--model", p, "--prompt-ids", "1"] if cmd == "generate" else ["convert", p, tmp_path / "out"]
    r = limited(*args, mem=1 << 30)
    assert r.returncode == 1, r.stderr
    assert "model.model.embed_tokens.weight" in r.stderr and "[4, 4]" in r.stderr
    assert "[128256, 8192]" in r.stderr, r.stderr
    assert "CT_ENOMEM" not in r.stderr and "refused" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_pt_dtype_checked_before_the_model_is_allocated(tmp_path):
    cfg = big_llama_config()
    p = tmp_path / "sd.pt"
    torch.save({"config": cfg, "model": {"model.embed_tokens.weight":
                                         torch.zeros(1, 8192, dtype=torch.int64).expand(128256, 8192)}}, p)
    r = limited("generate", "--model", p, "--prompt-ids", "1", mem=1 << 30)
    assert r.returncode == 1 and "model.model.embed_tokens.weight" in r.stderr, r.stderr
    assert "dtype" in r.stderr and "I64" in r.stderr, r.stderr


# ---- item 5: .pt open is linear in its storages ----------------------------------------------

class _Storage:
    def __init__(self, key, numel):
        self.key, self.numel = key, numel


class _Tensor:
    def __init__(self, st):
        self.st = st

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, (self.st, 0, (1,), (1,), False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel) if isinstance(obj, _Storage) else None


def many_storages_pt(path, n, key_len):
    """torch.save's zip layout for n one-element tensors, each its own storage under a key of
    key_len characters that differ only at the end (torch.save itself takes minutes for this)."""
    keys = [("k" * key_len + str(i))[-key_len:] for i in range(n)]
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump({f"t{i}": _Tensor(_Storage(k, 1)) for i, k in enumerate(keys)})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        for i, k in enumerate(keys):
            z.writestr(f"archive/data/{k}", struct.pack("<f", i))
        z.writestr("archive/version", "3\n")
    return keys


def test_pt_open_is_linear_in_storages(tmp_path):
    # 60k storages with 190-character keys: the search per storage (and per zip member) compared
    # n^2 / 2 keys twice over, 3.6e9 long strcmp: more than 95 s of CPU measured (15k: 3.9 s);
    # the hash maps take 0.4 s. The guard (30 s CPU) is 75x that and a third of the quadratic
    # cost.
    p = tmp_path / "many.pt"
    n = 60000
    many_storages_pt(p, 30, 190)
    small = torch.load(p, weights_only=True)  # the oracle reads the crafted layout too
    assert [small[f"t{i}"].item() for i in range(30)] == list(range(30))
    many_storages_pt(p, n, 190)
    r = limited("inspect", p, cpu=30, mem=2 << 30)
    assert r.returncode == 0, r.stderr
    assert f"total   {n} tensors" in r.stdout


# ---- item 5: added tokens through a trie, leftmost-longest as Hugging Face's ---------------

def added_tokens_tokenizer(tmp_path, n):
    src = os.path.join(DEPS, "gpt2-hf", "tokenizer.json")
    assert os.path.isfile(src), f"{src} is missing: run bash scripts/fetch_test_deps.sh"
    oracle = hf.Tokenizer.from_file(src)
    extra = ["ab", "abc", "bcd", "<x1", "<x12", "x12>", "<<", "<x1><x1>", "\u00e9t\u00e9", "\u65e5\u672c"]
    oracle.add_tokens([hf.AddedToken(f"<x{i}>", normalized=False) for i in range(n)] +
                      [hf.AddedToken(t, normalized=False) for t in extra])
    p = tmp_path / "tokenizer.json"
    oracle.save(str(p))
    return oracle, p


def test_added_tokens_match_hf_and_are_linear(tmp_path):
    n = 100000
    oracle, p = added_tokens_tokenizer(tmp_path, n)
    tok = ctt.load(str(p))
    texts = ["<x1><x12><x123>x<x99999><x100000> <x", "abcd abc bcdab <x12> <x12 x12> <<x1>>",
             "<x1><x1><x1> <<<x5>>> \u00e9t\u00e9\u65e5\u672c\u8a9e <x0>\n<x7>\t<x77777>",
             " ".join(f"<x{i * 7919 % (n + 50)}>" for i in range(400)) + "<x" * 50]
    for t in texts:
        assert tok.encode(t, add_special_tokens=False) == oracle.encode(t, add_special_tokens=False).ids, t[:80]
    # 2 MiB of near misses: every '<' starts 100k candidates for a scan by first byte (1 MiB:
    # 62 s of CPU measured), two trie steps here (0.6 s, most of it loading the 100k tokens).
    # Guard: 30 s CPU, 40x what the trie needs and a quarter of the scan's.
    f = tmp_path / "text.txt"
    f.write_text(("<y<x" + "a" * 12 + " ") * (1 << 17))
    r = limited("tokenizer", "encode", "--tokenizer", p, "--file", f, cpu=30, mem=2 << 30)
    assert r.returncode == 0, r.stderr
    head = f.read_text()[:4000]
    assert [int(x) for x in r.stdout.split()][:200] == oracle.encode(head, add_special_tokens=False).ids[:200]


# ---- item 5: convert bounds broadcast views by the output size limit ------------------------

def test_convert_refuses_a_huge_broadcast_view(tmp_path):
    p = tmp_path / "bcast.pt"
    torch.save({"w": torch.zeros(1).expand(1 << 20, 1 << 20)}, p)
    assert p.stat().st_size < 2048
    out = tmp_path / "o.safetensors"
    r = limited("convert", p, out, fsize=64 << 20)  # the old code wrote until SIGXFSZ here
    assert r.returncode == 1, r.stderr
    assert "'w'" in r.stderr and "[1048576, 1048576]" in r.stderr and "1073741824" in r.stderr, r.stderr
    assert not out.exists() or out.stat().st_size == 0


def test_convert_writes_a_small_broadcast_view(tmp_path):
    from safetensors.torch import load_file
    t = torch.arange(4.0).expand(3, 4)
    p = tmp_path / "small.pt"
    torch.save({"w": t, "v": torch.ones(2, 1).expand(2, 5)}, p)
    out = tmp_path / "o.safetensors"
    r = limited("convert", p, out)
    assert r.returncode == 0, r.stderr
    got = load_file(str(out))
    assert torch.equal(got["w"], t.contiguous()) and torch.equal(got["v"], torch.ones(2, 5))


# ---- item 5: a safetensors header of millions of empty tensors ------------------------------

def test_safetensors_tensor_count_is_bounded(tmp_path):
    # 2^19 + 2 empty tensors in a 31 MB header (the scan allows one key more, for
    # __metadata__): parsed, the JSON tree alone is ~700 MB; the count is found in the byte scan
    # before it. 512 MiB of address space holds the refusal.
    n = (1 << 19) + 2
    body = ",".join(f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(n))
    h = ("{" + body + "}").encode()
    p = tmp_path / "many.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h)
    r = limited("inspect", p, mem=512 << 20, cpu=30)
    assert r.returncode != 0
    assert "more than 524288 tensors" in r.stderr, r.stderr[-2000:]


# ---- item 5: a Hugging Face index far larger than its configuration's tensors ---------------

def test_hf_index_bounded_by_the_configuration(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    c = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    c.architectures = ["LlamaForCausalLM"]
    (d / "config.json").write_text(c.to_json_string())
    # 200k entries over 4096 shard names: 9 MB that the old code parsed into a JSON tree and
    # searched entry x shard (0.8e9 compares) before finding no shard file
    wm = {f"t{i}": f"model-{i % 4096:05d}-of-04096.safetensors" for i in range(200000)}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    r = limited("convert", d, tmp_path / "o.safetensors", mem=256 << 20, cpu=20)
    assert r.returncode == 1
    assert "model.safetensors.index.json has" in r.stderr and "21 tensors" in r.stderr, r.stderr


def test_models_load_checks_before_the_model_is_allocated(tmp_path):
    """ctorch.models.load of the same file: the binding checks through the library first."""
    p = tmp_path / "sd.pt"
    torch.save({"config": big_llama_config(), "model": {"model.embed_tokens.weight": torch.zeros(4, 4)}}, p)
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
            "import ctorch.models as M\n"
            "try:\n"
            "    M.load(sys.argv[1])\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, env=env, timeout=300)
    assert "[4, 4]" in r.stdout and "[128256, 8192]" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "MemoryError" not in r.stdout
