# oversize.py URL MODEL BYTES TRIES MODE — sends TRIES completions whose prompt makes the body BYTES
# long, with Python's urllib (MODE=urllib) or the OpenAI Python SDK (MODE=sdk), and prints the
# outcome of each as JSON: the HTTP status the client read, or the exception it raised instead.
import json
import sys
import urllib.error
import urllib.request

url, model, size, tries, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
prompt = "x" * size
out = []
if mode == "sdk":
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
for _ in range(tries):
    try:
        if mode == "sdk":
            client.completions.create(model=model, prompt=prompt, max_tokens=1)
            out.append({"status": 200})
        else:
            body = json.dumps({"model": model, "prompt": prompt}).encode()
            req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                out.append({"status": r.status})
    except urllib.error.HTTPError as e:
        out.append({"status": e.code, "body": e.read().decode(errors="replace")[:300]})
    except Exception as e:  # noqa: BLE001 - the point is to see which error the user gets
        status = getattr(e, "status_code", 0)
        out.append({"status": status, "error": type(e).__name__ + ": " + str(e)[:300]})
print(json.dumps(out))
