# A Kubernetes component image for the kind node (hack/kind/node-image.sh): kube-apiserver,
# kube-controller-manager, kube-scheduler or etcd as hack/tools.sh built them, on the Debian
# base since they link glibc. kubeadm's static pods run them by name, from PATH.
ARG BASE
FROM ${BASE}
ARG BINARY
COPY ${BINARY} /usr/local/bin/${BINARY}
