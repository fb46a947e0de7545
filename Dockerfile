# One image for every PrFaaS component: the `prfaas` console script.
#   operator: prfaas operator ...        router / prefill gateway: prfaas router --config FILE ...
#   engine emulator: prfaas engine ...   link emulator: prfaas link ...
# The Helm chart (helm/prfaas) runs each with its arguments; the entrypoint is the console script itself.
#
# BASE_IMAGE: any Debian-like image with python3 (3.11+), its venv module and useradd. The default is the official
# slim image (python3 in /usr/local/bin); tests/integration/test_image.py builds this file with buildah on a Debian
# base made by mmdebstrap (python3 in /usr/bin). Both work because everything lives in a venv, /opt/prfaas, made
# by the same base in both stages. Runtime dependencies only, installed from the lock with hashes
# (requirements/runtime.txt; scripts/lock.sh refreshes it); the wheel's own build backend from requirements/build.txt.
# docs/image.md: building it here and in CI, running it, the release workflow.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_CACHE_DIR=/root/.cache/pip
# optional, for a build from a local wheelhouse (tests/integration/test_image.py mounts scripts/wheelhouse.sh's
# folder and passes PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse); unset, pip uses the index. Hashes are checked either way.
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
WORKDIR /src
COPY requirements/ ./requirements/
# pip's cache in a build cache mount: a rebuild downloads nothing it has seen (the mount is not in the image)
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv /opt/build \
 && /opt/build/bin/pip install --quiet --require-hashes -r requirements/build.txt \
 && python3 -m venv /opt/prfaas \
 && /opt/prfaas/bin/pip install --quiet --require-hashes -r requirements/runtime.txt
COPY pyproject.toml README.md LICENSE ./
COPY scheduler ./scheduler
COPY operator ./operator
# the wheel alone (--no-deps): every dependency came from the lock above; pip check proves the lock covers them
RUN /opt/build/bin/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/prfaas/bin/pip install --quiet --no-deps /wheels/prfaas-*.whl \
 && /opt/prfaas/bin/pip check \
 && /opt/prfaas/bin/pip uninstall --quiet --yes pip setuptools

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="prfaas" \
      org.opencontainers.image.description="Prefill-as-a-Service control plane: operator, router/gateway, engine and link emulators" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.prfaas.entrypoints="operator router engine link"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp PATH=/opt/prfaas/bin:$PATH
COPY --from=build /opt/prfaas /opt/prfaas
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin prfaas
USER 10001:10001
EXPOSE 8000 8080 8443
ENTRYPOINT ["/opt/prfaas/bin/prfaas"]
CMD ["--help"]
