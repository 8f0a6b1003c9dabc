"""Consumer groups of the embedded log: membership, partition ownership and committed offsets.

    <root>/groups.sqlite
        members(group_id, member_id, topics, heartbeat_ms)
        owners(group_id, topic, partition, member_id)
        offsets(group_id, topic, partition, offset)

The protocol, run by every member at each refresh in one transaction:

    # Step 1  heartbeat: the member's row gets the current time
    # Step 2  expire: members silent for longer than the session timeout, and their ownerships,
    #         are deleted (a killed process stops heartbeating, so its partitions free up)
    # Step 3  target: the live members subscribed to a topic share its partitions round-robin,
    #         in member-id order, so every member computes the same target
    # Step 4  release: ownerships outside the member's target are deleted
    # Step 5  claim: target partitions nobody owns are taken; one still owned by a live member is
    #         waited for (that member releases it at its own next refresh)

Ownership is exclusive, so a commit is fenced: it succeeds only for partitions the member owns.
A heartbeat thread keeps a member alive while its process is busy between polls.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from rollwire.core.bus.embedded_store import connect
from rollwire.core.bus.errors import CommitFailedError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS members (group_id TEXT NOT NULL, member_id TEXT NOT NULL,
    topics TEXT NOT NULL, heartbeat_ms INTEGER NOT NULL, PRIMARY KEY (group_id, member_id));
CREATE TABLE IF NOT EXISTS owners (group_id TEXT NOT NULL, topic TEXT NOT NULL,
    partition INTEGER NOT NULL, member_id TEXT NOT NULL, PRIMARY KEY (group_id, topic, partition));
CREATE TABLE IF NOT EXISTS offsets (group_id TEXT NOT NULL, topic TEXT NOT NULL,
    partition INTEGER NOT NULL, offset INTEGER NOT NULL, PRIMARY KEY (group_id, topic, partition));
"""

TopicPartition = tuple[str, int]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def open_groups(root: Path):
    conn = connect(root / "groups.sqlite")
    conn.executescript(_SCHEMA)
    return conn


def committed_offsets(root: Path, group_id: str, topic: str) -> dict[int, int]:
    conn = open_groups(root)
    try:
        return dict(conn.execute("SELECT partition, offset FROM offsets WHERE group_id = ? AND topic = ?",
                                 (group_id, topic)))
    finally:
        conn.close()


class GroupMember:
    """One consumer's membership in a group."""

    def __init__(self, root: Path, group_id: str, topics: Mapping[str, int], session_timeout_s: float):
        self.group_id = group_id
        self.member_id = f"{time.time_ns():x}-{uuid.uuid4().hex[:8]}"
        self.topics = dict(topics)  # topic -> partition count
        self.session_ms = int(session_timeout_s * 1000)
        self._conn = open_groups(root)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._write(lambda c: c.execute("INSERT OR REPLACE INTO members VALUES (?, ?, ?, ?)",
                                        (group_id, self.member_id, json.dumps(sorted(topics)), _now_ms())))
        self._heartbeats = threading.Thread(target=self._beat, name=f"heartbeat-{group_id}", daemon=True)
        self._heartbeats.start()

    def _write(self, fn):
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._conn)
                self._conn.execute("COMMIT")
                return result
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def _beat(self) -> None:
        interval = max(0.05, self.session_ms / 4000)
        while not self._stop.wait(interval):
            self._write(lambda c: c.execute(
                "UPDATE members SET heartbeat_ms = ? WHERE group_id = ? AND member_id = ?",
                (_now_ms(), self.group_id, self.member_id)))

    def refresh(self) -> list[TopicPartition]:
        """Runs steps 1-5 of the protocol; returns the partitions this member owns now."""
        return self._write(self._refresh)

    def _refresh(self, c) -> list[TopicPartition]:
        g, me, now = self.group_id, self.member_id, _now_ms()
        # Step 1
        c.execute("INSERT OR REPLACE INTO members VALUES (?, ?, ?, ?)",
                  (g, me, json.dumps(sorted(self.topics)), now))
        # Step 2
        expired = [m for (m,) in c.execute("SELECT member_id FROM members WHERE group_id = ? AND heartbeat_ms < ?",
                                           (g, now - self.session_ms))]
        for member in expired:
            c.execute("DELETE FROM members WHERE group_id = ? AND member_id = ?", (g, member))
            c.execute("DELETE FROM owners WHERE group_id = ? AND member_id = ?", (g, member))
        # Step 3
        subscribers: dict[str, list[str]] = {}
        for member, topics in c.execute("SELECT member_id, topics FROM members WHERE group_id = ? "
                                        "ORDER BY member_id", (g,)):
            for topic in json.loads(topics):
                subscribers.setdefault(topic, []).append(member)
        target = {(t, p) for t, n in self.topics.items() for p in range(n)
                  if subscribers[t][p % len(subscribers[t])] == me}
        owners = {(t, p): m for t, p, m in c.execute(
            "SELECT topic, partition, member_id FROM owners WHERE group_id = ?", (g,))}
        # Step 4
        for tp, member in owners.items():
            if member == me and tp not in target:
                c.execute("DELETE FROM owners WHERE group_id = ? AND topic = ? AND partition = ?", (g, *tp))
        # Step 5
        for tp in sorted(target):
            if tp not in owners:
                c.execute("INSERT INTO owners VALUES (?, ?, ?, ?)", (g, *tp, me))
        return sorted(tp for tp in target if owners.get(tp, me) == me)

    def committed(self) -> dict[TopicPartition, int]:
        with self._lock:
            rows = self._conn.execute("SELECT topic, partition, offset FROM offsets WHERE group_id = ?",
                                      (self.group_id,)).fetchall()
        return {(t, p): o for t, p, o in rows if t in self.topics}

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Stores `offsets` (next offset to read) if this member owns every partition in them."""
        def store(c) -> None:
            owned = {(t, p) for t, p in c.execute(
                "SELECT topic, partition FROM owners WHERE group_id = ? AND member_id = ?",
                (self.group_id, self.member_id))}
            lost = sorted(set(offsets) - owned)
            if lost:
                raise CommitFailedError(
                    f"group {self.group_id!r} moved {lost} to another member before this commit; "
                    "their uncommitted records will be delivered to the new owner")
            c.executemany("INSERT OR REPLACE INTO offsets VALUES (?, ?, ?, ?)",
                          [(self.group_id, t, p, o) for (t, p), o in offsets.items()])
        self._write(store)

    def leave(self) -> None:
        """Deletes the membership and ownerships, so other members take the partitions at once."""
        self._stop.set()
        self._heartbeats.join()
        self._write(lambda c: (
            c.execute("DELETE FROM members WHERE group_id = ? AND member_id = ?", (self.group_id, self.member_id)),
            c.execute("DELETE FROM owners WHERE group_id = ? AND member_id = ?", (self.group_id, self.member_id))))
        self._conn.close()

