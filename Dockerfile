# qfold dashboard: `docker build -t qfold .` then `docker run -p 8501:8501 -v qfold-builds:/app/builds qfold`.
# The image ships the default preset's analyses (analyzer/shipped/), so the first page needs no conversion.
# A full-size conversion needs ~15 GB of memory: give the container that much to build the default for real.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    QFOLD_BUILDS=/app/builds \
    QFOLD_DATA_ROOTS=/data

WORKDIR /app

# Graphviz's dot draws the Graph tab, `qfold graph --out FILE.svg` and the report's layer graphs.
RUN apt-get update \
    && apt-get install -y --no-install-recommends graphviz \
    && rm -rf /var/lib/apt/lists/*

# torch first, the CPU-only wheel, pinned. requirements.txt pins torch==2.13.0, which the installed
# 2.13.0+cpu satisfies (PEP 440 ignores the local label), so the next step never pulls the CUDA build.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY requirements.txt ./
RUN pip install -r requirements.txt

# The code belongs to root and is read-only for the app; only the build cache is writable.
COPY . .
# the `qfold` command (its dependencies are the pinned requirements installed above)
RUN pip install --no-deps .
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin qfold \
    && mkdir -p /app/builds \
    && chown qfold:qfold /app/builds
USER qfold
VOLUME /app/builds
# Model folders and packages the dashboard may read: mount them here (read-only is enough).
VOLUME /data

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).status != 200)"]
# .streamlit/config.toml (copied above) sets headless, the 5 MB upload limit, XSRF protection and no error details.
CMD ["streamlit", "run", "app.py", "--server.address=0.0.0.0", "--server.port=8501"]
