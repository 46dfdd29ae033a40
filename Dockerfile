# syntax=docker/dockerfile:1
#
# The course image: JupyterLab and SSH on top of PyTorch with CUDA.
# Build: docker build -t multigpu-course .
# Run:   docker run --gpus all -it -p 127.0.0.1:8888:8888 multigpu-course

# Pinned, never "latest", so every build gets the same stack. PyTorch 2.8 with
# CUDA 12.8 and cuDNN 9: a CUDA 12.x build runs on any host driver of the 12
# line, 12.8 also covers the newest GPUs, and torch 2.8 sits inside the range
# pyproject.toml admits, so installing the course reinstalls nothing large.
# "runtime" rather than "devel" because the course compiles no CUDA code: no nvcc,
# no CUDA headers, gigabytes smaller. The one compiler it needs is added below.
FROM pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime

LABEL org.opencontainers.image.title="multigpu-course" \
      org.opencontainers.image.description="Multi-GPU training with PyTorch, from one GPU to many: lessons, solutions, grader, JupyterLab and SSH" \
      org.opencontainers.image.base.name="docker.io/pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# sshd for long jobs, tini as PID 1 so that orphaned DataLoader workers and
# kernels are reaped and signals reach the services. g++ (and gcc with it) for
# torch.compile (lesson 08's --compile): on GPUs Triton builds a small C launcher
# for its kernels at run time, on the CPU inductor writes C++, and this runtime
# image has no compiler (pytorch/pytorch#116696; later runtime images add gcc,
# pytorch/pytorch#170235). Versions come from the pinned base image's Ubuntu
# release, which keeps its security updates.
# openssh-server generates host keys while installing; they are deleted so that
# no two containers of this image share an identity (the entrypoint makes
# fresh ones on first start).
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        g++ \
        openssh-server \
        tini \
    && rm -rf /var/lib/apt/lists/* \
    && rm -f /etc/ssh/ssh_host_* \
    && mkdir -p /run/sshd

# A fixed uid of 1000 matches the first user of most Linux hosts, so files
# written to bind mounts belong to the person who ran the container. Some
# Ubuntu bases already hold uid 1000 under another name.
RUN if id -u 1000 >/dev/null 2>&1; then userdel --remove "$(id -nu 1000)"; fi \
    && useradd --uid 1000 --user-group --create-home --shell /bin/bash student \
    && usermod --password '*' student \
    && mkdir -p /workspace/checkpoints /workspace/data /workspace/logs /var/lib/course/ssh \
    && chown student:student /workspace /workspace/checkpoints /workspace/data /workspace/logs /var/lib/course/ssh \
    && chmod 700 /var/lib/course/ssh \
    && useradd --uid 1001 --user-group --no-create-home --shell /usr/sbin/nologin runner

# `runner` (above) is whom the `grade` service of compose.yaml runs submitted
# code as (COURSE_CHILD_USER): it owns nothing here, so it cannot change the
# course, the tests or the results, nor signal the grader, and the last RUN
# below keeps the reference solutions from it.

# Dependencies first, from the project's own pyproject.toml, so that editing a
# lesson does not reinstall them. An empty stand-in package lets pip resolve
# the project before its sources are copied. The constraint holds torch and
# torchvision at the versions the image ships, so the CUDA build is never
# swapped for a generic one.
WORKDIR /tmp/course-deps
COPY pyproject.toml ./
RUN mkdir course \
    && touch course/__init__.py README.md \
    && pip list --format=freeze | grep -iE '^(torch|torchvision)==' > /tmp/image-torch.txt \
    && pip install --constraint /tmp/image-torch.txt ".[container]" \
    && pip uninstall --yes course \
    && rm -rf /tmp/course-deps /tmp/image-torch.txt

# Container support files change rarely; they go before the course sources.
COPY --chmod=0755 docker/entrypoint.sh /usr/local/bin/course-entrypoint
COPY --chmod=0755 docker/healthcheck.py /usr/local/bin/course-healthcheck
COPY --chmod=0644 docker/sshd_config docker/jupyter_server_config.py /etc/course/

# The course as shipped lives in /opt/course; the student works in /workspace,
# a volume. On every start the entrypoint copies into /workspace whatever of
# /opt/course is missing there, and never overwrites a file: a fresh volume
# gets the starters, and edits survive new containers and new images.
COPY --chown=student:student . /opt/course/
RUN pip install --no-deps /opt/course \
    && rm -rf /opt/course/build /opt/course/*.egg-info \
    && chmod -R o-rwx /opt/course/solutions
WORKDIR /workspace

# Numeric, so that orchestrators can verify the image does not run as root
# without reading its /etc/passwd.
USER 1000:1000

EXPOSE 8888 22
VOLUME ["/workspace", "/workspace/checkpoints", "/workspace/data", "/workspace/logs"]

HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["course-healthcheck"]

ENTRYPOINT ["/usr/bin/tini", "--", "course-entrypoint"]
CMD ["jupyter"]
