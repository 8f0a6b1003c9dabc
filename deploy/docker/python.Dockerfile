# The offline stand-in for python:3.11-slim-bookworm: Debian's Python 3.11 (with its headers, as
# that image has: torch's inductor compiles against them) on the local Debian
# base that deploy/stack/images.py makes with debootstrap (no image registry needed). The base
# carries the building machine's extra CA certificates, which ca-certificates adds to the store
# here (a TLS-inspecting proxy in front of PyPI), and pip is told to use that store.
ARG BASE=local/debian:bookworm
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv python3-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
