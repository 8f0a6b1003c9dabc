"""Build every image of the compose stack on this machine, with no image registry.

    python deploy/stack/images.py             # what is missing, and rollwire's image from this checkout:
                                              # about 6 min the first time on 2 cores, seconds after
    python deploy/stack/images.py --rebuild   # all of them again (docker's layer cache still applies)
    python deploy/stack/images.py --only rollwire
    python deploy/stack/images.py --compile-jaeger   # only Jaeger's Go compile (no engine needed): CI
                                              # starts it in the background before installing

What it builds, each from a source these machines reach (Debian's archive, PyPI, Maven Central,
the Go module proxy) and tagged with the names deploy/compose.offline.yml uses:

    local/debian:bookworm  debootstrap --variant=minbase (needs root); the host's apt sources and
                           its extra CA certificates (a TLS-inspecting proxy) go into the image
    local/python:3.11      Debian's Python on it (deploy/docker/python.Dockerfile)
    local/kafka:4.1.1      Java 17 and the broker jars from Maven (deploy/kafka/Dockerfile)
    local/moto-s3:5        moto's S3 server from PyPI (deploy/s3/Dockerfile)
    local/jaeger:1.75.0    Jaeger v2 compiled on the host with Go (deploy/jaeger/Dockerfile), in
                           parallel with the other builds: only the components its configuration
                           uses (deploy/jaeger/components.go, config.yaml), unoptimized (-N -l),
                           ~3 CPU-minutes; the module proxy here approves v1.75.0, not later
    rollwire:latest        the Dockerfile at the root, BASE=local/python:3.11, the CPU torch wheel
                           from $PIP_FIND_LINKS (../shared/wheels here) instead of PyTorch's index

Build logs go to .cache/stack/<image>.log. Needs a running Docker engine (`docker info`).
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "stack"
JAEGER_PATH = "github.com/jaegertracing/jaeger"
JAEGER_VERSION = "v1.75.0"
JAEGER_COMPONENTS = REPO / "deploy" / "jaeger" / "components.go"
IMAGES = ("debian", "python", "kafka", "s3", "jaeger", "rollwire")
TAGS = {"debian": "local/debian:bookworm", "python": "local/python:3.11", "kafka": "local/kafka:4.1.1",
        "s3": "local/moto-s3:5", "jaeger": "local/jaeger:1.75.0", "rollwire": "rollwire:latest"}


class BuildError(RuntimeError):
    pass


def say(message: str) -> None:
    print(f"[images] {message}", flush=True)


def run(command: list[str], log: Path, *, cwd: Path = REPO, env: dict[str, str] | None = None,
        input_from: subprocess.Popen | None = None) -> None:
    """Runs `command`, appending its output to `log`; a failure names the log and shows its tail."""
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        proc = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                              stdin=input_from.stdout if input_from else None)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise BuildError(f"`{' '.join(command[:4])} …` failed (exit {proc.returncode}); {log}:\n{tail}")


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def check_engine() -> None:
    if shutil.which("docker") is None:
        raise BuildError("no `docker` client on PATH: install Docker (Debian: apt-get install docker.io docker-compose)")
    probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise BuildError("no Docker engine answers (`docker info` failed): start one, e.g. `dockerd &` as root "
                         f"(tests/stack_engine.py does it for the test suite):\n{probe.stderr.strip()}")


def apt_mirror() -> tuple[str, Path]:
    """The Debian mirror this machine's apt uses, and the sources file to copy into the image."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]:
        if not path.exists():
            continue
        text = path.read_text()
        match = re.search(r"^URIs:\s*(\S+/debian)/?\s*$", text, re.M) or re.search(r"^deb\s+(\S+/debian)\s", text, re.M)
        if match:
            return match.group(1), path
    return "http://deb.debian.org/debian", Path("/etc/apt/sources.list")


