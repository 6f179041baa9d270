# kube-proxy for the kind node (hack/kind/node-image.sh): the binary hack/tools.sh built, on
# the Debian base with the iptables and conntrack it execs. kubeadm's DaemonSet runs
# /usr/local/bin/kube-proxy: here a wrapper that first picks the iptables backend the node uses.
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iptables conntrack \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/log/* /usr/share/doc/* /usr/share/man/*
COPY kube-proxy /usr/local/lib/kube-proxy/kube-proxy
COPY kube-proxy-wrapper /usr/local/bin/kube-proxy
