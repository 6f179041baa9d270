# zaya-operator: `make demo` runs the operator on a local cluster, `make test` runs every test.
include hack/tools/versions.env

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
BIN := $(CURDIR)/bin
GO_TEST_FLAGS ?=
# Packages with unit tests: everything but the envtest and cluster suites under test/.
UNIT_PKGS = $(shell go list ./... | grep -v -e /test/integration -e /test/e2e)

##@ General

# Every target with a `## ` description, under its `##@` section. README.md holds a copy of the
# output that make verify keeps equal.
HELP = awk 'BEGIN { FS = ":.*\#\# "; print "Usage: make <target>" } \
	/^\#\#@ / { printf "\n%s\n", substr($$0, 5) } \
	/^[a-zA-Z0-9_.-]+:.*\#\# / { printf "  %-18s %s\n", $$1, $$2 }' $(firstword $(MAKEFILE_LIST))

.PHONY: help
help: ## Show the targets.
	@$(HELP)

##@ Build

.PHONY: tools
tools: ## Build every pinned tool and control-plane binary into bin/ (cached).
	hack/tools.sh all

.PHONY: tools-ci
tools-ci: ## Build the tools make test uses.
	hack/tools.sh controller-gen golangci-lint helm promtool krew cluster

.PHONY: manifests
manifests: ## Generate the CRD and RBAC (config/, the chart), the Grafana dashboard, docs/api-reference.md and the chart's README.
	hack/tools.sh controller-gen
	@# CRDs of our API only: internal/kueue mirrors a few of Kueue's types, never installed by us.
	$(BIN)/controller-gen crd:generateEmbeddedObjectMeta=true paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(BIN)/controller-gen rbac:roleName=manager-role paths=./... output:rbac:artifacts:config=config/rbac
	@# Bounds for the embedded Kubernetes types that markers cannot reach (hack/crdbounds).
	go run ./hack/crdbounds config/crd/bases/*.yaml
	@# The Helm chart ships the same CRD and grants the same rules (test/chart checks both).
	cp config/crd/bases/*.yaml charts/zaya-operator/crds/
	cp config/rbac/role.yaml charts/zaya-operator/files/manager-role.yaml
	go run ./hack/apidocs -crd config/crd/bases/training.zaya.dev_zayatrainingjobs.yaml -out docs/api-reference.md
	@# The Grafana dashboard, typed code with Grafana's foundation SDK (hack/dashboard).
	go run ./hack/dashboard -out charts/zaya-operator/files/dashboards/zaya-operator.json
	@# The chart's README (helm show readme) from its values and their comments.
	go run ./hack/chartdocs -chart charts/zaya-operator

.PHONY: generate
generate: ## Generate DeepCopy methods.
	hack/tools.sh controller-gen
	$(BIN)/controller-gen object:headerFile=hack/boilerplate.go.txt paths=./...

.PHONY: build
build: ## Build the operator binary and the kubectl plugin (bin/kubectl-zaya).
	go build -trimpath -o $(BIN)/zaya-operator .
	go build -trimpath -o $(BIN)/kubectl-zaya ./cmd/kubectl-zaya

.PHONY: release
release: ## Build a release into dist/ (VERSION=vX.Y.Z): kubectl-zaya for each platform, its krew manifest, the chart's package, checksums.
	hack/tools.sh helm
	go run ./hack/release -version "$${VERSION:?set VERSION=vX.Y.Z}" -out dist

.PHONY: images
images: ## Build the operator, worker and fake device plugin images with no registry (hack/images.sh; needs Docker).
	hack/images.sh

##@ Test

.PHONY: test
test: verify lint test-unit test-integration test-min-kube test-e2e test-helm test-kueue test-kind-if-docker ## Run everything CI runs.

.PHONY: verify
verify: manifests generate ## Fail on stale generated files, formatting or README's make help, and on tracked files that are binary or over 1 MiB without a reason.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	@git diff --exit-code -- config api charts docs || { echo "generated files are stale: run 'make manifests generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- config api charts docs)" || { echo "untracked generated files:"; git status --porcelain -- config api charts docs; exit 1; }
	@hack/check-tracked-files.sh
	@hack/check-tracked-files-test.sh
	@diff -u <(sed -n '/^<!-- BEGIN make help -->$$/,/^<!-- END make help -->$$/{/^<!--/d;/^```/d;p;}' README.md) <($(HELP)) || \
		{ echo "README.md's make help block is stale: paste 'make -s help' between its markers"; exit 1; }

.PHONY: lint
lint: ## go vet and golangci-lint.
	go vet ./...
	go vet -tags rocm ./workers/...
	go vet -tags e2e ./test/...
	hack/tools.sh golangci-lint
	$(BIN)/golangci-lint run ./...
	$(BIN)/golangci-lint run --build-tags rocm ./workers/...
	$(BIN)/golangci-lint run --build-tags e2e ./test/...

.PHONY: test-unit
test-unit: ## Unit tests (the chart's need helm, kubectl and promtool; the release's helm and krew).
	hack/tools.sh helm k8s promtool krew
	go test -race $(GO_TEST_FLAGS) $(UNIT_PKGS)
	go test -race -tags rocm $(GO_TEST_FLAGS) ./workers/rocm/... ./workers/train/...

.PHONY: fuzz
fuzz: ## Fuzz the job constructors (FUZZTIME=2m); go test runs the saved seeds only.
	go test ./controllers/ -run '^$$' -fuzz FuzzConstructors -fuzztime $${FUZZTIME:-2m}

.PHONY: test-helm
test-helm: build ## helm install the chart into a local cluster and run a sample job through it.
	hack/helm-e2e.sh $(GO_TEST_FLAGS)

.PHONY: chaos
chaos: ## Long randomized chaos soak of a real training job (CHAOS_FAULTS=12, CHAOS_SEED random); prints a table.
	ZAYA_CHAOS_FAULTS=$${CHAOS_FAULTS:-12} ZAYA_CHAOS_SEED=$${CHAOS_SEED:-$$(date +%s)} ZAYA_CHAOS_REPORT=$(BIN)/chaos-report.txt \
		hack/e2e.sh -run TestTrainingJobSurvivesChaos -timeout 90m -v > $(BIN)/chaos.log 2>&1 || { tail -80 $(BIN)/chaos.log; exit 1; }
	cat $(BIN)/chaos-report.txt

.PHONY: test-integration
test-integration: ## Integration tests on a real kube-apiserver and etcd (envtest).
	hack/tools.sh envtest
	KUBEBUILDER_ASSETS=$(BIN)/envtest go test $(GO_TEST_FLAGS) ./test/integration/...

# What needs a Kubernetes newer than the oldest supported: container restart rules (1.34+) for
# in-place restarts, and the feature gates that switch them off.
NEEDS_NEWER_KUBE = TestInPlaceRestartSurvivesAnOperatorRestart|TestARankWhosePodVanishesIsReplacedInPlace|TestStalledInPlaceRestartIsEscalated|TestANodeReplacementSurvivesAnOperatorRestartAndAProcessFault|TestAnAPIServerThatDropsRestartRulesIsFoundBeforeThePodsAreMade|TestOperatorNeedsExactlyTheGeneratedRBAC

.PHONY: test-min-kube
test-min-kube: ## The integration suite on the oldest supported Kubernetes (the chart's kubeVersion), less what needs a newer one.
	hack/tools.sh envtest-min
	KUBEBUILDER_ASSETS=$(BIN)/envtest-min ZAYA_KUBE_MIN=$(KUBE_MIN_VERSION) go test $(GO_TEST_FLAGS) ./test/integration/... -skip '$(NEEDS_NEWER_KUBE)'

.PHONY: test-e2e
test-e2e: build ## End-to-end tests on a local cluster of fake MI300X nodes (kwok).
	ZAYA_CLUSTER=zaya-e2e hack/e2e.sh $(GO_TEST_FLAGS)

.PHONY: test-kind
test-kind: ## The operator on real kubelets: kind from a node image built here, fake AMD devices, the chart, every recovery path (needs Docker).
	hack/kind/e2e.sh $(GO_TEST_FLAGS)

# make test runs the kind suite wherever a Docker engine answers (every CI machine has one).
.PHONY: test-kind-if-docker
test-kind-if-docker:
	@if docker info >/dev/null 2>&1; then $(MAKE) test-kind; else echo "test-kind: skipped: no Docker engine answers"; fi

.PHONY: test-kueue
test-kueue: build ## Both Kueue paths against a real Kueue built from KUEUE_SRC (a v0.19 checkout); skipped without it.
	@if [ -n "$${KUEUE_SRC:-}" ]; then hack/kueue-e2e.sh all; else echo "test-kueue: skipped: set KUEUE_SRC to a Kueue source checkout (docs/kueue.md)"; fi

##@ Run

.PHONY: demo
demo: build ## Run the operator's main job on a local cluster of fake MI300X nodes.
	hack/demo.sh

.PHONY: cluster-up
cluster-up: ## Start the local cluster (NODES=4).
	hack/cluster.sh up $(or $(NODES),4)

.PHONY: cluster-down
cluster-down: ## Delete the local cluster.
	hack/cluster.sh down
