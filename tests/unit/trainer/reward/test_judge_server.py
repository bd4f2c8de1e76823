"""The generative judge's server for real (reward/judge_server.py, the hf engine, CPU): its own process speaking
OpenAI's chat and completions protocol, read by the `openai` client; the engine's replies are transformers' own;
requests that come together are generated together; bad requests refused in one line; the process ends with its
handle."""

import concurrent.futures
import json
import re
import urllib.error
import urllib.request

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
from rlrig.trainer.reward.judge import JudgeLink, judge_spec
from rlrig.trainer.reward.judge_server import JudgeServer

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def served():
    path = ensure_tiny_model()
    cfg = parse_overrides(["reward_model.rollout.name=hf", "reward_model.rollout.response_length=6"])
    server = JudgeServer(judge_spec(cfg.reward_model, path, "cpu"))
    yield server, path
    server.close()


def post(address: str, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{address}{path}", json.dumps(body).encode(), {"Content-Type": "x"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def greedy(path: str, text: str, most: int) -> str:
    """transformers' own greedy reply to the chat message `text`, as the judge's template renders it."""
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, max_new_tokens=most, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_the_openai_client_reads_the_judges_greedy_reply(served):
    server, path = served
    client = openai.OpenAI(base_url=f"http://{server.address}/v1", api_key="none")
    for q in ("3+4=", "9+9="):
        reply = client.chat.completions.create(
            model=path, messages=[{"role": "user", "content": q}], max_tokens=4, temperature=0
        )
        assert reply.choices[0].message.content == greedy(path, q, 4)
        assert reply.usage.completion_tokens <= 4 and reply.choices[0].finish_reason in ("stop", "length")
    text = client.completions.create(model=path, prompt="3+4=", max_tokens=3, temperature=0).choices[0].text
    assert text == greedy(path, "3+4=", 3)  # the embedded template is the message as it is
    assert [m.id for m in client.models.list().data] == [path]


def test_requests_that_come_together_are_generated_together(served):
    server, path = served
    link = JudgeLink.of(server.address, path, False, sleeps=False, reports=True)
    body = {"messages": [{"role": "user", "content": "1+2="}], "max_tokens": 3, "temperature": 0}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: post(server.address, "/v1/chat/completions", body), range(8)))
    assert {r[0] for r in replies} == {200}
    assert len({r[1]["choices"][0]["message"]["content"] for r in replies}) == 1  # greedy: one reply
    m = link.metrics([])
    assert m["reward/judge/requests"] == 8 and m["reward/judge/failures"] == 0
    assert m["reward/judge/completion_tokens"] == sum(r[1]["usage"]["completion_tokens"] for r in replies)
    stats = json.loads(urllib.request.urlopen(f"http://{server.address}/rlrig/stats").read())
    assert stats["batches"] < stats["requests"]


def test_a_stop_string_cuts_the_reply_where_it_first_occurs(served):
    server, path = served
    full = greedy(path, "3+4=", 6)
    body = {"messages": [{"role": "user", "content": "3+4="}], "max_tokens": 6, "temperature": 0, "stop": [full[1:]]}
    status, out = post(server.address, "/v1/chat/completions", body)
    assert status == 200 and out["choices"][0]["message"]["content"] == full[:1]
    assert out["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"messages": [{"role": "user", "content": "1+1="}], "n": 2}, "n must be 1"),
        ({"messages": [{"role": "user", "content": "1+1="}], "stream": True}, "stream is not supported"),
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"role": "user", "content": "1" * 200}]}, r"the prompt is \d+ tokens; the judge takes 64"),
        ({"messages": [{"role": "user", "content": "1+1="}], "max_tokens": 0}, "max_tokens must be at least 1"),
        ({"messages": [{"role": "user", "content": "1+1="}], "temperature": "hot"}, "temperature must be a number"),
    ],
)
def test_a_bad_request_is_refused_in_one_line(served, body, match):
    status, out = post(served[0].address, "/v1/chat/completions", body)
    assert status == 400
    assert re.search(match, out["error"]["message"]), out


def test_the_server_process_ends_with_its_handle():
    cfg = parse_overrides(["reward_model.rollout.name=hf"])
    server = JudgeServer(judge_spec(cfg.reward_model, ensure_tiny_model(), "cpu"))
    proc = server.child.proc
    server.close()
    assert not proc.is_alive() and proc.exitcode == 0


def test_a_judge_that_cannot_start_says_why(tmp_path):
    cfg = parse_overrides(["reward_model.rollout.name=sglang"])
    with pytest.raises(RuntimeError, match="did not start: reward_model.rollout.name=sglang runs on GPUs only"):
        JudgeServer(judge_spec(cfg.reward_model, ensure_tiny_model(), "cpu"))
