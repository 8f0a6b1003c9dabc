"""Fetches the charting library the run explorer's page uses, from npm, into the package.

    python deploy/explore/vendor.py      (`make install` runs it; the image build too)

uPlot (MIT, by Leon Sorokin): small (~50 KB), fast on tens of thousands of points, zoomable, and
made for time series that grow while shown, which is what the explorer's curves are. It is
fetched at build time rather than kept in the repository: the version is pinned here and the
tarball checked against npm's sha512 integrity before anything is unpacked. The files land in
`rollwire/explore/static/vendor/` (ignored by git); a present, matching copy is kept.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

PACKAGE, VERSION = "uplot", "1.6.32"
INTEGRITY = "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
FILES = {"package/dist/uPlot.iife.min.js": "uPlot.iife.min.js", "package/dist/uPlot.min.css": "uPlot.min.css",
         "package/LICENSE": "uPlot.LICENSE"}
REGISTRY = "https://registry.npmjs.org"
TARGET = Path(__file__).resolve().parents[2] / "rollwire" / "explore" / "static" / "vendor"


def fetch(target: Path = TARGET, registry: str = REGISTRY) -> Path:
    stamp = target / f"{PACKAGE}-{VERSION}.stamp"
    if stamp.is_file() and all((target / name).is_file() for name in FILES.values()):
        return target
    url = f"{registry}/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"
    with urllib.request.urlopen(url, timeout=60) as response:
        data = response.read()
    algorithm, _, expected = INTEGRITY.partition("-")
    got = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if got != expected:
        raise SystemExit(f"{url}: integrity {algorithm}-{got} is not the pinned {INTEGRITY}; refusing to unpack it")
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member, name in FILES.items():
            source = archive.extractfile(member)
            if source is None:
                raise SystemExit(f"{url} has no {member}")
            (target / name).write_bytes(source.read())
    stamp.write_text(f"{url}\n{INTEGRITY}\n")
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=REGISTRY, help="npm registry (default: %(default)s)")
    args = parser.parse_args()
    print(f"{PACKAGE} {VERSION}: {fetch(registry=args.registry)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
