"""A real single-node Apache Kafka broker (KRaft) for tests and local development — no Docker.

    python deploy/kafka/broker.py fetch              # resolve the broker jars with Maven (cached)
    python deploy/kafka/broker.py start [--dir D]    # start on free loopback ports, print bootstrap
    python deploy/kafka/broker.py stop  [--dir D]    # stop the broker this script started, by PID

The jars come from Maven Central through `pom.xml` beside this file (Maven keeps its own cache in
`~/.m2`, so only the first fetch downloads). `start` writes `broker.json` (pid, bootstrap address)
into the run directory; `stop` reads it and ends exactly that process. Standard library only, so
the test command can run it before anything else is installed; `tests/conftest.py` imports it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # deploy/: the shared helpers
from pids import stop_pid  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_CACHE = REPO / ".cache" / "kafka"
STARTUP_TIMEOUT_S = 90.0


class BrokerError(RuntimeError):
    """The local broker could not be fetched, started or stopped; the message says why."""


@dataclass(frozen=True)
class BrokerInfo:
    pid: int
    bootstrap: str
    run_dir: str
    listeners: dict[str, str] = field(default_factory=dict)
    """Address of each secured listener by protocol (`SASL_SSL`, `SSL`), when started with `Tls`."""


@dataclass(frozen=True)
class Tls:
    """Secured listeners for a test broker, beside its plaintext one: `SASL_SSL` (SCRAM-SHA-512
    users over TLS) and `SSL` requiring a client certificate (mutual TLS)."""

    keystore_pem: Path
    """The broker's private key (unencrypted PKCS#8) followed by its certificate chain."""
    ca_pem: Path
    """The CA whose signature a client certificate must carry."""
    scram_users: dict[str, str] = field(default_factory=dict)
    """SCRAM-SHA-512 users, name to password, created when the storage is formatted."""


def libs_dir(cache: Path = DEFAULT_CACHE) -> Path:
    return cache / "libs"


def fetch(cache: Path = DEFAULT_CACHE) -> Path:
    """Copies the broker jars into `cache/libs` with Maven; a no-op when they are already there."""
    libs = libs_dir(cache)
    stamp = libs / ".pom-sha"
    pom = (HERE / "pom.xml").read_bytes()
    digest = hashlib.sha256(pom).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and any(libs.glob("kafka_2.13-*.jar")):
        return libs
    if shutil.which("mvn") is None:
        raise BrokerError("Maven (`mvn`) is not on PATH: install it (apt-get install maven) or set "
                          "KAFKA_BOOTSTRAP_SERVERS to a broker you already run.")
    if libs.exists():
        shutil.rmtree(libs)
    libs.mkdir(parents=True)
    cmd = ["mvn", "-q", "-B", "-f", str(HERE / "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={libs}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BrokerError(f"Maven could not resolve the Kafka broker jars (exit {proc.returncode}):\n"
                          f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    stamp.write_text(digest)
    return libs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_properties(run_dir: Path, port: int, controller_port: int, secured: dict[str, int] | None = None,
                       tls: Tls | None = None) -> str:
    # Single node, loopback only, replication factors of 1, and group timings short enough that a
    # test sees a dead consumer's partitions move within seconds.
    secured = secured or {}
    extra = "".join(f",{name}://127.0.0.1:{p}" for name, p in secured.items())
    security = []
    if tls is not None:
        security = [
            "sasl.enabled.mechanisms=SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "ssl.keystore.type=PEM", f"ssl.keystore.location={tls.keystore_pem}",
            "ssl.truststore.type=PEM", f"ssl.truststore.location={tls.ca_pem}",
            "listener.name.ssl.ssl.client.auth=required",
        ]
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}{extra}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}{extra}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT" +
        "".join(f",{name}:{name}" for name in secured),
        *security,
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={run_dir / 'data'}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "group.min.session.timeout.ms=500",
        "log.segment.bytes=16777216",
        "log.cleaner.backoff.ms=1000",
        "message.max.bytes=8388608",
        "auto.create.topics.enable=false",
        "",
    ])


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrokerError(f"the Kafka broker exited with code {proc.returncode} while starting; "
                              f"last lines of {log}:\n{_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise BrokerError(f"the Kafka broker did not listen on port {port} within {timeout:.0f} s; "
                      f"last lines of {log}:\n{_tail(log)}")


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def start(run_dir: Path, cache: Path = DEFAULT_CACHE, heap: str = "512m", tls: Tls | None = None) -> BrokerInfo:
    """Formats fresh storage in `run_dir` and starts a broker there; returns once it accepts. With
    `tls`, also on a SASL_SSL and an SSL (client certificate required) listener."""
    if shutil.which("java") is None:
        raise BrokerError("Java 17+ (`java`) is not on PATH: Kafka 4 brokers need it "
                          "(apt-get install openjdk-17-jre-headless).")
    libs = fetch(cache)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    port, controller_port = _free_port(), _free_port()
    secured = {"SASL_SSL": _free_port(), "SSL": _free_port()} if tls is not None else {}
    props = run_dir / "server.properties"
    props.write_text(_server_properties(run_dir, port, controller_port, secured, tls))
    java = _java(libs, heap)
    users = [arg for name, password in (tls.scram_users if tls else {}).items()
             for arg in ("--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]")]
    fmt = subprocess.run(java + ["kafka.tools.StorageTool", "format", "--standalone",
                                 "-t", uuid.uuid4().hex[:22], "-c", str(props), *users],
                         capture_output=True, text=True)
    if fmt.returncode != 0:
        raise BrokerError(f"formatting Kafka storage failed:\n{fmt.stdout}{fmt.stderr}")
    return _launch(java, run_dir, port, {name: f"127.0.0.1:{p}" for name, p in secured.items()})


