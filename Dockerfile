# The ForkLab worker image: the package and every dependency baked in (nothing is installed
# at container start), bubblewrap for the sandboxes, and a non-root user. Build and run it
# with docker-compose.yml (see docs/deployment.md); `forklab` is the entrypoint, so the
# same image also runs the CLI: `docker run --rm forklab-worker report <experiment id>`.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY forklab ./forklab
# the extras of the stores the compose deployment shares (docs/deployment.md): S3 artifacts
# and the PostgreSQL ledger; Daytona and Braintrust are extras an image adds when it uses them
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[s3,postgres]'

FROM ${PYTHON_IMAGE}
# bubblewrap confines workload code (own namespaces, read-only root); Debian 12's package.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap=0.8.0-2+deb12u1 \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 forklab \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin forklab
COPY --from=wheels /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels 'forklab[s3,postgres]==0.1.0' \
    && rm -rf /wheels
USER 10001:10001
WORKDIR /home/forklab
# Local scratch only (sandboxes, approval tokens issued on this host); the artifact store
# and the ledger are the shared ones named by FORKLAB_ARTIFACTS and FORKLAB_LEDGER.
ENV FORKLAB_HOME=/home/forklab/.forklab \
    PYTHONUNBUFFERED=1
ENTRYPOINT ["forklab"]
CMD ["worker"]
