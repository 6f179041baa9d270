# The pod sandbox ("pause") image for the kind node (hack/kind/node-image.sh): Kubernetes'
# own pause.c (build/pause/linux in the k8s.io/kubernetes module), compiled static here.
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
