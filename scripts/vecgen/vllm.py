"""vLLM block-hash vectors made by a release's own functions, imported from its wheel.

For each case of vllm-cases.json and each algorithm the release offers (get_hash_fn_by_name), the
release's init_none_hash roots the chain (PYTHONHASHSEED set or removed in os.environ first, as the
engine reads it), its get_request_block_hasher hashes the request (prompt first, then one token at a
time for decode cases, as the scheduler calls it), its generate_block_hash_extra_keys gives the
extra keys used, maybe_convert_block_hash the published 64-bit keys and BlockHashListWithBlockSize a
coarser KV-cache group's hashes. The output is vLLM's case layout (vectors/vllm/v0.25.1/README.md),
which cmd/vecgen -convert turns into the project's schema.
"""
import os
import pickle

import cbor2

from wheel import Loader

# Imported by the modules above (or by what they import) and never needed for hashing.
HEAVY = ["torch", "numpy", "PIL", "zmq", "pydantic", "transformers", "triton", "psutil", "regex", "huggingface_hub"]

REAL = ["vllm.utils.hashing", "vllm.v1.core.kv_cache_utils", "vllm.utils.math_utils"]


def _envs(m):
    """vllm.envs: VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES at its default (1: events carry 64-bit keys)"""
    m.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True


def _v1_utils(m):
    """vllm.v1.utils: tensor_data(rows) = the rows' raw bytes (the prompt-embedding rows are bytes here, not a tensor)"""
    m.tensor_data = lambda rows: b"".join(rows)



class Rows(list):
    """Prompt-embedding rows: slicing gives rows, as a tensor's first dimension does."""

    def __getitem__(self, k):
        r = list.__getitem__(self, k)
        return Rows(r) if isinstance(k, slice) else r


class Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _request(case, tokens):
    r = case.get("request") or {}
    lora = None
    if "loraName" in r:
        lora = Obj(lora_name=r["loraName"], lora_int_id=r.get("loraIntId", 1), lora_path=r.get("loraPath", ""),
                   name=r["loraName"], path=r.get("loraPath", ""), adapter_id=r.get("loraIntId", 1))
    mm = [Obj(identifier=f["identifier"], mm_hash=f["identifier"],
              mm_position=Obj(offset=f["offset"], length=f["length"], is_embed=None))
          for f in r.get("mmFeatures", [])]
    embeds = None
    if "promptEmbedsRows" in r:
        embeds = Rows(bytes.fromhex(x) for x in r["promptEmbedsRows"])
    return Obj(all_token_ids=list(tokens), num_tokens=len(tokens), block_hashes=[], mm_features=mm,
               lora_request=lora, cache_salt=r.get("cacheSalt"), prompt_embeds=embeds,
               _prompt_embeds_per_block_hashes={}, request_id="vecgen")


def _jsonable(v):
    if v is None or isinstance(v, (str, int)):
        return v
    if isinstance(v, bytes):
        return {"$bytes": v.hex()}
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    raise TypeError(f"extra key of type {type(v)}")


class _Recorder:
    """Stands between the hashing module and pickle/cbor2 to keep each serialized pre-image."""

    def __init__(self, mod):
        self.mod, self.seen = mod, []

    def dumps(self, *a, **k):
        b = self.mod.dumps(*a, **k)
        self.seen.append(b)
        return b

    def __getattr__(self, n):
        return getattr(self.mod, n)


def generate(wheel, version, cases, functions):
    """The case files of one release: {algorithm: original-layout dict}, and the stand-ins used."""
    overrides = {"vllm.envs": _envs, "vllm.v1.utils": _v1_utils}
    real = list(REAL)
    with Loader(wheel, "vllm", real + ["vllm.multimodal.utils"], overrides, HEAVY) as ld:
        try:
            ld.load("vllm.multimodal.utils")
        except Exception:  # older releases do not use it from kv_cache_utils
            pass
        hashing = ld.load("vllm.utils.hashing")
        kcu = ld.load("vllm.v1.core.kv_cache_utils")
        rec_p, rec_c = _Recorder(pickle), _Recorder(cbor2)
        hashing.pickle, hashing.cbor2 = rec_p, rec_c
        algorithms = [a for a in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "sha256_msgpack", "xxhash_msgpack")
                      if _offers(hashing, a)]
        out = {}
        for algo in algorithms:
            hash_fn = hashing.get_hash_fn_by_name(algo)
            out[algo] = [_case(kcu, hash_fn, algo, c, (rec_p, rec_c)) for c in cases]
        stubs = ld.stub_list()
    used = [f for f in functions if hasattr(kcu, f) or hasattr(hashing, f)]
    return out, stubs, used


