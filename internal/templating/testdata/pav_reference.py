"""Reference evaluator (test oracle), adapted from PaV 0.1.1 (MIT, Alberto Faria),
image/pav/shared/templating.py, without async and the API client. Reads JSON lines {"tmpl": str, "vars": obj}
from stdin and writes one JSON line per input: {"ok": value} or
{"err": "ExceptionType: message"}. Used by TestDifferentialPaV."""

import json
import shlex
import sys

import yaml
from jinja2 import Undefined, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def finalize(value):
    if isinstance(value, Undefined):
        raise UndefinedError("Expressions must not evaluate to undefined")
    if not isinstance(value, (str, int, float)):
        raise TypeError("Expressions must evaluate to a string or numeric value")
    return str(value)


def tobash(value):
    if isinstance(value, Undefined):
        raise UndefinedError("Filter 'tobash' may not be applied to undefined")
    if not isinstance(value, (str, int, float)):
        raise TypeError("Filter 'tobash' expects a string or numeric value")
    value_str = str(value)
    if value_str:
        result = "$'\\n'".join((shlex.quote(s) if s else "") for s in value_str.split("\n"))
        assert "\n" not in result
        return result
    return "''"


def evaluate(tmpl, context):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, finalize=finalize)
    env.filters["tobash"] = tobash
    env.globals |= context
    template = env.from_string(tmpl)
    out = template.render()
    is_yaml = getattr(template.make_module(), "yaml", False)
    if not isinstance(is_yaml, bool):
        raise TypeError("yaml is not a bool")
    if is_yaml:
        out = yaml.safe_load(out)
    return out


for line in sys.stdin:
    case = json.loads(line)
    try:
        result = {"ok": evaluate(case["tmpl"], case["vars"])}
        json.dumps(result, allow_nan=False)
    except Exception as e:  # noqa: BLE001
        result = {"err": type(e).__name__ + ": " + str(e)}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