def start_again(run_dir: Path, cache: Path = DEFAULT_CACHE, heap: str = "512m") -> BrokerInfo:
    """Starts a stopped broker again on its storage in `run_dir`, on the same ports (its clients
    reconnect to the address they know): a broker restart, for fault tests."""
    props = run_dir / "server.properties"
    if not props.exists():
        raise BrokerError(f"no server.properties in {run_dir}: start a broker there first")
    advertised = next(line for line in props.read_text().splitlines() if line.startswith("advertised.listeners="))
    addresses = dict(entry.split("://") for entry in advertised.split("=", 1)[1].split(","))
    port = int(addresses.pop("PLAINTEXT").rsplit(":", 1)[1])
    return _launch(_java(libs_dir(cache), heap), run_dir, port, addresses)


def _java(libs: Path, heap: str) -> list[str]:
    return ["java", f"-Xmx{heap}", f"-Xms{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={HERE / 'log4j2.properties'}",
            "-cp", f"{libs}/*"]


def _launch(java: list[str], run_dir: Path, port: int, listeners: dict[str, str] | None = None) -> BrokerInfo:
    log = run_dir / "broker.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(java + ["kafka.Kafka", str(run_dir / "server.properties")], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _wait_for_port(port, proc, log, STARTUP_TIMEOUT_S)
    info = BrokerInfo(pid=proc.pid, bootstrap=f"127.0.0.1:{port}", run_dir=str(run_dir), listeners=listeners or {})
    (run_dir / "broker.json").write_text(json.dumps(asdict(info)))
    return info


def stop(info: BrokerInfo, timeout: float = 20.0) -> None:
    """Ends the broker process `info.pid` (SIGTERM, then SIGKILL after `timeout`)."""
    stop_pid(info.pid, timeout)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["fetch", "start", "stop"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_CACHE / "run",
                        help="run directory for storage, logs and broker.json")
    args = parser.parse_args(argv)
    try:
        if args.action == "fetch":
            print(fetch())
        elif args.action == "start":
            print(start(args.dir).bootstrap)
        else:
            record = args.dir / "broker.json"
            if not record.exists():
                print(f"no broker.json in {args.dir}: nothing to stop", file=sys.stderr)
                return 0
            stop(BrokerInfo(**json.loads(record.read_text())))
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
