"""KV-event payloads encoded by a release's own event classes and msgspec.

For a project sample file (an EventPayloadTest group), each test's `decoded` batch is built from the
release's own KVEventBatch and event classes (see _batch) and encoded with
msgspec.msgpack.Encoder(), as the engine's ZmqEventPublisher does. The payload is the encoder's
output; `decoded` is what msgspec decodes it back to untyped.
"""
import msgspec

from wheel import Loader

MODULES = {"vllm": "vllm.distributed.kv_events", "sglang": "sglang.srt.disaggregation.kv_events"}
REAL = {"vllm": ["vllm.distributed.kv_events", "vllm.v1.core.kv_cache_utils", "vllm.utils.hashing"],
        "sglang": ["sglang.srt.disaggregation.kv_events"]}
HEAVY = ["torch", "numpy", "PIL", "zmq", "pydantic", "transformers", "triton", "psutil", "regex", "huggingface_hub"]


def encode(engine, wheel, tests):
    """[(name, payload bytes, decoded builtins)] for each test, and the stand-ins used."""
    with Loader(wheel, engine, REAL[engine] + (["vllm.multimodal.utils"] if engine == "vllm" else []),
                {"vllm.envs": _envs} if engine == "vllm" else {}, HEAVY) as ld:
        ev = ld.load(MODULES[engine])
        enc = msgspec.msgpack.Encoder()
        out = []
        for t in tests:
            batch = _batch(ev, t["decoded"])
            payload = enc.encode(batch)
            out.append((t["name"], payload, msgspec.msgpack.decode(payload)))
        stubs = ld.stub_list()
    return out, stubs


def _batch(ev, decoded):
    """The release's KVEventBatch built as its publisher builds one: the event classes called with
    the fields (constructors do not validate; SGLang's bigram stores carry [t, t+1] pairs in a field
    annotated list[int]); a field the class lacks is a TypeError."""
    ts, events, rank = (list(decoded) + [None])[:3]
    objs = []
    for e in events:
        e = dict(e)
        cls = getattr(ev, e.pop("type"))
        objs.append(cls(**e))
    return ev.KVEventBatch(ts, objs, rank)


def _envs(m):
    """vllm.envs: VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES at its default (1: events carry 64-bit keys)"""
    m.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True
