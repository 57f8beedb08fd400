"""sglang-radix.py OUT.json [VERSION] — real SGLang KV-event streams from the release's own radix cache.

SGLang's CPU serving needs its CUDA kernel package (sglang-kernel) and a CUDA torch, so no SGLang
engine serves here (docs/sglang-engine.md). This harness runs, from the release wheel
(.cache/wheels/sglang-VERSION-*.whl, unmodified, imported with scripts/vecgen/wheel.py), what a
router sees of the engine: the radix cache (RadixCache.create_simulated, the engine's own
constructor without memory pools), its KV-event recorder and page hasher (the wheel's
hash_binding.cpp, compiled by scripts/vecgen/sglang.py), and the ZmqEventPublisher, whose PUB
socket a ZeroMQ SUB here reads. Each published message (topic, seq, payload) becomes one sample of
the vector schema, `source: engine`.

Run with the vllm environment's python (real torch, pyzmq and msgspec):
  .cache/py/vllm/bin/python scripts/sglang-radix.py vectors/sglang/v0.5.23/events-samples.json
The one stand-in besides the package __init__ files and pydantic: the KV pool allocator
(create_simulated takes a mock one; eviction calls its free_segment).
"""
import json
import os
import sys
import time
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "vecgen"))
import wheel as wheelmod  # noqa: E402
import sglang as sglangmod  # noqa: E402  (scripts/vecgen/sglang.py: the page hasher build)

import msgspec  # noqa: E402
import torch  # noqa: E402
import zmq  # noqa: E402

REAL = [
    "sglang.srt.mem_cache.radix_cache", "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.cache_init_params", "sglang.srt.mem_cache.events", "sglang.srt.mem_cache.utils",
    "sglang.srt.mem_cache.cpp_utils.native_hash", "sglang.srt.mem_cache.evict_policy",
    "sglang.srt.disaggregation.kv_events",
]
HEAVY = ["pydantic", "triton"]
PAGE = 4


class Allocator:
    """Stands in for the KV pool allocator: the radix cache frees an evicted node's pages here."""
    device = "cpu"

    def free_segment(self, *a, **k):
        pass


def main():
    out = sys.argv[1]
    version = sys.argv[2] if len(sys.argv) > 2 else "0.5.23"
    path, fname, sha = wheelmod.fetch("sglang", version)
    # The page hasher's build needs pybind11's headers: the vecgen environment has them.
    sys.path.append(os.path.join(HERE, "..", ".cache", "py", "vecgen", "lib", "python3.11", "site-packages"))
    so = sglangmod.build(path, sha)
    over = {"sglang.srt.utils.cpp_extension_loader": sglangmod._loader_stub(so, "sglang.srt.utils.cpp_extension_loader", "load_extension_with_recovery")}
    with wheelmod.Loader(path, "sglang", REAL, over, HEAVY) as ld:
        rc = ld.load("sglang.srt.mem_cache.radix_cache")
        bpc = ld.load("sglang.srt.mem_cache.base_prefix_cache")
        kve = ld.load("sglang.srt.disaggregation.kv_events")
        cache = rc.RadixCache.create_simulated(mock_allocator=Allocator(), page_size=PAGE, enable_kv_cache_events=True)

        ctx = zmq.Context.instance()
        pub = kve.ZmqEventPublisher(attn_dp_rank=0, endpoint="tcp://127.0.0.1:0", bind=True, topic="")
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub._local_pub_endpoint or pub._bound_endpoint(pub._pub))
        time.sleep(0.5)  # the SUB's subscription reaches the PUB

        samples = []

        def step(name, comment, flags, fn):
            fn()
            evs = cache.kv_events.take()
            pub.publish(kve.KVEventBatch(ts=time.time(), events=evs))
            topic, seq, payload = sub.recv_multipart()
            samples.append({"tcId": len(samples) + 1, "name": name, "comment": comment, "flags": flags, "result": "valid",
                            "frames": {"topic": topic.decode(), "seq": int.from_bytes(seq, "big"), "seqFrame": seq.hex()},
                            "payload": payload.hex(), "decoded": msgspec.msgpack.decode(payload)})

        def insert(tokens, salt=None):
            key = rc.RadixKey(array("q", tokens), cache_salt=salt)
            cache.insert(bpc.InsertParams(key=key, value=torch.arange(len(tokens), dtype=torch.int64)))

        a = [128000, 9906, 11, 1917, 0, 358, 1097, 264, 1296, 13, 4438, 527]
        step("startup_all_blocks_cleared", "The constructor's RadixCache.reset records AllBlocksCleared; the publisher sends it first.",
             ["Cleared"], lambda: None)
        step("stored_root_prompt", "A 12-token prompt inserted: its three 4-token pages in one BlockStored (the recorder coalesces a chain).",
             ["Coalesced"], lambda: insert(a))
        step("stored_shared_prefix_split", "A prompt sharing the first 8 tokens: the node splits (no event for the shared pages) and only the new page is stored, parented on page 2.",
             [], lambda: insert(a[:8] + [3923, 374, 279, 6864]))
        step("stored_salted", "The first prompt under cache_salt 'tenant-a': another namespace, its own pages.",
             ["CacheSalt"], lambda: insert(a, "tenant-a"))
        step("removed_eviction", "Eviction of 8 tokens: the two least recently used leaves (one page each) in one BlockRemoved.",
             ["Coalesced"], lambda: cache.evict(bpc.EvictParams(num_tokens=8)))
        step("cleared_reset", "A cache flush (reset): AllBlocksCleared.", ["Cleared"], lambda: cache.reset())
        pub.shutdown()
        stubs = ld.stub_list()

    doc = {
        "schema": "kvexact_vectors_v1.schema.json", "algorithm": "sglang_sha256", "engine": "sglang", "release": "v" + version,
        "commit": f"unknown (made from the released wheel {fname}, sha256 {sha}; no tag commit needed)",
        "source": "engine",
        "generator": [f"artifact: {fname} sha256 {sha} (pip download --no-deps sglang=={version})",
                      "events: the release's own RadixCache (create_simulated, page_size 4, KV events on) driven by insert/evict/reset, "
                      "its KVCacheEventRecorder and page hasher, published by its ZmqEventPublisher (msgspec " + msgspec.__version__ +
                      ") and read from the PUB socket by a ZeroMQ SUB (scripts/sglang-radix.py)",
                      "stand-ins (modules not run): " + "; ".join(stubs) + "; the KV pool allocator (a no-op free_segment)",
                      "ts values are the publisher's time.time()"],
        "header": [f"SGLang v{version} KV-event streams published by the release's radix cache and ZeroMQ publisher"],
        "keyType": "int64", "numberOfTests": len(samples),
        "notes": {"Cleared": {"description": "AllBlocksCleared: the engine dropped every block (start, cache flush)"},
                  "Coalesced": {"description": "one event carrying several blocks of one chain (or every block an eviction dropped)"},
                  "CacheSalt": {"description": "the request carries a cache salt"}},
        "testGroups": [{"type": "EventPayloadTest", "transport": "zmq", "layout": "map (v0.5.21+)", "tests": samples}],
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"sglang-radix: {len(samples)} samples into {out}")


if __name__ == "__main__":
    main()
