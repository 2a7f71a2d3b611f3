# syntax=docker/dockerfile:1
# The pav image: `pav` for the manager (Deployment) and the offline tools, `pav-driver
# --mode=controller|node` (per-provisioner StatefulSet and DaemonSet; `pav driver` is the
# same command, in the binary that also links the manager: cmd/pav-driver), and `pav-report`,
# which carries the /pav files of a provisioner's controller-side pods to the driver: as their
# sidecar, or run from this image mounted as an image volume (--pod-report exec).
#
#   docker build -t ghcr.io/pods-as-volumes/pav:v0.2.0 .
#   docker build --build-arg VERSION=v0.2.1 -t my.registry/pav:v0.2.1 .   (then set
#   images.pav in deploy/manager/config.yaml and the manager's image in deploy/)
#
# The image's user stays root: the node plugin mounts (as root, privileged) and the report
# sidecar must read /pav files in whatever user's pod runs it; the manager and the
# controller plugin are made non-root by their manifests (runAsNonRoot, uid 65532).
# This machine builds the local cluster's images without Docker: hack/images/build.sh.

ARG GO_VERSION=1.26
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=v0.2.0
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/pav ./cmd/pav && \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/pav-driver ./cmd/pav-driver && \
    go build -trimpath -ldflags "-s -w" -o /out/pav-report ./cmd/pav-report

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/pav /out/pav-driver /out/pav-report /usr/local/bin/
# `pav-report` (and `pav report`, for pods of older versions) is started by name: PATH must hold it.
# Mounted as an image volume it is run by path: podrunner.ReportExecPath expects /usr/local/bin.
ENV PATH=/usr/local/bin:/usr/bin:/bin
ENTRYPOINT ["/usr/local/bin/pav"]
