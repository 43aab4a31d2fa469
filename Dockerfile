# syntax=docker/dockerfile:1
#
# specserve container images (see docs/deploy.md).
#
#   CPU, bundled model pair (default target):
#       docker build -t specserve:0.1.0 .
#   GPU nodes, CUDA base image + CUDA build of torch:
#       docker build --target gpu -t specserve:0.1.0-cuda .
#
# Both follow the Makefile's setup order: a virtual environment, then
# torch==$TORCH_VERSION on its own (CPU wheel or CUDA wheel), then the package,
# so that pip never swaps the chosen torch build for another one.
# Every runtime setting is a SPECSERVE_* environment variable (`docker run -e ...`).
# BuildKit builds only the stages the chosen target needs.

ARG PYTHON_IMAGE=python:3.11-slim
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04
ARG TORCH_VERSION=2.13.0

# ---------------------------------------------------------------- GPU build ---
FROM ${CUDA_IMAGE} AS gpu-base
ENV DEBIAN_FRONTEND=noninteractive
# Ubuntu's python3 (3.12); the CUDA wheel of torch ships its own CUDA user-space
# libraries, the base image supplies the CUDA compat layer the driver hooks expect.
# Versions are not pinned: the base image tag fixes the Ubuntu release, and
# point-release .debs rotate out of the archive, which would break rebuilds.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*

FROM gpu-base AS gpu-builder
ARG TORCH_VERSION
ARG TORCH_CUDA_INDEX_URL=https://download.pytorch.org/whl/cu130
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --no-cache-dir --index-url "${TORCH_CUDA_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY gateway ./gateway
COPY policies ./policies
RUN pip install --no-cache-dir .

FROM gpu-base AS gpu
RUN groupadd --system --gid 10001 specserve \
    && useradd --system --no-log-init -l --uid 10001 --gid 10001 \
       --home-dir /home/specserve --create-home --shell /usr/sbin/nologin specserve
COPY --from=gpu-builder /opt/venv /opt/venv
WORKDIR /app
# The bundled pair is kept so the image can smoke-test itself; a GPU deployment
# points SPECSERVE_MODEL / SPECSERVE_DRAFT_MODEL at real checkpoints instead.
COPY --chown=10001:10001 assets/models /app/assets/models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/home/specserve/.cache/huggingface \
    SPECSERVE_HOST=0.0.0.0 \
    SPECSERVE_PORT=8000 \
    SPECSERVE_MODEL=/app/assets/models/target \
    SPECSERVE_DRAFT_MODEL=/app/assets/models/draft \
    SPECSERVE_DEVICE=cuda \
    SPECSERVE_DTYPE=bfloat16
USER 10001:10001
EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('SPECSERVE_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["specserve", "serve"]

# ---------------------------------------------------------------- CPU build ---
FROM ${PYTHON_IMAGE} AS cpu-builder
ARG TORCH_VERSION
ARG TORCH_CPU_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, from the CPU index: the package's own `torch>=2.4,<3` is then
# already satisfied and pip does not pull the multi-GB CUDA build from PyPI.
RUN pip install --no-cache-dir --index-url "${TORCH_CPU_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY gateway ./gateway
COPY policies ./policies
RUN pip install --no-cache-dir .

# The last stage is the default target: the CPU image with the bundled pair.
FROM ${PYTHON_IMAGE} AS cpu
RUN groupadd --system --gid 10001 specserve \
    && useradd --system --no-log-init -l --uid 10001 --gid 10001 \
       --home-dir /home/specserve --create-home --shell /usr/sbin/nologin specserve
COPY --from=cpu-builder /opt/venv /opt/venv
WORKDIR /app
COPY --chown=10001:10001 assets/models /app/assets/models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/home/specserve/.cache/huggingface \
    OMP_NUM_THREADS=2 \
    SPECSERVE_HOST=0.0.0.0 \
    SPECSERVE_PORT=8000 \
    SPECSERVE_MODEL=/app/assets/models/target \
    SPECSERVE_DRAFT_MODEL=/app/assets/models/draft \
    SPECSERVE_SERVED_MODEL_NAME=specserve-tiny \
    SPECSERVE_DEVICE=cpu
USER 10001:10001
EXPOSE 8000
STOPSIGNAL SIGTERM
# slim has no curl: probe /health with the standard library (a non-2xx answer
# or no answer raises, so python exits 1 and the container turns unhealthy).
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('SPECSERVE_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["specserve", "serve"]
