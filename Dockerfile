# syntax=docker/dockerfile:1
# The web tier: the Django/Channels app under several Daphne processes (deploy/web.py).
# compose.yaml runs it twice: `web.py setup` once (migrations, static files), then
# `web.py serve`. Code is run from /app, not installed, so templates and static files
# resolve next to it.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=chatsite.settings \
    STATIC_ROOT=/srv/static \
    VAR_DIR=/var/lib/chat

WORKDIR /app

# Dependencies first, pinned by constraints.txt, so a code change reuses this layer.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && pip install -r requirements.txt -c constraints.txt \
 && rm requirements.txt

# Directories the app writes are owned by its user; named volumes mounted there start
# with this ownership.
RUN useradd --system --user-group --uid 10001 --home-dir /app --no-create-home chat \
 && mkdir -p /srv/static /var/lib/chat /run/metrics \
 && chown chat:chat /srv/static /var/lib/chat /run/metrics

COPY manage.py ./
COPY chatsite ./chatsite
COPY streaming ./streaming
COPY frontend ./frontend
COPY deploy/web.py ./deploy/web.py

USER chat
EXPOSE 8001 8002 8003 8004
CMD ["python", "deploy/web.py", "serve"]
