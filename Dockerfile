# fedrec API / worker / beat image (one image, three commands; see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /srv/fedrec

# opacus depends on torch; install the CPU build first so pip never pulls a CUDA build
# (several GB): the lock's `torch==2.13.0` matches PyTorch's `2.13.0+cpu`. Override
# TORCH_INDEX_URL for a local mirror.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY constraints.txt ./
RUN pip install --no-deps --index-url "$TORCH_INDEX_URL" "$(grep "^torch==" constraints.txt)"

COPY pyproject.toml README.md LICENSE alembic.ini ./
COPY app ./app
COPY worker ./worker
COPY algorithms ./algorithms
COPY privacy ./privacy
COPY migrations ./migrations
# the CLI registers `fedrec agent` and `fedrec admin` (fedrec.client) beside the server
COPY agent ./agent
COPY fedrec ./fedrec
RUN pip install -c constraints.txt . && useradd --system --uid 10001 fedrec
USER fedrec

EXPOSE 8000
CMD ["fedrec", "serve", "--host", "0.0.0.0", "--port", "8000"]
