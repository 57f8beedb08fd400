"""vecgen: the engine-truth vector files, made by each pinned release's own code from its wheel.

Usage (scripts/vecgen.sh runs it in the pinned environment .cache/py/vecgen):
  main.py write DIR     write every release folder's vLLM case files under DIR (vLLM's case layout;
                        scripts/vecgen.sh converts them with cmd/vecgen -convert)
  main.py samples DIR   write the project event-sample files under DIR, their payloads encoded by the
                        release's own event classes and msgspec
  main.py check         hash every pinned vLLM and SGLang release (contracts/data pin.release) with its
                        own wheel and check its values equal those of the folder its contract names

Wheels are cached in .cache/wheels (pip download --no-deps when absent) and their sha256 recorded in
each file's generator lines.
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)

import events  # noqa: E402
import sglang  # noqa: E402
import vllm  # noqa: E402
import wheel  # noqa: E402

# Release folders: each is the first wheel of a hashing behaviour (docs/reference/vllm-releases.md §10).
VLLM_FOLDERS = ["0.28.0", "0.29.0", "0.31.0"]

FUNCTIONS = ["init_none_hash", "resolve_none_hash_seed", "get_none_hash_seed", "get_request_block_hasher",
             "generate_block_hash_extra_keys", "hash_block_tokens", "maybe_convert_block_hash",
             "BlockHashListWithBlockSize", "get_hash_fn_by_name"]

NOTES = [
    "Block i hash = H((parent, tuple(token_ids[i*bs:(i+1)*bs]), extra_keys[i])) with parent = NONE_HASH for block 0, else the full digest of block i-1.",
    "block_hashes_u64 = maybe_convert_block_hash(digest): the LAST 8 bytes read big-endian, unsigned.",
    "extra_keys JSON encoding: null = None; JSON array = Python tuple; JSON string = str; JSON integer = int; {\"$bytes\": hex} = bytes.",
    "reproducible false: PYTHONHASHSEED unset and the release roots the chain in os.urandom bytes (two init_none_hash calls gave different roots).",
]


def cases():
    with open(os.path.join(HERE, "vllm-cases.json"), encoding="utf-8") as f:
        return json.load(f)["cases"]


def vllm_release(version):
    path, name, sha = wheel.fetch("vllm", version)
    out, stubs, used = vllm.generate(path, version, cases(), FUNCTIONS)
    files = {}
    for algo, cs in out.items():
        files[algo] = {
            "engine": "vllm",
            "tag": "v" + version,
            "commit": f"unknown (made from the released wheel {name}, sha256 {sha}; no tag commit needed)",
            "hash_algo": algo,
            "generator": (f"artifact: {name} sha256 {sha} (pip download --no-deps vllm=={version}). "
                          f"The release's own functions {', '.join(used)} imported from the wheel unmodified "
                          f"(scripts/vecgen/vllm.py) and run with CPython {sys.version.split()[0]}, "
                          f"cbor2 {_version('cbor2')}, xxhash {_version('xxhash')}, pickle protocol {__import__('pickle').HIGHEST_PROTOCOL}. "
                          f"Stand-ins (modules not run): {'; '.join(stubs)}."),
            "notes": NOTES,
            "cases": cs,
        }
        if _tagged(cs):
            files[algo]["extra_key_scheme"] = "tagged"
    return files, name, sha


def _tagged(cs):
    """Whether the release's extra keys are tuples naming their source (("lora", name, path), …)."""
    lora = next(c for c in cs if c["name"] == "lora_name_bs16")
    return isinstance(lora["extra_keys"][0][0], list) and lora["extra_keys"][0][0][0] == "lora"


def _version(mod):
    import importlib.metadata
    return importlib.metadata.version(mod)


# Project event-sample files and the release whose classes encode them. Their inputs are the files
# themselves (each test's decoded batch); the payloads are the encoder's, and must stay equal to what
# the file holds (a difference is a finding: the release's wire moved).
SAMPLES = [("vllm", "0.28.0", "vllm/v0.28.0/events-samples.json",
            ["block hashes: vectors/vllm/v0.29.0/sha256_cbor.json case seed_unset_bs16 (64-bit form): PYTHONHASHSEED unset roots in the default seed from v0.29.0 on (the v0.28.0 wheel roots it in random bytes; the wire is the same)"]),
           ("sglang", "0.5.21", "sglang/v0.5.21/events-samples.json",
            ["SGLang v0.5.21 KV-event payloads in the tagged-map layout: the batch is still the array [ts, events, attn_dp_rank]; each event is a map {\"type\": tag, ...}",
             "block hashes: vectors/sglang/v0.5.18/page_hash.json (the v0.5.21 wheel's own page hasher gives the same values; scripts/vecgen.sh check)"])]


