# The router image: `docker build -f infra/images/router.Dockerfile -t carbon-scheduler-router .`
# The package with its own dependencies and the `otlp` extra (--otlp-endpoint), nothing else: no
# ray[serve], vLLM or torch. The `scheduler` command loads Ray only inside the commands that run
# regions (`up`); tests/unit/infra/test_images.py checks this file and starts the router with Ray,
# vLLM and torch unimportable.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduler ./scheduler
RUN pip install ".[otlp]" && rm -rf /src
RUN useradd --uid 10001 --create-home scheduler
USER 10001
WORKDIR /home/scheduler
ENTRYPOINT []
CMD ["scheduler", "router", "--help"]
