#!/usr/bin/python3
"""Writes vectors/vllm/v0.29.0/hybrid-samples.json: vLLM event streams of two hybrid models (full
attention + sliding window; full attention + Mamba) with, per prompt, the prefix hit vLLM's own
hit rule gives on the blocks those events leave cached.

Usage: /usr/bin/python3 scripts/vllm-hybrid-samples.py ENGINE_RULE.py > vectors/vllm/v0.29.0/hybrid-samples.json

ENGINE_RULE.py is a scratch module (never committed) holding vLLM's own functions transcribed
unmodified from the public code index: FullAttentionManager, SlidingWindowManager and
MambaManager.find_longest_cache_hit (vllm/v1/core/single_type_kv_cache_manager.py @ 129ab7c) and
HybridKVCacheCoordinator.find_longest_cache_hit (vllm/v1/core/kv_cache_coordinator.py @ 00b08dc),
with stand-ins for their imports (a block pool that answers get_cached_block from the groups'
held hashes, spec classes with block_size / sliding_window, and an adapter between the two
commits' manager signatures). This script is ours: it builds the events, replays them into the
held sets as vLLM's BlockPool would (a store caches a block per group, a removal evicts it), and
asks the engine's functions for the hit.

Hashes: sha256_cbor with PYTHONHASHSEED unset (v0.29+: the root is sha256_cbor("vllm-none-hash")),
checked against vectors/vllm/v0.29.0/sha256_cbor.json before anything is written. Payloads:
python3-msgpack packb(use_bin_type=True) on maps laid out as msgspec encodes vLLM's structs
(tag=True, omit_defaults=True), as events-samples.json.
"""
import hashlib
import importlib.util
import json
import os
import sys

import cbor2
import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
VEC = os.path.join(HERE, "..", "vectors", "vllm", "v0.29.0")


def h(obj):
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


ROOT = h("vllm-none-hash")


def chain(tokens, bs):
    """vLLM's request block hasher: full blocks of bs tokens, hash_block_tokens(parent, tuple, None)."""
    out, parent = [], ROOT
    for i in range(0, len(tokens) - bs + 1, bs):
        parent = h((parent, tuple(tokens[i : i + bs]), None))
        out.append(parent)
    return out


def key(digest):
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)  # maybe_convert_block_hash


def check_hashing():
    ref = json.load(open(os.path.join(VEC, "sha256_cbor.json")))
    for g in ref["testGroups"]:
        for t in g["tests"]:
            if t["name"] == "seed_unset_bs16":
                got = [key(d) for d in chain(t["tokens"], g["blockSize"])]
                assert got == t["expected"]["keys"], (got, t["expected"]["keys"])
                return
    raise SystemExit("seed_unset_bs16 not found")


def stored(keys, tokens, bs, group, kind, window=None, parent=None):
    ev = {"type": "BlockStored", "block_hashes": keys, "parent_block_hash": parent, "token_ids": tokens,
          "block_size": bs, "lora_id": None, "medium": "GPU", "lora_name": None,
          "extra_keys": [None] * len(keys), "group_idx": group, "kv_cache_spec_kind": kind}
    if window is not None:
        ev["kv_cache_spec_sliding_window"] = window
    return ev


def removed(keys, group):
    return {"type": "BlockRemoved", "block_hashes": keys, "medium": "GPU", "group_idx": group}


class Model:
    """A hybrid model's groups as vLLM's coordinator sees them."""

    def __init__(self, er, groups, hash_bs):
        self.er, self.groups, self.hash_bs = er, groups, hash_bs  # groups: [(spec, manager)]
        self.held = {}

    def apply(self, events):
        for ev in events:
            s = self.held.setdefault(ev["group_idx"], set())
            for k in ev["block_hashes"]:
                (s.add if ev["type"] == "BlockStored" else s.discard)(k)

    def hit(self, prompt):
        er = self.er
        from math import lcm

        class Self:
            pass

        me = Self()
        me.kv_cache_config = Self()
        me.kv_cache_config.kv_cache_groups = self.groups
        specs = {}
        for gi, (spec, mgr) in enumerate(self.groups):  # verify_and_split_kv_cache_groups
            specs.setdefault((type(spec), tuple(sorted(spec.__dict__.items()))), (spec, [], mgr))[1].append(gi)
        me.attention_groups = [er.SpecGroup(sp, ids, er._adapt(m), False) for sp, ids, m in specs.values()]
        me.attention_groups.sort(key=lambda g: not isinstance(g.spec, er.FullAttentionSpec))
        me.single_type_managers = []
        for spec, _ in self.groups:
            m = Self()
            m.block_size, m.dcp_world_size, m.pcp_world_size = spec.block_size, 1, 1
            me.single_type_managers.append(m)
        me.block_pool = er.BlockPool({g: self.held.get(g, set()) for g in range(len(self.groups))})
        me.hash_block_size = self.hash_bs
        me.enable_partial_hash_hits = False
        me._cache_hit_alignment_tokens = lcm(*[s.block_size for s, _ in self.groups])
        hashes = [key(d) for d in chain(prompt, self.hash_bs)]
        # The scheduler asks for at most num_tokens - 1 (the last token is always computed).
        _, n, _ = er.find_longest_cache_hit(me, hashes, len(prompt) - 1)
        # Full attention alone: the first group's manager over the same hashes.
        full, _ = er._adapt(er.FullAttentionManager).find_longest_cache_hit(
            drop_eagle_block=False, block_hashes=hashes, hash_block_size=self.hash_bs,
            max_length=len(prompt) - 1, kv_cache_group_ids=[0], block_pool=me.block_pool,
            kv_cache_spec=self.groups[0][0], alignment_tokens=self.groups[0][0].block_size)
        return n, len(full[0]) * self.groups[0][0].block_size


