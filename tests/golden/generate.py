"""Writes a new generation of golden event bytes: `python tests/golden/generate.py v2`.

Each generation folder keeps, per event type, the envelope bytes (`<type>.msgpack`) and the
payload as decoded when they were written (`<type>.json`). Generations are never rewritten:
`tests/unit/test_golden_bytes.py` checks that today's code still decodes every one of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builders import ALL  # noqa: E402

from rollwire.schemas import Codec  # noqa: E402


def main(generation: str) -> None:
    folder = Path(__file__).resolve().parent / generation
    if folder.exists():
        raise SystemExit(f"{folder} exists: golden generations are never rewritten; pick a new name")
    folder.mkdir()
    codec = Codec()
    for tag, event in ALL.items():
        data = codec.encode(event, producer="golden", event_id=f"golden-{tag}", produced_at_ms=1_790_000_000_000)
        (folder / f"{tag}.msgpack").write_bytes(data)
        (folder / f"{tag}.json").write_text(json.dumps(event.model_dump(mode="json"), indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(ALL)} events to {folder}")


if __name__ == "__main__":
    main(sys.argv[1])