def write_samples(outdir):
    for engine, version, rel, header in SAMPLES:
        with open(os.path.join(ROOT, "vectors", rel), encoding="utf-8") as f:
            d = json.load(f)
        tests = d["testGroups"][0]["tests"]
        path, name, sha = wheel.fetch(engine, version)
        got, stubs = events.encode(engine, path, tests)
        for (tname, payload, decoded), t in zip(got, tests):
            if payload.hex() != t["payload"] or decoded != t["decoded"]:
                print(f"vecgen: {rel} {tname}: the {name} encoder's bytes differ from the committed payload")
            t["payload"], t["decoded"] = payload.hex(), decoded
        d["commit"] = f"unknown (made from the released wheel {name}, sha256 {sha}; no tag commit needed)"
        d["source"] = "engine"
        d["generator"] = [
            f"artifact: {name} sha256 {sha} (pip download --no-deps {engine}=={version})",
            f"payloads: each test's decoded batch built from the release's own KVEventBatch and event classes "
            f"({events.MODULES[engine]}, imported from the wheel unmodified; scripts/vecgen/events.py) and encoded by "
            f"msgspec {_version('msgspec')} msgspec.msgpack.Encoder(), as the engine's ZmqEventPublisher does; "
            f"decoded: msgspec.msgpack.decode of the payload",
            f"stand-ins (modules not run): {'; '.join(stubs)}",
            "ts values are synthetic (the publisher uses time.time())",
        ]
        d["header"] = header
        dst = os.path.join(outdir, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "w", encoding="utf-8") as f:
            json.dump(d, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"vecgen: {dst}: {len(tests)} payloads from {name}")


def write(outdir):
    for v in VLLM_FOLDERS:
        files, name, sha = vllm_release(v)
        d = os.path.join(outdir, "vllm", "v" + v)
        os.makedirs(d, exist_ok=True)
        for algo, data in files.items():
            with open(os.path.join(d, algo + ".json"), "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, ensure_ascii=False)
                f.write("\n")
        print(f"vecgen: {d}: {', '.join(files)} from {name} ({sha[:16]}…)")


def pins(family="vllm"):
    """(contract file, pin release, vectors folder) of every contract of family whose folder this
    generator checks (vLLM: the folders it writes; SGLang: the engine-produced v0.5.18 original)."""
    out = []
    for fn in sorted(os.listdir(os.path.join(ROOT, "contracts", "data"))):
        text = open(os.path.join(ROOT, "contracts", "data", fn), encoding="utf-8").read()
        if not re.search(rf"^family: {family}$", text, re.M):
            continue
        rel = re.search(r"^  release: v(\S+)$", text, re.M).group(1)
        low = re.search(r"^versions: \{min: v(\S+),", text, re.M).group(1)
        folder = re.search(r"^vectors: (\S+)$", text, re.M).group(1)
        if family == "sglang" or folder.removeprefix("vllm/v") in VLLM_FOLDERS or folder == "vllm/v0.25.1":
            # The pin and the first release of the range: both ends the contract speaks for.
            out.extend((fn, r, folder) for r in dict.fromkeys([low, rel]))
    return out


def check_sglang():
    """Each pinned SGLang release's own page hasher over the v0.5.18 page-hash cases; the number of
    release folders whose published hashes differ."""
    bad = 0
    for fn, rel, folder in pins("sglang"):
        with open(os.path.join(ROOT, "vectors", folder, "page_hash.json"), encoding="utf-8") as f:
            ref = json.load(f)["cases"]
        path, name, sha = wheel.fetch("sglang", rel)
        got, _ = sglang.generate(path, sha, ref)
        diff = [c["name"] for c in ref if got[c["name"]][0] != c["expected"]["page_hashes_hex"]
                or got[c["name"]][1] != c["expected"]["page_hashes_i64"]
                or got[c["name"]][2] != c["expected"].get("salt_root_hex")]
        status = "equal" if not diff else f"{len(diff)} cases differ: {', '.join(diff)}"
        print(f"vecgen check: {fn}: {name} sglang_sha256 vs {folder}: {len(ref)} cases, {status}")
        bad += bool(diff)
    return bad


def values(case):
    """What a release must reproduce: the chain's digests and the published keys. A coarser group's
    digests are engine-internal (up to v0.23 BlockHashListWithBlockSize concatenated the k fine digests,
    from v0.24 it takes the last one); its published 64-bit keys are the same either way, and those
    are compared."""
    e = case["expected"]
    return (case["reproducible"], case["extra_keys"], case.get("extra_keys_one_shot"),
            e.get("none_hash_hex"), e.get("block_hashes_hex"), e.get("block_hashes_u64"), e.get("group_block_hashes_u64"))


def check():
    """Each pinned release hashed by its own wheel equals its contract's folder (read through Go: the
    folder files are in the project's schema, so this compares against the regenerated originals in
    VECGEN_ORIGINALS, the directory `write` filled)."""
    originals = os.environ.get("VECGEN_ORIGINALS")
    if not originals:
        raise SystemExit("vecgen check: VECGEN_ORIGINALS (the directory main.py write filled) is required")
    bad = 0
    for fn, rel, folder in pins():
        files, name, _ = vllm_release(rel)
        # vllm/v0.25.1 is an engine-produced original, already in vLLM's case layout: read as committed,
        # over the cases it holds.
        base = os.path.join(ROOT, "vectors") if folder == "vllm/v0.25.1" else originals
        for algo, data in files.items():
            with open(os.path.join(base, folder, algo + ".json"), encoding="utf-8") as f:
                ref = {c["name"]: values(c) for c in json.load(f)["cases"]}
            diff = [c["name"] for c in data["cases"] if c["name"] in ref and values(c) != ref[c["name"]]]
            status = "equal" if not diff else f"{len(diff)} cases differ: {', '.join(diff)}"
            print(f"vecgen check: {fn}: {name} {algo} vs {folder}: {status}")
            bad += bool(diff)
    bad += check_sglang()
    if bad:
        raise SystemExit(f"vecgen check: {bad} release/algorithm pairs differ from their contract's vectors")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "samples":
        write_samples(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "check":
        check()
    else:
        raise SystemExit(__doc__)
