"""Kafka over SASL_SSL (SCRAM-SHA-512 over TLS) and mutual TLS, against a real broker started with
those listeners; its CA and certificates are made here. Both client libraries are proven: the
event log (confluent-kafka) and a faust worker (the scorer, aiokafka)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import group_of

from rollwire.core.bus import Beginning, BusError, EventProducer, KafkaBusSettings, catalog_topics, open_log
from rollwire.core.errors import ConfigError
from rollwire.schemas import Codec, Topics

pytestmark = [pytest.mark.kafka]

PASSWORD = "scram-secret-4f1d"


def _certificates(folder: Path) -> dict[str, Path]:
    """A CA; a broker certificate for 127.0.0.1 (key and chain in one PEM, as the broker reads it);
    a client certificate and key, each key file 0600."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def issue(name: str, key, issuer_name, issuer_key, *, ca: bool, san: list | None = None):
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def pem(cert) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def secret(path: Path, data: bytes) -> Path:
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rollwire test CA")])
    ca = issue("rollwire test CA", ca_key, ca_name, ca_key, ca=True)
    broker_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    broker = issue("broker", broker_key, ca_name, ca_key, ca=False,
                   san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    client = issue("env-worker", client_key, ca_name, ca_key, ca=False)
    (folder / "ca.pem").write_bytes(pem(ca))
    (folder / "client.pem").write_bytes(pem(client))
    return {"ca": folder / "ca.pem", "keystore": secret(folder / "broker.pem", key_pem(broker_key) + pem(broker) + pem(ca)),
            "client_cert": folder / "client.pem", "client_key": secret(folder / "client.key", key_pem(client_key))}


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deploy" / "kafka"))
    import broker
    folder = tmp_path_factory.mktemp("secure-kafka")
    certs = _certificates(folder)
    info = broker.start(folder / "broker", tls=broker.Tls(keystore_pem=certs["keystore"], ca_pem=certs["ca"],
                                                         scram_users={"rollwire": PASSWORD}))
    yield info, certs
    broker.stop(info)


def _sasl(info, certs, **security) -> KafkaBusSettings:
    return KafkaBusSettings(bootstrap_servers=info.listeners["SASL_SSL"], outage_s=8, security={
        "protocol": "SASL_SSL", "ca_file": certs["ca"], "username": "rollwire", **security})


def _mtls(info, certs, **security) -> KafkaBusSettings:
    return KafkaBusSettings(bootstrap_servers=info.listeners["SSL"], outage_s=8, security={
        "protocol": "SSL", "ca_file": certs["ca"], "cert_file": certs["client_cert"],
        "key_file": certs["client_key"], **security})


def _round_trip(settings: KafkaBusSettings, prefix: str) -> list:
    topics = Topics(prefix)
    rollouts = group_of("g1", [1.0, 0.0])
    with open_log(settings) as log:
        log.create_topics(catalog_topics(topics))
        with log.producer() as raw:
            producer = EventProducer(raw, topics, name="test")
            for r in rollouts:
                producer.send(topics.rollouts, r, key=r.group_id)
        got, deadline = [], time.monotonic() + 30
        with log.reader([topics.rollouts], Beginning()) as reader:
            while len(got) < len(rollouts) and time.monotonic() < deadline:
                got += [Codec().decode(r.value).event for r in reader.poll_batch(100, 1.0)]
    return got


def test_sasl_ssl_with_the_password_from_the_environment_round_trips(secure_broker, monkeypatch):
    info, certs = secure_broker
    monkeypatch.setenv("KAFKA_PASSWORD", PASSWORD)
    got = _round_trip(_sasl(info, certs), "sasl")
    assert sorted(r.rollout_id for r in got) == ["g1-r0", "g1-r1"]


def test_a_wrong_password_or_none_is_refused_with_the_reason(secure_broker, monkeypatch, tmp_path):
    info, certs = secure_broker
    wrong = tmp_path / "password"
    wrong.write_text("not-the-password")
    with pytest.raises(BusError, match="Authentication failed|SASL authentication error"):
        _round_trip(_sasl(info, certs, password_file=wrong), "wrongpw")
    monkeypatch.delenv("KAFKA_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match=r"no Kafka password for user 'rollwire': set \$KAFKA_PASSWORD"):
        _round_trip(_sasl(info, certs), "nopw")


def test_mutual_tls_round_trips_and_a_client_without_a_certificate_is_refused(secure_broker):
    info, certs = secure_broker
    got = _round_trip(_mtls(info, certs), "mtls")
    assert sorted(r.rollout_id for r in got) == ["g1-r0", "g1-r1"]
    anonymous = KafkaBusSettings(bootstrap_servers=info.listeners["SSL"], outage_s=8,
                                 security={"protocol": "SSL", "ca_file": certs["ca"]})
    with pytest.raises(BusError):
        _round_trip(anonymous, "anon")


def test_secrets_never_go_in_bus_settings():
    with pytest.raises(ValueError, match="bus.client_config holds sasl.password: secrets never go in settings"):
        KafkaBusSettings(client_config={"sasl.password": "x"})
    with pytest.raises(ValueError, match="needs bus.security.username"):
        KafkaBusSettings(security={"protocol": "SASL_SSL"})


@pytest.mark.parametrize("protocol", ["SASL_SSL", "SSL"])
def test_the_faust_scorer_scores_over_a_secured_listener(secure_broker, tmp_path, protocol):
    """The scorer role as a run starts it (recipe.json), its settings from [bus.security]."""
    from rollwire.run.recipe import RunRecipe
    info, certs = secure_broker
    bus = _sasl(info, certs) if protocol == "SASL_SSL" else _mtls(info, certs)
    prefix = f"secure{protocol.lower().replace('_', '')}{int(time.time()) % 10**6}"
    recipe = RunRecipe.model_validate({"name": prefix, "run_dir": str(tmp_path / "run"), "bus": bus.model_dump(mode="json"),
                                       "environments": [{"name": "reverse-digits"}]})
    recipe.run_dir.mkdir(parents=True)
    (recipe.run_dir / "recipe.json").write_text(recipe.model_dump_json())
    assert PASSWORD not in (recipe.run_dir / "recipe.json").read_text()
    env = {**os.environ, "KAFKA_PASSWORD": PASSWORD}
    os.environ["KAFKA_PASSWORD"] = PASSWORD
    try:
        topics = Topics(recipe.topic_prefix)
        with open_log(bus) as log:
            log.create_topics(catalog_topics(topics))
            with log.producer() as raw:
                producer = EventProducer(raw, topics, name="test")
                for r in group_of("g1", [1.0, 0.0, 1.0, 0.0]):
                    producer.send(topics.rollouts, r, key=r.group_id)
            scorer = subprocess.Popen([sys.executable, "-m", "rollwire.run.roles", "scorer",
                                       str(recipe.run_dir / "recipe.json")], env=env,
                                      stdout=open(tmp_path / "scorer.log", "w"), stderr=subprocess.STDOUT)
            try:
                got, deadline = [], time.monotonic() + 90
                with log.reader([topics.scored], Beginning()) as reader:
                    while len(got) < 4 and time.monotonic() < deadline and scorer.poll() is None:
                        got += [Codec().decode(r.value).event for r in reader.poll_batch(100, 1.0)]
            finally:
                scorer.terminate()
                scorer.wait(30)
    finally:
        os.environ.pop("KAFKA_PASSWORD", None)
    log_text = (tmp_path / "scorer.log").read_text()
    assert len(got) == 4, log_text[-3000:]
    assert PASSWORD not in log_text
    assert json.loads((recipe.run_dir / "recipe.json").read_text())["bus"]["security"]["protocol"] == protocol
