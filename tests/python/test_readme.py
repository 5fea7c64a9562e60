"""The README's C and Python examples run as written."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def blocks(lang):
    text = open(os.path.join(ROOT, "README.md")).read()
    return re.findall(r"```" + lang + r"\n(.*?)```", text, re.S)


def test_python_example(tmp_path):
    (code,) = blocks("python")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    a, b = map(float, r.stdout.split())
    assert abs(a - b) < 1e-4 * max(1.0, abs(b))


def test_c_example(tmp_path):
    (code,) = blocks("c")
    src = tmp_path / "example.c"
    src.write_text(code)
    lib = os.environ.get("CTORCH_LIB", os.path.join(ROOT, "build", "libctorch.so"))
    static = os.path.join(os.path.dirname(lib), "libctorch.a")
    exe = tmp_path / "example"
    cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "include"),
                         str(src), static, "-ljansson", "-lm", "-lpthread", "-ldl", "-o", str(exe)],
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert re.match(r"loss \d+\.\d+, dW\[0\] -?\d+\.\d+", r.stdout)
