# The region image (KubeRay head and GPU workers): Ray 2.60 + the CUDA build of vLLM (the
# `gpu` extra) + this package, whose scheduler.region module the RayService imports.
# docker build -f infra/images/region.Dockerfile -t carbon-scheduler-region .
FROM rayproject/ray:2.60.0-py311-cu128
ENV PIP_NO_CACHE_DIR=1
COPY --chown=ray:users pyproject.toml README.md /home/ray/src/
COPY --chown=ray:users scheduler /home/ray/src/scheduler
RUN pip install "/home/ray/src[gpu]" && rm -rf /home/ray/src
# rayproject/ray's non-root `ray` user (uid 1000, group users 100), numeric so that the kubelet
# can check runAsNonRoot; the RayService pods run as it (infra/render.py RenderOptions.run_as_user).
USER 1000:100
