"""The OpenAI Python SDK against a base URL (Envoy in front of the picker, in TestSDKThroughEnvoy).

  openai_sdk.py BASE ok            chat and completions, streamed and not; prints one JSON line
  openai_sdk.py BASE error KIND    one request expected to fail; prints the SDK's exception class
                                   and status (KIND: model, big, any)
"""
import json
import sys

import openai

base, mode = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=30)

if mode == "ok":
    out = {}
    c = client.completions.create(model="llama3", prompt="the python sdk through envoy", max_tokens=3)
    out["completion"] = c.choices[0].text is not None
    s = client.completions.create(model="llama3", prompt="a python stream", max_tokens=3, stream=True)
    out["completion_chunks"] = sum(1 for _ in s)
    ch = client.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    out["chat"] = ch.choices[0].message.role
    cs = client.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "stream"}], max_tokens=3, stream=True)
    out["chat_chunks"] = sum(1 for _ in cs)
    print(json.dumps(out))
else:
    kind = sys.argv[3]
    model, prompt = "llama3", "an error through envoy"
    if kind == "model":
        model = "nope"
    elif kind == "big":
        prompt = "big " * (20 << 10)
    try:
        client.completions.create(model=model, prompt=prompt, max_tokens=2)
        print(json.dumps({"class": "none"}))
    except openai.APIStatusError as e:
        code = (e.body or {}).get("code") if isinstance(e.body, dict) else None
        print(json.dumps({"class": type(e).__name__, "status": e.status_code, "code": code}))
