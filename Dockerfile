# fedrec API / worker / beat image (one image, three commands; see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /srv/fedrec

COPY constraints.txt pyproject.toml README.md LICENSE NOTICE alembic.ini ./
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
