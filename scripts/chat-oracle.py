"""chat-oracle.py: renders chat-template cases with transformers' own compiled template
(transformers.utils.chat_template_utils._compile_jinja_template: the sandboxed jinja2 environment,
extensions, filters and globals apply_chat_template renders with), on the jinja2 the "chat"
environment pins (scripts/python/chat.txt). Same protocol as jinja2-oracle.py, which it replaces
when .cache/py/chat exists: a JSON list of {"template", "vars"} on stdin, a JSON list of {"out"} or
{"error"} on stdout."""
import json
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template

out = []
for case in json.loads(sys.stdin.read()):
    try:
        out.append({"out": _compile_jinja_template(case["template"]).render(**case["vars"])})
    except Exception as e:  # the Go side compares "error" vs "error", not messages
        out.append({"error": type(e).__name__ + ": " + str(e)})
sys.stdout.write(json.dumps(out, ensure_ascii=False))
