"""SGLang page hashes made by a release's own code, imported from its wheel.

SGLang hashes pages in C++ (sglang/srt/mem_cache/cpp_utils/hash_binding.cpp, a pybind11 module its
loader compiles with torch's cpp_extension at run time). Here the wheel's hash_binding.cpp is
compiled unmodified with g++ and pybind11 (the one stand-in: the loader that would have called
torch), and the wheel's own Python (get_native_hash, get_hash_str, compute_node_event_hash_values,
hash_str_to_int64) runs on it. Page hashes of one case come from compute_node_event_hash_values on a
root node holding the case's tokens (what the radix cache publishes in BlockStored).
"""
import hashlib
import importlib.util
import os
import subprocess
import sysconfig
import zipfile
from array import array

from wheel import WHEELS, Loader

HEAVY = ["torch", "numpy", "pydantic", "zmq", "triton", "psutil", "transformers", "orjson", "requests",
         "aiohttp", "fastapi", "uvicorn", "huggingface_hub", "PIL", "einops", "setproctitle"]
BINDING = "sglang/srt/mem_cache/cpp_utils/hash_binding.cpp"


def build(wheel, sha):
    """The wheel's hash_binding.cpp compiled as a Python extension, cached by the wheel's digest."""
    import pybind11
    out = os.path.join(WHEELS, "build", sha[:16])
    so = os.path.join(out, "hicache_hash_cpp" + sysconfig.get_config_var("EXT_SUFFIX"))
    if os.path.exists(so):
        return so
    os.makedirs(out, exist_ok=True)
    src = os.path.join(out, "hash_binding.cpp")
    with zipfile.ZipFile(wheel) as z, open(src, "wb") as f:
        f.write(z.read(BINDING))
    cmd = ["g++", "-w", "-O3", "-std=c++17", "-DNDEBUG", "-mavx2", "-shared", "-fPIC",
           "-DTORCH_EXTENSION_NAME=hicache_hash_cpp", f"-I{pybind11.get_include()}",
           f"-I{sysconfig.get_paths()['include']}", src, "-o", so + ".tmp", "-lcrypto"]
    subprocess.run(cmd, check=True)
    os.replace(so + ".tmp", so)
    return so


def _loader_stub(so, module, function):
    """The C++ extension loader native_hash.py calls (v0.5.18: torch.utils.cpp_extension.load; later:
    sglang.srt.utils.cpp_extension_loader.load_extension_with_recovery), answering with the wheel's
    hash_binding.cpp compiled by build()."""
    def fill(m):
        def load(name, **kw):
            spec = importlib.util.spec_from_file_location(name, so)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
        setattr(m, function, load)
    fill.__doc__ = (f"{module}.{function} imports the wheel's hash_binding.cpp compiled unmodified by "
                    "g++ -O3 -std=c++17 -DNDEBUG -mavx2 with pybind11 and OpenSSL (torch's extension builder not run)")
    return fill


class Key(list):
    """A RadixKey's view for the hashers: the tokens, the namespace, bigram units."""

    def __init__(self, tokens, salt=None, bigram=False):
        super().__init__(tokens)
        self.token_ids, self.cache_salt, self.extra_key, self.is_bigram = list(tokens), salt, None, bigram

    def __len__(self):
        n = list.__len__(self)
        return max(n - 1, 0) if self.is_bigram else n

    def raw_token_ids(self):
        return array("q", self.token_ids)


class Node:
    def __init__(self, key):
        self.key, self.parent, self.hash_value, self.event_hash_value = key, None, None, None


def generate(wheel, sha, cases):
    """{case name: (published page hashes hex, their int64 keys, salt root hex or None)}, stand-ins."""
    so = build(wheel, sha)
    real = ["sglang.srt.mem_cache.utils", "sglang.srt.mem_cache.cpp_utils.native_hash"]
    with zipfile.ZipFile(wheel) as z:
        native = z.read("sglang/srt/mem_cache/cpp_utils/native_hash.py").decode()
    if "cpp_extension_loader" in native:
        over = {"sglang.srt.utils.cpp_extension_loader": _loader_stub(so, "sglang.srt.utils.cpp_extension_loader", "load_extension_with_recovery")}
    else:
        over = {"torch.utils.cpp_extension": _loader_stub(so, "torch.utils.cpp_extension", "load")}
    with Loader(wheel, "sglang", real, over, HEAVY) as ld:
        utils = ld.load("sglang.srt.mem_cache.utils")
        out = {}
        for c in cases:
            salt = c.get("cache_salt") or None  # RadixKey keeps cache_salt or None
            bigram, ps, toks = c.get("bigram", False), c["page_size"], c["token_ids"]
            # The radix cache inserts page-aligned keys only (RadixKey.page_aligned): full pages.
            units = max(len(toks) - 1, 0) if bigram else len(toks)
            full = units // ps * ps
            key = Key(toks[: full + 1] if bigram and full else toks[:full], salt, bigram)
            # No full page: the radix cache inserts nothing and publishes nothing.
            hashes = utils.compute_node_event_hash_values(Node(key), ps) if full else []
            root = hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode()).hexdigest() if salt else None
            out[c["name"]] = (list(hashes), [utils.hash_str_to_int64(h) for h in hashes], root)
        stubs = ld.stub_list()
    return out, stubs
