#!/usr/bin/python3
"""A libzmq engine-side KV-event publisher for kvexact's interop tests.

Run with Debian's interpreter (python3-zmq, python3-msgpack). For each data-parallel rank it binds, on
127.0.0.1 with kernel-chosen ports, an XPUB for live batches (XPUB so that the test can wait for the
subscription: libzmq drops what is published before it arrives) and a ROUTER answering the vLLM/SGLang
replay protocol from a buffer of every batch published or dropped since the last restart.

Control is line-delimited JSON on stdin; every command is answered with one JSON line on stdout:
  {"op": "publish", "rank": r, "seq": s, "sample": name [, "topic": t] [, "restamp": true]}
                                        publish a sample's payload (restamp: with a new timestamp,
                                        re-encoded by python3-msgpack, as a restarted engine would)
  {"op": "drop", ...same...}            keep it for replay but do not publish (a lost message)
  {"op": "cleared", "rank": r, "seq": s, "publish": true}
                                        an AllBlocksCleared batch built here with msgpack
  {"op": "restart", "rank": r}          close and rebind the rank's sockets, empty its buffer
  {"op": "wait_sub", "rank": r, "timeout": sec}   answer once a subscription reached the XPUB
  {"op": "stats"}                       replay requests served and subscriptions per rank
  {"op": "quit"}
"""
import argparse
import binascii
import json
import sys
import time

import msgpack
import zmq

END_SEQ = b"\xff" * 8


class Rank:
    def __init__(self, ctx, rank):
        self.ctx = ctx
        self.rank = rank
        self.pub_port = None
        self.replay_port = None
        self.buffer = []  # (seq, payload)
        self.subs = 0
        self.replays = 0
        self.bind()

    def bind(self):
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        if self.pub_port is None:
            self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
            self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
            return
        deadline = time.time() + 5
        for sock, port in ((self.pub, self.pub_port), (self.router, self.replay_port)):
            while True:
                try:
                    sock.bind("tcp://127.0.0.1:%d" % port)
                    break
                except zmq.ZMQError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.02)

    def restart(self, poller):
        poller.unregister(self.pub)
        poller.unregister(self.router)
        self.pub.close(0)
        self.router.close(0)
        self.buffer = []
        self.subs = 0
        self.bind()
        poller.register(self.pub, zmq.POLLIN)
        poller.register(self.router, zmq.POLLIN)

    def on_pub(self):
        msg = self.pub.recv()
        if msg[:1] == b"\x01":
            self.subs += 1
        elif msg[:1] == b"\x00":
            self.subs = max(0, self.subs - 1)

    def on_router(self):
        frames = self.router.recv_multipart()
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
            return  # as the engines do: anything else is ignored
        ident, start = frames[0], int.from_bytes(frames[2], "big")
        for seq, payload in self.buffer:
            if seq >= start:
                self.router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
        self.router.send_multipart([ident, b"", END_SEQ, b""])
        self.replays += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--samples", action="append", default=[], help="events-samples.json file(s)")
    args = ap.parse_args()

    samples = {}
    for path in args.samples:
        with open(path) as f:
            doc = json.load(f)
        for s in doc["samples"]:
            samples[s["name"]] = binascii.unhexlify(s["payload_hex"])

    ctx = zmq.Context()
    ranks = [Rank(ctx, r) for r in range(args.ranks)]
    poller = zmq.Poller()
    for r in ranks:
        poller.register(r.pub, zmq.POLLIN)
        poller.register(r.router, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)

    def say(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"ready": True,
         "pub": ["tcp://127.0.0.1:%d" % r.pub_port for r in ranks],
         "replay": ["tcp://127.0.0.1:%d" % r.replay_port for r in ranks]})

    waiting = []  # (rank, deadline) of pending wait_sub commands
    running = True
    while running:
        timeout = 20 if waiting else 1000
        for sock, _ in poller.poll(timeout):
            if sock is sys.stdin or sock == sys.stdin.fileno():
                line = sys.stdin.readline()
                if not line:
                    running = False
                    break
                cmd = json.loads(line)
                op = cmd["op"]
                if op == "quit":
                    running = False
                    say({"ok": "quit"})
                    break
                if op == "stats":
                    say({"ok": "stats", "replays": [r.replays for r in ranks], "subs": [r.subs for r in ranks]})
                    continue
                rk = ranks[cmd.get("rank", 0)]
                if op in ("publish", "drop", "cleared"):
                    if op == "cleared":
                        payload = msgpack.packb([time.time(), [["AllBlocksCleared"]], rk.rank], use_bin_type=True)
                        send = cmd.get("publish", True)
                    else:
                        payload = samples[cmd["sample"]]
                        send = op == "publish"
                        if cmd.get("restamp"):
                            # What a restarted engine sends: the same events under a new timestamp.
                            batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                            batch[0] = time.time()
                            payload = msgpack.packb(batch, use_bin_type=True)
                    seq = cmd["seq"]
                    rk.buffer.append((seq, payload))
                    if send:
                        topic = cmd.get("topic", "").encode()
                        rk.pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
                    say({"ok": op, "rank": rk.rank, "seq": seq, "payload_hex": payload.hex()})
                elif op == "restart":
                    rk.restart(poller)
                    say({"ok": "restart", "rank": rk.rank})
                elif op == "wait_sub":
                    waiting.append((rk, time.time() + cmd.get("timeout", 5)))
                else:
                    say({"error": "unknown op %r" % op})
            else:
                for r in ranks:
                    if sock is r.pub:
                        r.on_pub()
                    elif sock is r.router:
                        r.on_router()
        still = []
        for rk, deadline in waiting:
            if rk.subs > 0:
                say({"ok": "wait_sub", "rank": rk.rank})
            elif time.time() > deadline:
                say({"error": "no subscription on rank %d" % rk.rank})
            else:
                still.append((rk, deadline))
        waiting = still

    for r in ranks:
        r.pub.close(0)
        r.router.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