def _offers(hashing, algo):
    try:
        hashing.get_hash_fn_by_name(algo)
        return True
    except (ValueError, KeyError):
        return False


def _root(kcu, hash_fn, seed):
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed
    kcu.init_none_hash(hash_fn)
    return kcu.NONE_HASH


def _case(kcu, hash_fn, algo, c, recs):
    seed, bs, tokens = c["seed"], c["blockSize"], c["tokens"]
    root = _root(kcu, hash_fn, seed)
    reproducible = _root(kcu, hash_fn, seed) == root
    for r in recs:
        r.seen.clear()
    used = []
    orig = kcu.generate_block_hash_extra_keys

    def extra_keys(request, start, end, mm_idx):
        keys, nxt = orig(request, start, end, mm_idx)
        used.append(keys)
        return keys, nxt

    kcu.generate_block_hash_extra_keys = extra_keys
    try:
        hasher = kcu.get_request_block_hasher(bs, hash_fn)
        plen = c.get("promptLength", len(tokens))
        req = _request(c, tokens[:plen])
        req.block_hashes.extend(hasher(req))
        for t in tokens[plen:]:
            req.all_token_ids.append(t)
            req.num_tokens += 1
            req.block_hashes.extend(hasher(req))
    finally:
        kcu.generate_block_hash_extra_keys = orig
    hashes = list(req.block_hashes)
    preimages = [b for r in recs for b in r.seen]
    # One shot: the extra keys of the whole token list from item 0 (what BlockStored carries).
    one = _request(c, tokens)
    one_shot, idx = [], 0
    for b in range(len(tokens) // bs):
        k, idx = orig(one, b * bs, (b + 1) * bs, idx)
        one_shot.append(k)

    req_out = {}
    r = c.get("request") or {}
    for src, dst in (("loraName", "lora_name"), ("loraIntId", "lora_int_id"), ("loraPath", "lora_path"),
                     ("cacheSalt", "cache_salt"), ("mmFeatures", "mm_features"), ("promptEmbedsRows", "prompt_embeds_rows_hex")):
        if src in r:
            req_out[dst] = r[src]
    out = {"name": c["name"], "hash_algo": algo, "block_size": bs, "hash_seed": seed}
    if seed is None and reproducible and hasattr(kcu, "get_none_hash_seed"):
        out["none_hash_seed"] = kcu.get_none_hash_seed()
    out["reproducible"] = reproducible
    out["token_ids"] = tokens
    if "promptLength" in c:
        out["prompt_len"] = c["promptLength"]
    if "groupBlockSize" in c:
        out["group_block_size"] = c["groupBlockSize"]
    if req_out:
        out["request"] = req_out
    out["extra_keys"] = [_jsonable(k) for k in used]
    if [_jsonable(k) for k in one_shot] != out["extra_keys"]:
        out["extra_keys_one_shot"] = [_jsonable(k) for k in one_shot]
    if c.get("comment"):
        out["note"] = c["comment"]
    exp = {"num_full_blocks": len(hashes)}
    if reproducible:
        exp["none_hash_hex"] = root.hex()
        exp["block_hashes_hex"] = [h.hex() for h in hashes]
        exp["block_hashes_u64"] = [kcu.maybe_convert_block_hash(h) for h in hashes]
        if hashes:
            exp["first_block_preimage_hex"] = preimages[0].hex()
        if "groupBlockSize" in c:
            g = list(kcu.BlockHashListWithBlockSize(hashes, bs, c["groupBlockSize"]))
            exp["group_block_hashes_hex"] = [h.hex() for h in g]
            exp["group_block_hashes_u64"] = [kcu.maybe_convert_block_hash(h) for h in g]
    out["expected"] = exp
    return out
