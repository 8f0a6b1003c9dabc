"""A simulated production app, for a run with production traffic (`rollwire run examples/production.toml`).

It asks the run's serving gateway to reverse digit strings with the real `openai` client, judges
each answer as its users would, and posts their judgements to the feedback API with `httpx`:

    rating      +1 for the exact reversal, -1 otherwise
    correction  the right answer, for a share of the wrong ones (--correct)
    preference  between two answers to one prompt when exactly one is right (--compare)

Each request names a conversation (`x-rollwire-conversation-id`); each judgement names the
receipt the gateway returned. The joiner turns them into training samples the trainer mixes into
its batches; `rollwire tail --prefix production scored` shows them arrive.

    rollwire run examples/production.toml             # prints the gateway's and the feedback API's URLs
    python examples/production_app.py --requests 200  # in another terminal
"""

from __future__ import annotations

import argparse
import random
import uuid

BOS = "<|bos|>"
"""The tiny model's beginning-of-sequence text: the demo's prompts start with it."""


def ask(client, model: str, prompt: str, conversation: str) -> tuple[str, str]:
    """`(receipt, answer)` for one completion through the gateway."""
    raw = client.completions.with_raw_response.create(
        model=model, prompt=prompt, max_tokens=10, temperature=1.0,
        extra_headers={"x-rollwire-conversation-id": conversation})
    response = raw.parse()
    return raw.headers["x-rollwire-response-id"], response.choices[0].text.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway", default="http://127.0.0.1:8350/v1", help="the gateway's OpenAI API (default %(default)s)")
    parser.add_argument("--feedback", default="http://127.0.0.1:8340", help="the feedback API (default %(default)s)")
    parser.add_argument("--model", default="policy", help="model name the gateway serves (default %(default)s)")
    parser.add_argument("--token", default="unused-on-loopback", help="bearer token (default: none needed on loopback)")
    parser.add_argument("--source", default="digits-app",
                        help="the app's source name (with tokens configured: the token's, or leave it to the token)")
    parser.add_argument("--requests", type=int, default=100, help="prompts to ask (default %(default)s)")
    parser.add_argument("--correct", type=float, default=0.5, help="share of wrong answers corrected (default %(default)s)")
    parser.add_argument("--compare", type=float, default=0.2, help="share of prompts asked twice, for a preference")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import httpx
    from openai import OpenAI
    rng = random.Random(args.seed)
    client = OpenAI(base_url=args.gateway, api_key=args.token)
    feedback = httpx.Client(base_url=args.feedback, headers={"Authorization": f"Bearer {args.token}"}, timeout=30)
    counts = {"right": 0, "wrong": 0, "rating": 0, "correction": 0, "preference": 0}
    for i in range(args.requests):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(3, 6)))
        prompt, truth, conversation = f"{BOS}r:{digits}>", digits[::-1], f"user-{uuid.uuid4().hex[:8]}"
        receipt, answer = ask(client, args.model, prompt, conversation)
        right = answer == truth
        counts["right" if right else "wrong"] += 1
        items = [{"feedback_id": f"{receipt}-rating", "kind": "rating", "rating": 1.0 if right else -1.0,
                  "response_id": receipt, "conversation_id": conversation}]
        if not right and rng.random() < args.correct:
            items.append({"feedback_id": f"{receipt}-correction", "kind": "correction", "correction": truth,
                          "response_id": receipt, "conversation_id": conversation})
        if rng.random() < args.compare:
            other, second = ask(client, args.model, prompt, conversation)
            if (second == truth) != right:
                items.append({"feedback_id": f"{receipt}-preference", "kind": "preference",
                              "response_ids": [receipt, other], "preferred_index": 0 if right else 1,
                              "conversation_id": conversation})
        for item in items:
            item.setdefault("source", args.source)
        response = feedback.post("/v1/feedback/batch", json=items)
        response.raise_for_status()
        for item in items:
            counts[item["kind"]] += 1
        if (i + 1) % 20 == 0:
            print(f"{i + 1} prompts: {counts}", flush=True)
    print(f"done: {counts}")


if __name__ == "__main__":
    main()