def main():
    spec = importlib.util.spec_from_file_location("engine_rule", sys.argv[1])
    er = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(er)
    check_hashing()
    tests, notes = [], {
        "SlidingWindowGroup": "a sliding-window KV-cache group's events beside the full-attention group's",
        "MambaGroup": "a Mamba (linear-attention) KV-cache group's events beside the full-attention group's: only checkpointed blocks are stored",
        "FullAttentionOverPredicts": "at least one prompt where the full-attention group alone would predict a longer hit than the engine's rule gives",
        "EngineRootSeed": "seed unset: the engine resolved its own root seed (the group's rootSeed)",
    }

    def add(name, comment, flags, model, events, prompts):
        model.apply(events)
        payload = msgpack.packb([1764590400.5, events, None], use_bin_type=True)
        hits = []
        for pname, pcomment, prompt in prompts:
            n, full = model.hit(prompt)
            lim = None
            if n < full:
                lim = next(gi for gi, (s, _) in enumerate(model.groups) if not isinstance(s, er.FullAttentionSpec))
            hits.append({"name": pname, "comment": pcomment, "hashBlockSize": model.hash_bs, "prompt": prompt,
                         "expected": {"hitTokens": n, "fullAttentionTokens": full, "limitingGroup": lim}})
        if "FullAttentionOverPredicts" in flags:
            assert any(x["expected"]["hitTokens"] < x["expected"]["fullAttentionTokens"] for x in hits), name
        tests.append({"tcId": len(tests) + 1, "name": name, "comment": comment, "flags": flags, "result": "valid",
                      "frames": {"topic": "", "seq": len(tests), "seqFrame": "%016x" % len(tests)},
                      "payload": payload.hex(), "decoded": [1764590400.5, events, None], "prefixHits": hits})

    # gpt-oss-like: full attention + sliding window of 128 tokens, block 16 (8 blocks of window).
    bs, win = 16, 128
    doc = list(range(100, 100 + 20 * bs + 5))  # 20 full blocks and 5 tokens
    keys = [key(d) for d in chain(doc, bs)]
    toks = doc[: 20 * bs]
    other = doc[: 12 * bs] + list(range(9000, 9000 + 8 * bs + 3))  # shares 12 blocks

    def swa_model():
        return Model(er, [(er.FullAttentionSpec(bs), er.FullAttentionManager),
                          (er.SlidingWindowSpec(bs, sliding_window=win), er.SlidingWindowManager)], bs)

    base = [stored(keys, toks, bs, 0, "full_attention"), stored(keys, toks, bs, 1, "sliding_window", win)]
    add("swa_all_held", "full attention and the sliding-window group (window 128) hold the 20 blocks of a prompt",
        ["SlidingWindowGroup", "EngineRootSeed"], swa_model(), base,
        [("same_prompt", "the cached prompt again: every group agrees on 20 blocks", doc),
         ("diverging_at_12", "a prompt sharing 12 blocks: the window before block 12 is held", other)])
    add("swa_tail_evicted", "the sliding-window group evicted blocks 12-19 (its tail) while full attention kept them",
        ["SlidingWindowGroup", "FullAttentionOverPredicts", "EngineRootSeed"], swa_model(),
        base + [removed(keys[12:], 1)],
        [("same_prompt", "full attention says 20 blocks; the last 8 held sliding blocks end at block 12", doc)])
    add("swa_head_evicted", "the sliding-window group evicted blocks 0-9, outside the window of the prompt's end",
        ["SlidingWindowGroup", "EngineRootSeed"], swa_model(), base + [removed(keys[:10], 1)],
        [("same_prompt", "the window's 8 blocks before block 20 are held: 20 blocks, as full attention says", doc),
         ("diverging_at_12", "at 12 blocks the window needs blocks 4-11, of which 4-9 are gone: the held run 10-11 does not start at 0", other)])
    add("swa_window_one_short", "the sliding-window group lost block 12 alone: blocks 13-19 are one short of the window",
        ["SlidingWindowGroup", "FullAttentionOverPredicts", "EngineRootSeed"], swa_model(),
        base + [removed(keys[12:13], 1)],
        [("same_prompt", "7 held blocks after the hole are one fewer than the 8 the window needs; 4-11 are 8: the hit ends at 12", doc)])
    add("swa_hole", "the sliding-window group lost block 15 alone",
        ["SlidingWindowGroup", "FullAttentionOverPredicts", "EngineRootSeed"], swa_model(),
        base + [removed(keys[15:16], 1)],
        [("same_prompt", "blocks 16-19 are only 4 of the 8 the window needs; 7-14 are 8: the hit ends at 15", doc)])

    # Qwen3-Next-like: full attention + Mamba (linear attention, "align" mode), block 32 both.
    bs = 32
    doc = list(range(200, 200 + 12 * bs + 7))
    keys = [key(d) for d in chain(doc, bs)]
    toks = doc[: 12 * bs]
    div8 = doc[: 8 * bs] + list(range(7000, 7000 + 4 * bs + 1))

    def mamba_model():
        return Model(er, [(er.FullAttentionSpec(bs), er.FullAttentionManager),
                          (er.MambaSpec(bs), er.MambaManager)], bs)

    full = stored(keys, toks, bs, 0, "full_attention")
    # Mamba caches only the state blocks a step ended on: one BlockStored per checkpoint, its
    # token_ids those of the blocks since the parent (null blocks skipped), as cache_full_blocks.
    ck11 = stored([keys[11]], toks, bs, 1, "mamba")
    add("mamba_one_checkpoint", "a 12-block prefill in one step: full attention holds 12 blocks, Mamba the state after block 11",
        ["MambaGroup", "FullAttentionOverPredicts", "EngineRootSeed"], mamba_model(), [full, ck11],
        [("same_prompt", "the state at 12 blocks matches: 12", doc),
         ("diverging_at_8", "full attention shares 8 blocks, but Mamba has no state at or before block 8: no hit", div8)])
    ck5 = stored([keys[5]], toks[: 6 * bs], bs, 1, "mamba")
    ck11b = stored([keys[11]], toks[6 * bs :], bs, 1, "mamba", parent=keys[5])
    add("mamba_chunked_checkpoints", "a chunked prefill (chunks of 6 blocks): Mamba states after blocks 5 and 11",
        ["MambaGroup", "FullAttentionOverPredicts", "EngineRootSeed"], mamba_model(), [full, ck5, ck11b],
        [("diverging_at_8", "the last state within the 8 shared blocks is after block 5: 6", div8)])

    out = {
        "schema": "kvexact_vectors_v1.schema.json", "algorithm": "sha256_cbor", "engine": "vllm", "release": "v0.29.0",
        "commit": "unknown (tag commit not verified; see contracts/data/vllm-v0.29.yaml)", "source": "reconstructed",
        "generator": [
            "scripts/vllm-hybrid-samples.py (the project's) with Debian /usr/bin/python3, cbor2, python3-msgpack: builds the events and replays them into per-group held sets",
            "hit lengths: vLLM's own functions, transcribed unmodified into a scratch module outside the repository (not committed): FullAttentionManager, SlidingWindowManager and MambaManager.find_longest_cache_hit from vllm/v1/core/single_type_kv_cache_manager.py @ 129ab7c60cbb8eb11e875373e67f7e521b74aa30, HybridKVCacheCoordinator.find_longest_cache_hit from vllm/v1/core/kv_cache_coordinator.py @ 00b08dc44519a82cbdd9061d92d1226985094622 (public code index versions, not tied to a tag), with stand-ins: a block pool answering get_cached_block from the held sets, spec classes, and an adapter between the two commits' manager signatures (use_eagle / drop_eagle_block; blocks / (blocks, length); a coarser group's hashes as BlockHashListWithBlockSize gives them). EAGLE off, no fine-grained partial hits, max_cache_hit_length = prompt tokens - 1",
            "payloads reconstructed, not produced by msgspec (not installable here): python3-msgpack packb(use_bin_type=True) on maps laid out as msgspec encodes BlockStored / BlockRemoved (tag=True, omit_defaults=True; vllm/distributed/kv_events.py) and the EventBatch array [ts, events, data_parallel_rank], as events-samples.json",
            "hashes: sha256_cbor, PYTHONHASHSEED unset (root sha256_cbor('vllm-none-hash'), PR #51875), checked against sha256_cbor.json case seed_unset_bs16 before writing",
        ],
        "header": [
            "each sample is one EventBatch; its prefixHits are prompts scored against the blocks the sample leaves cached (the sample alone, from an empty cache)",
            "hitTokens: vLLM's hit_length; fullAttentionTokens: the full-attention group's hit alone (what indexing that group only predicts); limitingGroup: the group that cut the hit, null when none did",
        ],
        "keyType": "uint64", "numberOfTests": len(tests),
        "notes": {k: {"description": v} for k, v in notes.items()},
        "testGroups": [{"type": "EventPayloadTest", "transport": "zmq", "layout": "map (v0.24+), v0.26+ fields", "tests": tests}],
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


main()
