"""The teacher client's request and parsing, against a local HTTP server speaking vLLM's format.

This is a unit test of rollwire's own code path (request shape, slicing, errors); the real-vLLM
check belongs with the inference fleet's tests."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from rollwire.streams.teacher import TeacherClient, TeacherError, TeacherSettings


@pytest.fixture
def server():
    requests = []
    replies = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            status, body = replies.pop(0)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}/v1", requests, replies
    httpd.shutdown()


def vllm_answer(tokens, logprobs):
    return {"choices": [{"prompt_logprobs": [None] + [{str(t): {"logprob": lp, "rank": 1}}
                                                      for t, lp in zip(tokens[1:], logprobs[1:])]}]}


def test_the_teacher_scores_exactly_the_sampled_tokens(server):
    url, requests, replies = server
    replies.append((200, vllm_answer([5, 6, 7, 8, 9], [0, -0.1, -0.2, -0.3, -0.4])))
    got = TeacherClient(TeacherSettings(base_url=url, model="teacher"))([5, 6], [7, 8, 9])
    assert got == [-0.2, -0.3, -0.4]
    assert requests == [{"model": "teacher", "prompt": [5, 6, 7, 8, 9], "max_tokens": 1, "temperature": 0.0,
                         "prompt_logprobs": 0}]


def test_server_errors_are_retried_and_client_errors_are_not(server):
    url, requests, replies = server
    replies += [(503, {}), (200, vllm_answer([1, 2], [0, -1.5]))]
    assert TeacherClient(TeacherSettings(base_url=url, model="t", retries=2))([1], [2]) == [-1.5]
    replies.append((400, {"error": "model not found"}))
    with pytest.raises(TeacherError, match="HTTP 400"):
        TeacherClient(TeacherSettings(base_url=url, model="t", retries=2))([1], [2])
    assert len(requests) == 3


def test_an_answer_without_prompt_logprobs_names_the_likely_cause(server):
    url, _, replies = server
    replies.append((200, {"choices": [{"text": "x"}]}))
    with pytest.raises(TeacherError, match="vLLM extension"):
        TeacherClient(TeacherSettings(base_url=url, model="t"))([1], [2])
