# One image for every PrFaaS component: the `prfaas` console script.
#   operator: prfaas operator ...        router / prefill gateway: prfaas router --config FILE ...
#   engine emulator: prfaas engine ...   link emulator: prfaas link ...
# The Helm chart (helm/prfaas) runs each with its arguments; the entrypoint is the console script itself.
# CI cannot run a Docker engine: tests/integration/test_helm.py builds the same wheel (pip wheel --no-deps .)
# and checks that each subcommand below exists in it.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduler ./scheduler
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="prfaas" \
      org.opencontainers.image.description="Prefill-as-a-Service control plane: operator, router/gateway, engine and link emulators" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.prfaas.entrypoints="operator router engine link"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels prfaas && rm -rf /wheels \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin prfaas
USER 10001:10001
EXPOSE 8000 8080 8443
ENTRYPOINT ["prfaas"]
CMD ["--help"]
