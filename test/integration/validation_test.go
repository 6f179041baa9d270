package integration

import (
	"context"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// validJob is the manifest every case starts from; kubectl apply of it must succeed.
const validJob = `
apiVersion: training.zaya.dev/v1alpha1
kind: ZayaTrainingJob
metadata:
  name: llm
spec:
  nodes: 4
  template:
    spec:
      containers:
      - name: worker
        image: zaya-worker:test
  checkpoint:
    volume:
      size: 10Ti
      storageClassName: ibmc-vpc-file-3000-iops
`

// manifest is validJob with a JSON merge patch (written as YAML) applied.
func manifest(t *testing.T, patch string) *unstructured.Unstructured {
	t.Helper()
	base, err := yaml.YAMLToJSON([]byte(validJob))
	if err != nil {
		t.Fatal(err)
	}
	p, err := yaml.YAMLToJSON([]byte(patch))
	if err != nil {
		t.Fatalf("patch: %v", err)
	}
	merged, err := jsonpatch.MergePatch(base, p)
	if err != nil {
		t.Fatalf("merge: %v", err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(merged); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return u
}

// expectInvalid asserts err is an Invalid error whose message names the field and the rule.
func expectInvalid(t *testing.T, err error, wants []string) {
	t.Helper()
	t.Logf("apiserver said: %v", err)
	if err == nil {
		t.Fatalf("the apiserver accepted it; want an error mentioning %q", wants)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("want an Invalid error, got %v", err)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %q:\n%v", w, err)
		}
	}
}

func TestValidManifestIsAccepted(t *testing.T) {
	ns := newNamespace(t)
	u := manifest(t, `{}`)
	u.SetNamespace(ns)
	if err := k8sClient.Create(context.Background(), u); err != nil {
		t.Fatalf("valid manifest rejected: %v", err)
	}
}

func TestInvalidManifestsAreRejectedOnCreate(t *testing.T) {
	ns := newNamespace(t)
	cases := []struct {
		name  string
		patch string
		want  []string // the field path and words of the rule
	}{
		{"nodes zero", `spec: {nodes: 0}`, []string{"spec.nodes", "greater than or equal to 1"}},
		{"nodes above 4096", `spec: {nodes: 5000}`, []string{"spec.nodes", "less than or equal to 4096"}},
		{"nodes missing", `spec: {nodes: null}`, []string{"spec.nodes", "Required"}},
		{"nodes not a number", `spec: {nodes: "four"}`, []string{"spec.nodes", "integer"}},
		{"gpusPerNode above 8", `spec: {gpusPerNode: 9}`, []string{"spec.gpusPerNode", "less than or equal to 8"}},
		{"gpusPerNode zero", `spec: {gpusPerNode: 0}`, []string{"spec.gpusPerNode", "greater than or equal to 1"}},
		{"template missing", `spec: {template: null}`, []string{"spec.template", "Required"}},
		{"template without containers", `spec: {template: {spec: {containers: []}}}`, []string{"spec.template.spec.containers", "at least one container"}},
		{"template restartPolicy Always", `spec: {template: {spec: {restartPolicy: Always}}}`, []string{"spec.template.spec.restartPolicy", "must be Never"}},
		{"template sets hostname", `spec: {template: {spec: {hostname: worker}}}`, []string{"spec.template.spec", "hostname and subdomain are set by the operator"}},
		{"contextParallel zero", `spec: {parallelism: {contextParallel: 0}}`, []string{"spec.parallelism.contextParallel", "greater than or equal to 1"}},
		{"contextParallel does not divide world size", `spec: {nodes: 3, parallelism: {contextParallel: 5}}`, []string{"spec.parallelism.contextParallel", "must divide the world size"}},
		{"unknown network profile", `spec: {network: {profile: InfiniBand}}`, []string{"spec.network.profile", "Unsupported value", "PollaraAINIC"}},
		{"nicsPerNode above 8", `spec: {network: {nicsPerNode: 9}}`, []string{"spec.network.nicsPerNode", "less than or equal to 8"}},
		{"nicsPerNode above gpusPerNode", `spec: {gpusPerNode: 2, network: {nicsPerNode: 4}}`, []string{"spec.network.nicsPerNode", "must not exceed gpusPerNode"}},
		{"NICs with the Socket profile", `spec: {network: {profile: Socket, nicsPerNode: 2}}`, []string{"spec.network.nicsPerNode", "must be 0 with the Socket profile"}},
		{"HCAs with the Socket profile", `spec: {network: {profile: Socket, hcas: [ionic_0]}}`, []string{"spec.network.hcas", "needs an RDMA profile"}},
		{"HCA name with shell characters", `spec: {network: {hcas: ["ionic_0;reboot"]}}`, []string{"spec.network.hcas[0]", "should match"}},
		{"duplicate HCAs", `spec: {network: {hcas: [ionic_0, ionic_0]}}`, []string{"spec.network.hcas[1]", "Duplicate value"}},
		{"socketIfname too long", `spec: {network: {socketIfname: "averyveryverylonginterface"}}`, []string{"spec.network.socketIfname", "should match"}},
		{"collectiveTimeout not a duration", `spec: {network: {collectiveTimeout: forever}}`, []string{"spec.network.collectiveTimeout", "should match"}},
		{"collectiveTimeout too short", `spec: {network: {collectiveTimeout: 10s}}`, []string{"spec.network.collectiveTimeout", "between 1m and 24h"}},
		{"duplicate network env", `spec: {network: {env: [{name: NCCL_DEBUG, value: INFO}, {name: NCCL_DEBUG, value: WARN}]}}`, []string{"spec.network.env[1]", "Duplicate value"}},
		{"network env overrides rendezvous", `spec: {network: {env: [{name: WORLD_SIZE, value: "1"}]}}`, []string{"spec.network.env", "must not set rendezvous variables"}},
		{"checkpoint volume empty", `spec: {checkpoint: {volume: {size: null, storageClassName: null}}}`, []string{"spec.checkpoint.volume", "exactly one of claimName"}},
		{"checkpoint volume both claim and size", `spec: {checkpoint: {volume: {claimName: ckpt, storageClassName: null}}}`, []string{"spec.checkpoint.volume", "exactly one of claimName"}},
		{"storage class with an existing claim", `spec: {checkpoint: {volume: {claimName: ckpt, size: null}}}`, []string{"spec.checkpoint.volume.claimName", "apply only to a volume the operator creates"}},
		{"checkpoint size zero", `spec: {checkpoint: {volume: {size: "0"}}}`, []string{"spec.checkpoint.volume.size", "greater than zero"}},
		{"checkpoint size malformed", `spec: {checkpoint: {volume: {size: "ten terabytes"}}}`, []string{"spec.checkpoint.volume.size"}},
		{"unknown access mode", `spec: {checkpoint: {volume: {accessModes: [ReadWriteSometimes]}}}`, []string{"spec.checkpoint.volume.accessModes[0]", "Unsupported value"}},
		{"relative mount path", `spec: {checkpoint: {mountPath: checkpoints}}`, []string{"spec.checkpoint.mountPath", "should match"}},
		{"keep zero", `spec: {checkpoint: {keep: 0}}`, []string{"spec.checkpoint.keep", "greater than or equal to 1"}},
		{"interval steps and duration", `spec: {checkpoint: {interval: {steps: 100, duration: 10m}}}`, []string{"spec.checkpoint.interval", "exactly one of steps or duration"}},
		{"interval steps zero", `spec: {checkpoint: {interval: {steps: 0}}}`, []string{"spec.checkpoint.interval.steps", "greater than or equal to 1"}},
		{"interval too short", `spec: {checkpoint: {interval: {duration: 1s}}}`, []string{"spec.checkpoint.interval.duration", "at least 10s"}},
		{"maxRestarts negative", `spec: {faultTolerance: {maxRestarts: -1}}`, []string{"spec.faultTolerance.maxRestarts", "greater than or equal to 0"}},
		{"backoff initial above max", `spec: {faultTolerance: {backoff: {initial: 10m, max: 1m}}}`, []string{"spec.faultTolerance.backoff", "initial must not exceed backoff.max"}},
		{"hangTimeout too short", `spec: {faultTolerance: {hangTimeout: 5s}}`, []string{"spec.faultTolerance.hangTimeout", "at least 30s"}},
		{"fatal and retryable share a code", `spec: {faultTolerance: {exitCodes: {fatal: [1, 78], retryable: [1]}}}`, []string{"spec.faultTolerance.exitCodes", "must not share a code"}},
		{"exit code out of range", `spec: {faultTolerance: {exitCodes: {retryable: [300]}}}`, []string{"spec.faultTolerance.exitCodes.retryable[0]", "less than or equal to 255"}},
		{"unknown exit code action", `spec: {faultTolerance: {exitCodes: {other: Ignore}}}`, []string{"spec.faultTolerance.exitCodes.other", "Unsupported value"}},
		{"quarantine taint NoExecute", `spec: {faultTolerance: {quarantine: {nodeTaint: NoExecute}}}`, []string{"spec.faultTolerance.quarantine.nodeTaint", "Unsupported value"}},
		{"quarantine list too long", `spec: {faultTolerance: {quarantine: {maxNodes: 1000}}}`, []string{"spec.faultTolerance.quarantine.maxNodes", "less than or equal to 256"}},
		{"unknown node sharing", `spec: {placement: {nodeSharing: Sometimes}}`, []string{"spec.placement.nodeSharing", "Unsupported value"}},
		{"unknown success policy", `spec: {successPolicy: AnyRank}`, []string{"spec.successPolicy", "Unsupported value"}},
		{"ttl negative", `spec: {ttlSecondsAfterFinished: -1}`, []string{"spec.ttlSecondsAfterFinished", "greater than or equal to 0"}},
		{"active deadline zero", `spec: {activeDeadlineSeconds: 0}`, []string{"spec.activeDeadlineSeconds", "greater than or equal to 1"}},
		{"managedBy not a domain path", `spec: {managedBy: "kueue"}`, []string{"spec.managedBy", "should match"}},
		{"name too long for worker hostnames", `metadata: {name: "a-training-job-whose-name-is-far-too-long-for-dns-labels"}`, []string{"metadata.name", "at most 50 characters"}},
		{"name not a DNS label", `metadata: {name: "llm.v2"}`, []string{"metadata.name", "DNS-1035 label"}},
		{"unknown field is refused by strict decoding", `spec: {gpus: 8}`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := manifest(t, c.patch)
			u.SetNamespace(ns)
			err := k8sClient.Create(context.Background(), u, client.FieldValidation("Strict"))
			if c.want == nil {
				if err == nil || !strings.Contains(err.Error(), `unknown field "spec.gpus"`) {
					t.Fatalf("want a strict-decoding error naming spec.gpus, got %v", err)
				}
				return
			}
			expectInvalid(t, err, c.want)
		})
	}
}

func TestImmutableFieldsAreRejectedOnUpdate(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	cases := []struct {
		name    string
		initial string
		update  string
		want    []string
	}{
		{"nodes of a running job", `{}`, `spec: {nodes: 8}`, []string{"spec", "only while the job is suspended"}},
		{"placement of a running job", `{}`, `spec: {placement: {nodeSharing: Shared}}`, []string{"spec", "only while the job is suspended"}},
		{"network of a running job", `{}`, `spec: {network: {profile: RoCE}}`, []string{"spec", "only while the job is suspended"}},
		{"template of a running job", `{}`, `spec: {template: {spec: {containers: [{name: worker, image: other:tag}]}}}`, []string{"spec.template", "only while the job is suspended"}},
		{"checkpoint volume", `{}`, `spec: {checkpoint: {volume: {size: 20Ti}}}`, []string{"spec.checkpoint", "checkpoint.volume is immutable"}},
		{"checkpoint removed", `{}`, `spec: {checkpoint: null}`, []string{"spec.checkpoint", "checkpoint.volume is immutable"}},
		{"managedBy", `spec: {managedBy: kueue.x-k8s.io/multikueue}`, `spec: {managedBy: training.zaya.dev/zaya-operator}`, []string{"spec.managedBy", "managedBy is immutable"}},
		{"managedBy added", `{}`, `spec: {managedBy: kueue.x-k8s.io/multikueue}`, []string{"spec.managedBy", "managedBy is immutable"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := manifest(t, c.initial)
			u.SetNamespace(ns)
			u.SetName("job-" + string(rune('a'+i)))
			if err := k8sClient.Create(ctx, u); err != nil {
				t.Fatalf("create: %v", err)
			}
			p, err := yaml.YAMLToJSON([]byte(c.update))
			if err != nil {
				t.Fatal(err)
			}
			err = k8sClient.Patch(ctx, u, rawMergePatch(p))
			expectInvalid(t, err, c.want)
		})
	}
}

func TestSuspendedJobCanBeReshaped(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	u := manifest(t, `spec: {suspend: true}`)
	u.SetNamespace(ns)
	if err := k8sClient.Create(ctx, u); err != nil {
		t.Fatalf("create: %v", err)
	}
	// Kueue resizes and re-targets a suspended job before it admits it.
	reshape, _ := yaml.YAMLToJSON([]byte(`spec: {nodes: 8, network: {profile: RoCE}, template: {spec: {nodeSelector: {pool: mi300x}, containers: [{name: worker, image: zaya-worker:v2}]}}}`))
	if err := k8sClient.Patch(ctx, u, rawMergePatch(reshape)); err != nil {
		t.Fatalf("reshaping a suspended job was refused: %v", err)
	}
	if got, _, _ := unstructured.NestedInt64(u.Object, "spec", "nodes"); got != 8 {
		t.Errorf("spec.nodes = %d after the update, want 8", got)
	}
}
