"""`hob serve` through the real `openai` Python client (tests/openai/run.sh makes its venv).

The server runs the tiny Qwen3-MoE fixture converted to .hob; greedy answers must equal
`hob run --temp 0` for the same conversation, and the client's own error classes must come out of
hob's error responses.

    python test_openai.py HOB_BINARY MODEL.hob TOOLS_MODEL.hob TOOLS_FIXTURE.json

MODEL is any model with a chat template (CI: the tiny fixture; by hand also models/smollm2-moe.hob).

TOOLS_MODEL is the same tiny model with Qwen3's real chat template (tools); TOOLS_FIXTURE the
conversation of tools/make_tool_chat_fixture.py (tools, an assistant's calls and their results).
"""

import json
import re
import subprocess
import sys
import threading
import unittest

import jsonschema
import openai

HOB, MODEL, TOOLS_MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
FIXTURE = json.load(open(sys.argv[4]))
KEY = "sesame"


class Server:
    """`hob serve` on a free port, with an API key."""

    def __init__(self, model=MODEL, *extra):
        self.proc = subprocess.Popen(
            [HOB, "serve", "-m", model, "--port", "0", "-t", "1", "--api-key", KEY, "--alias", "tiny", *extra],
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log = []
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"ready on (http://\S+)", line)
                if m:
                    self.base = m.group(1)
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(120):
            self.proc.kill()
            raise RuntimeError("hob serve did not get ready:\n" + "".join(self.log))

    def stop(self):
        self.proc.terminate()
        return self.proc.wait(30)


def hob_run(prompt, n, chat=True):
    args = [HOB, "run", "-m", MODEL, "--temp", "0", "-t", "1", "-p", prompt, "-n", str(n)]
    if not chat:
        args.append("--no-chat")
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return out[:-1] if out.endswith("\n") else out


class OpenAIClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(MODEL, "-c", "256")
        cls.client = openai.OpenAI(base_url=cls.server.base + "/v1", api_key=KEY, max_retries=0)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, "".join(cls.server.log)

    def test_models(self):
        ids = [m.id for m in self.client.models.list()]
        self.assertEqual(ids, ["tiny"])

    def test_chat_equals_hob_run(self):
        want = hob_run("Hello there", 16)
        r = self.client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hello there"}], temperature=0, max_tokens=16
        )
        self.assertEqual(r.choices[0].message.content, want)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        self.assertLessEqual(r.usage.completion_tokens, 16)

    def test_chat_stream_equals_hob_run(self):
        want = hob_run("Hello there", 16)
        stream = self.client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hello there"}],
            temperature=0,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage = "", None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        self.assertEqual(text, want)
        self.assertIn(finish, ("stop", "length"))
        self.assertIsNotNone(usage)
        self.assertLessEqual(usage.completion_tokens, 16)

    def test_completions_and_stop(self):
        want = hob_run("Once upon a time", 12, chat=False)
        r = self.client.completions.create(model="tiny", prompt="Once upon a time", temperature=0, max_tokens=12)
        self.assertEqual(r.choices[0].text, want)
        if len(want) >= 6:
            stop = want[3:6]
            r = self.client.completions.create(
                model="tiny", prompt="Once upon a time", temperature=0, max_tokens=12, stop=[stop]
            )
            self.assertEqual(r.choices[0].text, want[: want.index(stop)])
            self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_curl_streams_and_gets_errors(self):
        url = self.server.base + "/v1/chat/completions"
        body = json.dumps({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 16,
                           "temperature": 0, "stream": True})
        out = subprocess.run(["curl", "-sN", url, "-H", f"Authorization: Bearer {KEY}",
                              "-H", "Content-Type: application/json", "-d", body],
                             capture_output=True, text=True, check=True).stdout
        events = [line[6:] for line in out.splitlines() if line.startswith("data: ")]
        self.assertEqual(events[-1], "[DONE]")
        text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1])
        self.assertEqual(text, hob_run("Hello there", 16))
        out = subprocess.run(["curl", "-s", "-w", "%{http_code}", url, "-d", body],
                             capture_output=True, text=True, check=True).stdout
        self.assertTrue(out.endswith("401"), out)
        self.assertEqual(json.loads(out[:-3])["error"]["code"], "invalid_api_key")

    def test_structured_output_validates(self):
        schema = {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "population": {"type": "integer", "minimum": 0},
                "capital": {"type": "boolean"},
            },
            "required": ["city", "population", "capital"],
            "additionalProperties": False,
        }
        for seed in range(3):
            r = self.client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "A city as JSON."}], max_tokens=200,
                temperature=1.0, seed=seed,
                response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}},
            )
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)

    def test_errors_are_the_clients_own_classes(self):
        msgs = [{"role": "user", "content": "hi"}]
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model="tiny", messages=msgs, temperature=5)
        self.assertEqual(e.exception.body["param"], "temperature")
        with self.assertRaises(openai.NotFoundError):
            self.client.chat.completions.create(model="gpt-4", messages=msgs)
        bad = openai.OpenAI(base_url=self.server.base + "/v1", api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.chat.completions.create(model="tiny", messages=msgs)
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "word " * 400}])
        self.assertEqual(e.exception.code, "context_length_exceeded")


class ToolRoundTrip(unittest.TestCase):
    """The OpenAI client's own tool objects go in (an assistant's tool_calls, tool results) and
    what comes back parses into its types: tool_calls when the tiny model's forced call is valid
    JSON, else text (a random model's arguments rarely are; tests/serve_inprocess.rs scripts a
    valid answer)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server(TOOLS_MODEL, "-c", "2048")
        cls.client = openai.OpenAI(base_url=cls.server.base + "/v1", api_key=KEY, max_retries=0)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, "".join(cls.server.log)

    def test_round_trip(self):
        # A forced call follows the function's parameters schema (bounded here: a random model
        # never ends a string by itself), so the client gets a real tool call to answer.
        tools = json.loads(json.dumps(FIXTURE["tools"]))
        tools[0]["function"]["parameters"]["properties"]["city"]["maxLength"] = 6
        first = self.client.chat.completions.create(
            model="tiny", messages=FIXTURE["messages"][:2], tools=tools, max_tokens=300, temperature=1.0, seed=1,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        msg = first.choices[0].message
        self.assertEqual(first.choices[0].finish_reason, "tool_calls", msg)
        self.assertEqual(msg.tool_calls[0].function.name, "get_weather")
        args = json.loads(msg.tool_calls[0].function.arguments)
        self.assertIsInstance(args["city"], str)
        # The model's call and the fixture's, with results, back in as the client's typed objects.
        calls = msg.tool_calls + [openai.types.chat.ChatCompletionMessageFunctionToolCall(**c)
                                  for c in FIXTURE["messages"][2]["tool_calls"][1:]]
        history = FIXTURE["messages"][:2] + [
            {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": "{\"temperature\": 14}"},
        ] + FIXTURE["messages"][4:]
        second = self.client.chat.completions.create(
            model="tiny", messages=history, tools=FIXTURE["tools"], max_tokens=8, temperature=0
        )
        self.assertIn(second.choices[0].finish_reason, ("stop", "length", "tool_calls"))
        self.assertGreater(second.usage.prompt_tokens, first.usage.prompt_tokens)
        # Streamed, the same answer in the client's typed chunks.
        text, finish = "", None
        for chunk in self.client.chat.completions.create(
            model="tiny", messages=history, tools=FIXTURE["tools"], max_tokens=8, temperature=0, stream=True
        ):
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        self.assertEqual(finish, second.choices[0].finish_reason)
        if finish != "tool_calls":
            self.assertEqual(text, second.choices[0].message.content)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
