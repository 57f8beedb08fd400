#!/usr/bin/python3
"""jinja2-oracle.py: renders chat-template cases with Python jinja2 in the environment transformers'
apply_chat_template builds (sandboxed, trim_blocks, lstrip_blocks, loopcontrols, tojson with
ensure_ascii=False, raise_exception, strftime_now). The differential harness in gateway/tokenize
(TestDifferentialJinja2) sends a JSON list of cases on stdin and reads a JSON list of results:
  case   {"template": str, "vars": {...}}        (vars are json.loads'ed request values)
  result {"out": str} or {"error": str}
Run with Debian's /usr/bin/python3 (python3-jinja2)."""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

compiled = {}
out = []
for case in json.loads(sys.stdin.read()):
    try:
        t = compiled.get(case["template"])
        if t is None:
            t = compiled[case["template"]] = env.from_string(case["template"])
        out.append({"out": t.render(**case["vars"])})
    except Exception as e:  # the Go side compares "error" vs "error", not messages
        out.append({"error": type(e).__name__ + ": " + str(e)})
sys.stdout.write(json.dumps(out, ensure_ascii=False))
