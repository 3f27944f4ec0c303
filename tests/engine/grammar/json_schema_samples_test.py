"""Every sentence of a compiled JSON Schema's grammar is a JSON text valid against the schema.

Random sentences of the grammars of agent-style schemas (agent_schemas.json; keyword_schemas.json
for keywords beyond them), printed by grammar_samples, checked by an independent validator:
Python's jsonschema (the draft a schema's $schema names, else 2020-12, with its format checker; Debian's package checks date, time, uuid; date-time needs an optional package
Debian lacks, so for it this test checks RFC 3339 with the standard library).

usage: json_schema_samples_test.py GRAMMAR_SAMPLES SCHEMAS_JSON
"""

import datetime
import json
import subprocess
import sys

import jsonschema

SAMPLES_PER_SCHEMA = 40


def check_date_time(text):
    if not isinstance(text, str):
        return True
    datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return "T" in text


def main():
    binary, schemas_path = sys.argv[1], sys.argv[2]
    with open(schemas_path, encoding="utf-8") as f:
        schemas = json.load(f)
    out = subprocess.run([binary, schemas_path, str(SAMPLES_PER_SCHEMA)], check=True,
                         capture_output=True, text=True).stdout
    for cls in (jsonschema.Draft202012Validator, jsonschema.Draft7Validator):
        cls.FORMAT_CHECKER.checks("date-time", raises=ValueError)(check_date_time)
    per_schema = [0] * len(schemas)
    failures = []
    for line in filter(None, out.split("\n")):  # not splitlines: texts may hold U+2028
        sample = json.loads(line)
        index, text = sample["schema"], sample["text"]
        per_schema[index] += 1
        try:
            value = json.loads(text)
            schema = schemas[index]["schema"]
            cls = jsonschema.validators.validator_for(schema,
                                                      default=jsonschema.Draft202012Validator)
            jsonschema.validate(value, schema, cls=cls, format_checker=cls.FORMAT_CHECKER)
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append(f"schema {index}: {text!r}: {e}")
    for index, count in enumerate(per_schema):
        if count < SAMPLES_PER_SCHEMA // 2:
            failures.append(f"schema {index}: only {count} of {SAMPLES_PER_SCHEMA} walks ended")
    print(f"{sum(per_schema)} sentences of {len(schemas)} schemas checked")
    if failures:
        print("\n".join(failures[:20]))
        sys.exit(1)


if __name__ == "__main__":
    main()
