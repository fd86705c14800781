"""Structured outputs through the official openai SDK: chat.completions.parse with Pydantic
models (the SDK turns each into a strict JSON schema and parses the answer back into the
model), response_format json_object, and the Responses API's text.format with
responses.parse; each answer must parse and validate on the client's side.

Usage: DFLASH_BASE_URL=http://127.0.0.1:8000/v1 python structured_test.py

Environment: DFLASH_BASE_URL (required), DFLASH_API_KEY, DFLASH_MODEL (as agents_test.py).
The last line is "N passed, N failed"; the exit status is 1 when anything failed.
"""

import json
import os
from enum import Enum
from typing import Literal, Optional

import openai
from pydantic import BaseModel, Field

from sdkrun import run_tests

BASE_URL = os.environ["DFLASH_BASE_URL"].rstrip("/")
API_KEY = os.environ.get("DFLASH_API_KEY", "unused")
oa = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=300)
MODEL = os.environ.get("DFLASH_MODEL") or oa.models.list().data[0].id
ASK = [{"role": "user", "content": "Describe a Go package as JSON."}]


class Colour(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Point(BaseModel):
    x: int = Field(ge=0, le=9)
    y: int = Field(ge=0, le=9)


class Package(BaseModel):
    name: str = Field(max_length=12)
    stars: int = Field(ge=0, le=999)
    colour: Colour
    tags: list[Literal["go", "cli", "web", "db"]] = Field(max_length=3)
    origin: Point
    licence: Optional[Literal["MIT", "BSD"]]


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def test_parse_pydantic_greedy_and_sampled():
    for temperature in (0, 0.8):
        c = oa.chat.completions.parse(model=MODEL, messages=ASK, response_format=Package, max_tokens=200,
                                      temperature=temperature, seed=11)
        msg = c.choices[0].message
        check(c.choices[0].finish_reason == "stop", f"finish {c.choices[0].finish_reason}: {msg.content!r}")
        check(isinstance(msg.parsed, Package), f"parsed {msg.parsed!r} from {msg.content!r}")
        Package.model_validate_json(msg.content)  # raises when the answer does not validate


def test_parse_streamed():
    with oa.chat.completions.stream(model=MODEL, messages=ASK, response_format=Point, max_tokens=60,
                                    temperature=0) as stream:
        final = stream.get_final_completion()
    check(isinstance(final.choices[0].message.parsed, Point), f"parsed {final.choices[0].message!r}")


def test_json_object():
    c = oa.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "json_object"},
                                   max_tokens=120, temperature=0)
    if c.choices[0].finish_reason == "stop":
        check(isinstance(json.loads(c.choices[0].message.content), dict), f"answer {c.choices[0].message.content!r}")


def test_responses_parse():
    r = oa.responses.parse(model=MODEL, input="Describe a point as JSON.", text_format=Point, max_output_tokens=60,
                           temperature=0)
    check(isinstance(r.output_parsed, Point), f"output_parsed {r.output_parsed!r}: {r.output_text!r}")


def test_bad_schema_is_a_400():
    try:
        oa.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
                "a": {"$ref": "#/$defs/missing"}}}}})
        raise AssertionError("a schema with a dangling $ref was accepted")
    except openai.BadRequestError as e:
        check("response_format" in str(e), f"message {e}")


if __name__ == "__main__":
    run_tests(globals(), f"python openai {openai.__version__}")
