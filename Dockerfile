# The `zoo serve` container that `zoo export RUN --format kserve --kserve-runtime zoo` deploys
# (KServe custom predictor): KServe's storage initializer puts the exported Triton repository in
# /mnt/models and the manifest's args name the model in it.
#
#   docker build -t zoo-serve .
#   docker run --rm -p 8080:8080 -e ZOO_API_KEY="$(openssl rand -hex 16)" \
#       -v "$PWD/isvc_model_repository/NAME/1:/mnt/models:ro" zoo-serve
#
# zoo serve refuses to listen on 0.0.0.0 without an API key; the health endpoints stay open.
#
# Not built by the test suite (no docker there); tests/test_kserve_manifest.py checks this file's
# user, port, entry point and health check against a real `zoo serve` and the manifest.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/zoo
# torch is a dependency of the package, not of serving: its CPU wheels keep the image small
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.6" "torchvision>=0.21"
COPY pyproject.toml README.md ./
COPY zoo ./zoo
COPY train ./train
COPY deploy ./deploy
COPY cli ./cli
RUN pip install . \
    && useradd --uid 1000 --create-home --shell /usr/sbin/nologin zoo

# numeric, so that Kubernetes' runAsNonRoot can check it
USER 1000
ENV HOME=/home/zoo
EXPOSE 8080
# ready only after the model is loaded and warmed up at batch 1 and at max batch
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/v2/health/ready', timeout=2)"]
ENTRYPOINT ["zoo", "serve"]
CMD ["/mnt/models", "--host", "0.0.0.0", "--port", "8080"]
