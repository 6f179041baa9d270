# The operator image: one static binary on a non-root base.
#
# The context is a folder holding the binary, built outside Docker (`make images` builds it
# with CGO_ENABLED=0 into bin/image/), so the build needs no Go image and no registry. BASE
# picks the base: the public distroless image by default, `scratch` where nothing can be
# pulled (what `make images` uses; the operator needs no shell, no /tmp, no CA bundle of
# its own: it trusts the cluster's CA from its service account).
#   CGO_ENABLED=0 go build -trimpath -o bin/image/zaya-operator .
#   docker build -f Dockerfile -t zaya-operator:dev bin/image
#   docker build -f Dockerfile --build-arg BASE=scratch -t zaya-operator:dev bin/image
ARG BASE=gcr.io/distroless/static-debian12:nonroot
FROM ${BASE}
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="zaya-operator" \
      org.opencontainers.image.description="Runs and heals distributed training jobs on AMD MI300X clusters" \
      org.opencontainers.image.source="https://github.com/zaya-operator/zaya-operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY zaya-operator /zaya-operator
USER 65532:65532
ENTRYPOINT ["/zaya-operator"]
