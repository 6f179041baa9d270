# The operator image: a static binary on a distroless, non-root base.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY controllers/ controllers/
COPY internal/ internal/
COPY main.go ./
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w" -o /out/zaya-operator .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/zaya-operator /zaya-operator
USER 65532:65532
ENTRYPOINT ["/zaya-operator"]