def build_debian(log: Path) -> None:
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        raise BuildError("the Debian base is made with debootstrap as root: run as root with debootstrap installed "
                         "(apt-get install debootstrap), or `docker pull debian:bookworm && docker tag debian:bookworm "
                         f"{TAGS['debian']}` where a registry is reachable")
    mirror, sources = apt_mirror()
    with tempfile.TemporaryDirectory(prefix="rollwire-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), mirror], log)
        (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
        target = rootfs / "etc/apt/sources.list.d" / sources.name if sources.suffix == ".sources" else \
            rootfs / "etc/apt/sources.list"
        shutil.copy(sources, target)
        certs = rootfs / "usr/local/share/ca-certificates"
        certs.mkdir(parents=True, exist_ok=True)
        for cert in glob.glob("/usr/local/share/ca-certificates/*.crt"):
            shutil.copy(cert, certs)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        run(["docker", "import", "-", TAGS["debian"]], log, input_from=tar)
        tar.wait()


def docker_build(tag: str, context: Path, log: Path, *, dockerfile: Path | None = None,
                 args: dict[str, str] | None = None) -> None:
    command = ["docker", "build", "-t", tag]
    if dockerfile:
        command += ["-f", str(dockerfile)]
    for key, value in (args or {}).items():
        command += ["--build-arg", f"{key}={value}"]
    run(command + [str(context)], log)


def build_kafka(log: Path) -> None:
    run([sys.executable, "deploy/kafka/broker.py", "fetch"], log)
    libs = REPO / "deploy/kafka/libs"
    shutil.rmtree(libs, ignore_errors=True)
    shutil.copytree(REPO / ".cache/kafka/libs", libs)
    docker_build(TAGS["kafka"], REPO / "deploy/kafka", log, args={"BASE": TAGS["debian"]})


def compile_jaeger(log: Path) -> Path:
    """Jaeger v2 from the Go module proxy, compiled once into .cache/stack/jaeger-build; a second
    caller waits for a compile under way (a lock file) instead of starting its own."""
    work = CACHE / "jaeger-build"
    components = hashlib.sha256(JAEGER_COMPONENTS.read_bytes()).hexdigest()[:12]
    binary = work / f"jaeger-{JAEGER_VERSION}-{components}"  # compiled again when the components change
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "compile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        return _compile_jaeger(work, binary, log)


def _compile_jaeger(work: Path, binary: Path, log: Path) -> Path:
    """Jaeger's module from the proxy, copied out of Go's module cache with its components.go
    replaced by deploy/jaeger/components.go (only what deploy/jaeger/config.yaml uses), built with
    the module's own go.sum."""
    if shutil.which("go") is None:
        raise BuildError("Jaeger is compiled with Go (1.24+): install it, or pull jaegertracing/jaeger where a "
                         "registry is reachable")
    env = {**os.environ, "CGO_ENABLED": "0"}
    run(["go", "mod", "download", "-json", f"{JAEGER_PATH}@{JAEGER_VERSION}"], log, cwd=work, env=env)
    downloaded = json.loads(log.read_text().rsplit("$ go mod download", 1)[1].split("\n", 1)[1])
    source = work / f"src-{JAEGER_VERSION}"
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(downloaded["Dir"], source)
    for path in source.rglob("*"):  # the module cache's copy is read-only
        path.chmod(path.stat().st_mode | 0o200)
    internal = source / "cmd" / "jaeger" / "internal"
    shutil.copy(JAEGER_COMPONENTS, internal / "components.go")
    (internal / "components_test.go").unlink(missing_ok=True)
    # Without the compiler's optimizations and inlining (-N -l), and with only the components the
    # stack uses: 3.2 CPU-minutes here (2026-12-03, module cache warm), against 8.6 for every
    # component and 12.1 optimized too, for a binary that serves a test stack's traces from memory.
    run(["go", "build", "-trimpath", "-ldflags=-s -w", "-gcflags=all=-N -l", "-o", str(binary) + ".partial",
         "./cmd/jaeger"], log, cwd=source, env=env)
    Path(str(binary) + ".partial").rename(binary)
    shutil.rmtree(source, ignore_errors=True)
    return binary


def build_jaeger(log: Path) -> None:
    binary = compile_jaeger(log)
    shutil.copy(binary, REPO / "deploy/jaeger/jaeger")
    docker_build(TAGS["jaeger"], REPO / "deploy/jaeger", log, args={"BASE": TAGS["debian"]})


def torch_wheels() -> list[Path]:
    """The CPU torch wheels pip would find through $PIP_FIND_LINKS and ../shared/wheels."""
    folders = os.environ.get("PIP_FIND_LINKS", "").split() + [str(REPO.parent / "shared" / "wheels")]
    return sorted({w for folder in folders for w in Path(folder).glob("torch-*+cpu-*.whl")})


def build_rollwire(log: Path) -> None:
    wheels = REPO / "deploy/docker/wheels"
    for old in wheels.glob("*.whl"):
        old.unlink()
    found = torch_wheels()
    for wheel in found:
        shutil.copy(wheel, wheels / wheel.name)
    args = {"BASE": TAGS["python"]}
    if found:
        args["TORCH_INDEX"] = ""  # the wheel is in the build; PyTorch's index is not reachable here
    docker_build(TAGS["rollwire"], REPO, log, args=args)


BUILDERS: dict[str, Callable[[Path], None]] = {
    "debian": build_debian,
    "python": lambda log: docker_build(TAGS["python"], REPO / "deploy/docker", log,
                                       dockerfile=REPO / "deploy/docker/python.Dockerfile",
                                       args={"BASE": TAGS["debian"]}),
    "kafka": build_kafka,
    "s3": lambda log: docker_build(TAGS["s3"], REPO / "deploy/s3", log, args={"BASE": TAGS["python"]}),
    "jaeger": build_jaeger,
    "rollwire": build_rollwire,
}


ALWAYS = ("rollwire",)
"""Built every time: this checkout's code (from the layer cache, seconds when only the code changed)."""


def build(names: list[str], *, rebuild: bool = False) -> dict[str, float]:
    """Builds the images `names` that are missing, and rollwire's always (in dependency order, Jaeger's
    compile in parallel); `rebuild` builds all of them. Returns the seconds each took. One build at a
    time on this checkout: a second caller (another test process, a background prebuild) waits for
    the first, then finds its images built."""
    check_engine()
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        if not _try_lock(lock):
            say("waiting for another build of these images on this checkout")
            fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(names, rebuild)


def _try_lock(lock) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _build(names: list[str], rebuild: bool) -> dict[str, float]:
    todo = [n for n in IMAGES if n in names and (rebuild or n in ALWAYS or not image_exists(TAGS[n]))]
    for name in names:
        if name not in todo:
            say(f"{TAGS[name]}: already built")
    seconds: dict[str, float] = {}
    compiling: threading.Thread | None = None
    compile_failed: list[BaseException] = []
    if "jaeger" in todo:
        def compile_in_background() -> None:
            try:
                compile_jaeger(CACHE / "jaeger.log")
            except BaseException as exc:  # reported when the jaeger image is built
                compile_failed.append(exc)
        compiling = threading.Thread(target=compile_in_background, daemon=True)
        compiling.start()
    for name in todo:
        if name == "jaeger" and compiling is not None:
            compiling.join()
            if compile_failed:
                raise compile_failed[0]
        log = CACHE / f"{name}.log"
        log.write_text("")
        say(f"{TAGS[name]}: building (log: {log.relative_to(REPO)})")
        started = time.monotonic()
        BUILDERS[name](log)
        seconds[name] = time.monotonic() - started
        say(f"{TAGS[name]}: built in {seconds[name]:.0f} s")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=IMAGES, help="build only these (repeatable)")
    parser.add_argument("--rebuild", action="store_true", help="build even the images that exist")
    parser.add_argument("--compile-jaeger", action="store_true",
                        help="only compile Jaeger (no engine needed), for the image built later")
    args = parser.parse_args(argv)
    if args.compile_jaeger:
        CACHE.mkdir(parents=True, exist_ok=True)
        try:
            say(f"Jaeger compiled: {compile_jaeger(CACHE / 'jaeger.log')}")
        except BuildError as exc:
            print(f"images.py: {exc}", file=sys.stderr)
            return 1
        return 0
    names = args.only or list(IMAGES)
    started = time.monotonic()
    try:
        build(names, rebuild=args.rebuild)
    except BuildError as exc:
        print(f"images.py: {exc}", file=sys.stderr)
        return 1
    say(f"done in {time.monotonic() - started:.0f} s; start the stack with: docker-compose -f docker-compose.yml "
        "-f deploy/compose.offline.yml --profile cpu up -d --no-build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
