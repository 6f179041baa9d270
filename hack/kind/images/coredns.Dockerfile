# CoreDNS for the kind node (hack/kind/node-image.sh): the static binary hack/tools.sh
# builds (COREDNS_VERSION, the one kubeadm deploys). kubeadm's Deployment passes only
# -conf, and grants NET_BIND_SERVICE for port 53.
FROM scratch
COPY coredns /coredns
EXPOSE 53 53/udp
ENTRYPOINT ["/coredns"]
