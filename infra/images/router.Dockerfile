# The router image: `docker build -f infra/images/router.Dockerfile -t carbon-scheduler-router .`
# ray[serve] is here only because `scheduler`'s command table imports the Serve CLI module at
# start-up (scheduler.serve.cli -> ray); the router itself never starts Ray. The otlp extra: traces
# (docs/tracing.md) turn on with the OTEL_EXPORTER_OTLP_*ENDPOINT variables alone.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduler ./scheduler
RUN pip install ".[otlp]" "ray[serve]==2.60.0" && rm -rf /src
RUN useradd --uid 10001 --create-home scheduler
USER 10001
WORKDIR /home/scheduler
ENTRYPOINT []
CMD ["scheduler", "router", "--help"]
